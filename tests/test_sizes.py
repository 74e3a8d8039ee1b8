"""The SAM 2.1 family (tiny, small, base-plus, large): configs from upstream's yaml, eager parity with
upstream per size, size detection from tensor shapes (Meta and HF layouts), and mismatch refusal.

Parity: upstream's modules (Meta ``sam2``) and ours, built from the same config, hold identical
perturbed random weights; on real photos the decoder's low-res logits must reach cosine >= 0.99999
and the thresholded masks IoU >= 0.999. CI runs each size's reduced-depth stand-in
(``sam2edge.config.SIZES``); the full sizes at 1024 px are ``slow``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from oracles import meta_image_path

from sam2edge.checks.fidelity import photo
from sam2edge.cli.main import main
from sam2edge.config import CONFIGS, SIZES, Sam2Config
from sam2edge.model import Rewrites, build_sam2
from sam2edge.model import layers as L
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import preprocess
from sam2edge.weights import SizeError, detect_config, save_checkpoint, synthetic_state_dict
from sam2edge.weights.load import expected_shapes, from_sam2edge, to_sam2edge
from sam2edge.weights.sizes import config_signature

FULL = {size: full for size, (full, _, _) in SIZES.items()}
REDUCED = {size: reduced for size, (_, reduced, _) in SIZES.items()}
PHOTOS = ("astronaut.png", "coffee.png")
# prompts in 1024-px model-input space (scaled to each config's side): positive point, +negative, box
PROMPTS = {
    "point": ([[520.0, 380.0]], [1]),
    "points": ([[520.0, 380.0], [300.0, 700.0]], [1, 0]),
    "box": ([[200.0, 150.0], [700.0, 800.0]], [2, 3]),
}


def _upstream_dir() -> Path:
    import sam2

    return Path(sam2.__file__).parent / "configs" / "sam2.1"


# ---------------------------------------------------------------- configs = upstream's numbers
@pytest.mark.parametrize("size", list(SIZES))
def test_full_config_is_upstreams_yaml(size):
    """Every trunk/neck number of the config is the yaml's (or Hiera's default where the yaml is silent)."""
    from sam2.modeling.backbones.hieradet import Hiera

    full, _, yaml_name = SIZES[size]
    cfg = CONFIGS[full]
    enc = yaml.safe_load((_upstream_dir() / yaml_name).read_text())["model"]["image_encoder"]
    defaults = {k: p.default for k, p in inspect.signature(Hiera.__init__).parameters.items()}
    trunk = {**defaults, **enc["trunk"]}
    assert cfg.embed_dim == trunk["embed_dim"] and cfg.num_heads == trunk["num_heads"]
    assert cfg.stages == tuple(trunk["stages"])
    assert cfg.global_att_blocks == tuple(trunk["global_att_blocks"])
    assert cfg.window_spec == tuple(trunk["window_spec"])
    assert cfg.window_pos_embed_bkg == tuple(trunk["window_pos_embed_bkg_spatial_size"])
    assert cfg.q_pool == trunk["q_pool"] and (cfg.q_stride, cfg.q_stride) == tuple(trunk["q_stride"])
    assert list(reversed(cfg.stage_dims)) == enc["neck"]["backbone_channel_list"]
    assert cfg.d_model == enc["neck"]["d_model"] and cfg.scalp == enc["scalp"]
    assert cfg.fpn_top_down_levels == tuple(enc["neck"]["fpn_top_down_levels"])


def test_size_signatures_are_unique():
    """Detection relies on it: no two registered configs have the same tensor shapes."""
    sigs = [config_signature(c) for c in CONFIGS.values()]
    assert len(set(sigs)) == len(sigs)


# ---------------------------------------------------------------- eager parity with upstream
def _decode_pair(ref, model: torch.nn.Module, cfg: Sam2Config, image: torch.Tensor):
    """Low-res logits (1, 3, S/4, S/4) of upstream and ours for every prompt."""
    with torch.no_grad():
        feats = ref.encode(image)
        emb, s0, s1 = model.encode_image(image)
    scale = cfg.image_size / 1024
    pairs = {}
    for name, (pts, labels) in PROMPTS.items():
        coords = torch.tensor([pts]) * scale
        want, _, _ = ref.decode(feats, coords, torch.tensor([labels], dtype=torch.int32))
        padded = torch.cat([coords, torch.zeros(1, 1, 2)], 1)  # sam2edge's layout: a trailing pad point
        lab = torch.tensor([[*labels, -1]], dtype=torch.float32)
        pe = model.sam_prompt_encoder
        with torch.no_grad():
            masks, iou, _ = model.decode(emb, s0, s1, pe.embed_points(padded, lab), pe.no_mask_dense)
            got, _ = model.sam_mask_decoder.multimask(masks, iou)
        pairs[name] = (got, want)
    return pairs


def _assert_parity(cfg: Sam2Config, seed: int, rewrites: Rewrites, photos=PHOTOS) -> tuple[float, float]:
    """Asserts the bars on every photo x prompt; returns (worst logits cosine, worst mask IoU)."""
    worst = [1.0, 1.0]
    ref = meta_image_path(cfg, seed=seed)
    model = build_sam2(cfg, rewrites)
    model.load_state_dict(ref.state_dict())
    for name in photos:
        image = preprocess(photo(name), cfg.image_size)
        for prompt, (got, want) in _decode_pair(ref, model, cfg, image).items():
            cos = torch.nn.functional.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0).item()
            assert cos >= 0.99999, f"{name} {prompt}: logits cosine {cos:.7f} < 0.99999"
            a, b = got > 0, want > 0
            union = (a | b).sum().item()
            iou = (a & b).sum().item() / union if union else 1.0
            assert iou >= 0.999, f"{name} {prompt}: mask IoU {iou:.5f} < 0.999"
            worst = [min(worst[0], cos), min(worst[1], iou)]
    return worst[0], worst[1]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("seed", [0, 1])
def test_reduced_size_matches_upstream(size, seed):
    _assert_parity(CONFIGS[REDUCED[size]], seed, Rewrites())


@pytest.mark.parametrize("size", list(SIZES))
def test_reduced_size_sliced_attention_matches_upstream(size):
    """A tiny texture limit slices every attention by batch AND by heads; still upstream's function."""
    _assert_parity(CONFIGS[REDUCED[size]], 2, Rewrites(texture_limit=16), photos=PHOTOS[:1])


@pytest.mark.slow
@pytest.mark.parametrize("size", list(SIZES))
def test_full_size_matches_upstream(size):
    cos, iou = _assert_parity(CONFIGS[FULL[size]], 0, Rewrites(), photos=PHOTOS[:1])
    print(f"{FULL[size]} 1024 px: worst logits cosine {cos:.8f}, worst mask IoU {iou:.6f}")


# ---------------------------------------------------------------- texture limits at full size
def _attention_rows(cfg: Sam2Config, limit: int) -> tuple[int, int]:
    """(largest texture rows of any attention slice, number of slices) of the 1024-px encoder (meta device)."""
    seen = []
    inner = L._attention

    def record(q, k, v, num_heads, rw, key_bias, keys_transposed=False, query_chunk=0):
        nk = k.shape[2 if keys_transposed else 1]
        seen.append(q.shape[0] * num_heads * -(-max(q.shape[2] // num_heads, nk) // 4))
        return inner(q, k, v, num_heads, rw, key_bias, keys_transposed, query_chunk)

    with torch.device("meta"), mock.patch.object(L, "_attention", record), torch.no_grad():
        build_sam2(cfg, Rewrites(texture_limit=limit)).encode_image(torch.zeros(1, 3, 1024, 1024))
    return max(seen), len(seen)


@pytest.mark.parametrize("size", list(SIZES))
def test_full_size_attention_fits_textures(size):
    """Every attention slice of every size fits 8192 texture rows; at 2048 the global blocks split by heads."""
    cfg = CONFIGS[FULL[size]]
    rows, _ = _attention_rows(cfg, 8192)
    assert rows <= 8192
    rows, n = _attention_rows(cfg, 2048)
    assert rows <= 2048
    assert n > _attention_rows(cfg, 8192)[1], "nothing was sliced"


def test_head_groups_are_fewest_and_fit():
    for heads, d, nk, limit in ((8, 72, 4096, 8192), (8, 72, 4096, 2048), (16, 72, 1024, 1000), (3, 8, 64, 1)):
        g = L.head_chunk(heads, d, nk, limit)
        rows = -(-max(d, nk) // 4)
        assert 1 <= g <= heads
        if rows <= limit:
            assert g * rows <= limit and -(-heads // g) == -(-heads // (limit // rows))
        else:  # one head does not fit (3, 8, 64, 1): one head per slice, the fewest rows possible
            assert g == 1, (heads, d, nk, limit, g)
    assert L.head_chunk(3, 8, 64, 1) == 1 and L.head_chunk(3, 8, 64, 0) == 3


# ---------------------------------------------------------------- size from the weights
def _hf_model(cfg: Sam2Config):
    """transformers Sam2Model of this size on the meta device (shapes only)."""
    from transformers import Sam2Config as HFConfig
    from transformers import Sam2Model
    from transformers.models.sam2.configuration_sam2 import Sam2HieraDetConfig, Sam2VisionConfig

    backbone = Sam2HieraDetConfig(
        hidden_size=cfg.embed_dim,
        num_attention_heads=cfg.num_heads,
        blocks_per_stage=list(cfg.stages),
        embed_dim_per_stage=list(cfg.stage_dims),
        num_attention_heads_per_stage=[cfg.num_heads * 2**i for i in range(len(cfg.stages))],
        window_size_per_stage=list(cfg.window_spec),
        global_attention_blocks=list(cfg.global_att_blocks),
        window_positional_embedding_background_size=list(cfg.window_pos_embed_bkg),
    )
    vision = Sam2VisionConfig(backbone_config=backbone, backbone_channel_list=list(reversed(cfg.stage_dims)))
    with torch.device("meta"):
        return Sam2Model(HFConfig(vision_config=vision))


def _meta_model(yaml_name: str):
    """Upstream SAM2Base (video parts included) from the official yaml, on the meta device."""
    import sam2.modeling.backbones.hieradet as hieradet
    from sam2.build_sam import build_sam2 as upstream_build

    linspace = torch.linspace  # Hiera reads its drop-path schedule with .item(): keep that one on the CPU
    with (
        torch.device("meta"),
        mock.patch.object(hieradet.torch, "linspace", lambda *a, **k: linspace(*a, **k, device="cpu")),
    ):
        return upstream_build(f"configs/sam2.1/{yaml_name}", ckpt_path=None, device="meta", mode="eval")


@pytest.mark.parametrize("size", list(SIZES))
def test_size_detected_from_meta_and_hf_layouts(size):
    """The official layouts of each size (upstream yaml / transformers' Sam2Model) map through the one key
    map and are recognised as that size, from shapes alone."""
    full, _, yaml_name = SIZES[size]
    cfg = CONFIGS[full]
    with torch.device("meta"):
        expected = expected_shapes(cfg)
    meta_sd = _meta_model(yaml_name).state_dict()
    assert detect_config(meta_sd) == full
    assert set(to_sam2edge(meta_sd, "meta", expected, "meta")) == set(expected)
    hf_sd = _hf_model(cfg).state_dict()
    assert detect_config(hf_sd) == full
    ours = from_sam2edge({k: torch.empty(s, device="meta") for k, s in expected.items()}, "hf")
    assert set(ours) == set(hf_sd) and all(ours[k].shape == hf_sd[k].shape for k in ours)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("test-")])
@pytest.mark.parametrize("fmt", ["meta", "hf"])
def test_reduced_sizes_detected_in_both_formats(name, fmt):
    with torch.device("meta"):
        shapes = {k: torch.empty(s) for k, s in expected_shapes(CONFIGS[name]).items()}
        assert detect_config(from_sam2edge(shapes, fmt)) == name


def test_unknown_size_is_one_line():
    with torch.device("meta"):
        shapes = {k: torch.empty(s) for k, s in expected_shapes(CONFIGS["test-small-s"]).items()}
    shapes = {k: v for k, v in shapes.items() if ".blocks.9." not in k}  # one block fewer
    with pytest.raises(SizeError) as e:
        detect_config(shapes, "x.pt")
    assert "\n" not in str(e.value) and "stages [1, 2, 5, 1]" in str(e.value)


@pytest.fixture(scope="module")
def small_s_checkpoints(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sizes")
    sd = synthetic_state_dict(CONFIGS["test-small-s"], seed=4)
    files = {"meta": d / "sam2.1_hiera_s_test.pt", "hf": d / "model.safetensors"}
    for fmt, path in files.items():
        save_checkpoint(sd, fmt, path)
    return files


@pytest.mark.parametrize("fmt", ["meta", "hf"])
def test_predictor_detects_size_from_file(small_s_checkpoints, fmt):
    pred = Sam2Predictor.from_checkpoint(str(small_s_checkpoints[fmt]))
    assert pred.cfg == CONFIGS["test-small-s"]


def test_mismatched_config_is_one_line(small_s_checkpoints, tmp_path, capsys):
    out = tmp_path / "bundle"
    ckpt = str(small_s_checkpoints["meta"])
    rc = main(["export", "--target", "onnx", "--config", "test-small", "--checkpoint", ckpt, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:"), err
    assert "test-small-s weights" in err[0] and "config is test-small;" in err[0] and "--config test-small-s" in err[0]
    assert not out.exists()
    with pytest.raises(SizeError):
        Sam2Predictor.from_checkpoint(ckpt, CONFIGS["sam2.1-hiera-tiny"])


# ---------------------------------------------------------------- exports of a non-tiny size
@pytest.fixture(scope="module")
def bplus_bundles(tmp_path_factory):
    """test-small-b+ (2 heads in stage 1, 14x14 pos-embed background) exported with the size auto-detected:
    ``bplus_bundles(target)`` (ONNX from an HF .safetensors, LiteRT and ExecuTorch from a Meta .pt), exported
    on first use."""
    d = tmp_path_factory.mktemp("bplus")
    sd = synthetic_state_dict(CONFIGS["test-small-b+"], seed=6)
    meta = (d / "sam2.1_hiera_b+_test.pt", "meta")
    ckpts = {"onnx": (d / "model.safetensors", "hf"), "litert": meta, "executorch": meta}
    out: dict[str, Path] = {}

    def get(target: str) -> Path:
        if target not in out:
            ckpt, fmt = ckpts[target]
            save_checkpoint(sd, fmt, ckpt)
            bundle = d / target
            assert main(["export", "--target", target, "--checkpoint", str(ckpt), "--out", str(bundle)]) == 0
            out[target] = bundle
        return out[target]

    return get


# the LiteRT and ExecuTorch exports (~100 s each) are slow: the test-small exports cover their code paths in CI;
# full-size small and base-plus LiteRT bundles were exported and GPU-checked (docs/design/gpu.md)
SLOW = pytest.mark.slow


@pytest.mark.parametrize("target", [pytest.param("litert", marks=SLOW), pytest.param("executorch", marks=SLOW), "onnx"])
def test_reduced_base_plus_exports_verified(bplus_bundles, target):
    import json

    bundle = bplus_bundles(target)
    card = json.loads((bundle / "card.json").read_text())
    assert card["config"] == "test-small-b+" and "--config test-small-b+" in card["command"]
    assert card["model_id"] == "sam2.1-hiera-base-plus" and card["base_model"] == "facebook/sam2.1-hiera-base-plus"
    assert card["status"] == "shippable", card["status"]
    assert Sam2Predictor.from_export(bundle).cfg == CONFIGS["test-small-b+"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["encoder.tflite", "decoder.tflite", "mask_encoder.tflite"])
def test_reduced_base_plus_litert_lint_clean(bplus_bundles, name, capsys):
    assert main(["lint", str(bplus_bundles("litert") / name)]) == 0
    assert "GPU problem" not in capsys.readouterr().out


def test_model_id_names_the_size():
    """Cards name the size a bundle holds (a CI stand-in: the size it stands for)."""
    from sam2edge.config import config_name, model_id

    for full, reduced, _ in SIZES.values():
        assert model_id(full) == model_id(reduced) == full
        assert config_name(CONFIGS[reduced].at_resolution(512)) == reduced
