"""EdgeTAM's image path against the original EdgeTAM code (``edgetam-dimos``, in a subprocess: tests/edgetam_oracle.py).

* RepViT: our trunk (folded and trained forms) == timm's ``repvit_m1`` (features_only) with the same perturbed
  weights, batch-norm statistics included; the full-width repvit_m1 and the reduced narrow one.
* Predictor: ``Sam2Predictor.from_checkpoint`` on the original model's own state dict (the ``edgetam.pt`` layout,
  memory path included, config detected from its tensors) == the original ``SAM2ImagePredictor``: clicks, a
  negative click, a box, box + click, multimask on and off; low-res logits cosine >= 0.99999 and mask IoU >= 0.999;
  two seeds. Reduced config in CI; full size under ``-m slow``.

* Hugging Face layout: transformers' ``EdgeTamModel`` safetensors through the strict key map == transformers' own
  forward (full size); ``EdgeTamVideoModel``'s file loads as the image model; ``verify-official`` takes both.
* Commands (segment, everything, embed, serve) take an EdgeTAM checkpoint with no model flag; a damaged one is one
  line naming the tensor; exports through the same pipeline (ONNX bundle shippable with an EdgeTAM card; the LiteRT
  encoder graph lint-clean and exact, LiteRT and ExecuTorch bundles, under ``-m slow``).

One child process per module computes every original output (a module fixture).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edgetam_oracle import run_original

from sam2edge import Sam2Predictor
from sam2edge.checks.fidelity import photo
from sam2edge.config import get_config
from sam2edge.model.repvit import RepViT

COSINE_MIN, IOU_MIN = 0.99999, 0.999
SEEDS = (0, 1)


def _prompts(s: int) -> dict[str, dict]:
    """Prompts in pixels of an s x s image."""
    f = s / 1024.0
    box = np.array([250.0, 200.0, 760.0, 820.0]) * f
    return {
        "click": dict(point_coords=np.array([[512.0, 400.0]]) * f, point_labels=np.array([1])),
        "clicks+negative": dict(
            point_coords=np.array([[512.0, 400.0], [200.0, 800.0]]) * f, point_labels=np.array([1, 0])
        ),
        "box": dict(box=box),
        "box+click": dict(point_coords=np.array([[480.0, 500.0]]) * f, point_labels=np.array([1]), box=box),
    }


def _image(s: int) -> np.ndarray:
    """A real photo cropped to s x s (the model's input side: no resize step can differ)."""
    img = photo("retina.jpg")
    step = max(1, 1024 // s)
    return np.ascontiguousarray(img[180 : 180 + s * step : step, 200 : 200 + s * step : step])


PREDICT = """
import numpy as np
from sam2.sam2_image_predictor import SAM2ImagePredictor
for seed in IN["seeds"]:
    model = build_original(IN["config"], seed)
    pred = SAM2ImagePredictor(model)
    e = model.image_size // 16
    pred._bb_feat_sizes = [(4 * e, 4 * e), (2 * e, 2 * e), (e, e)]  # fixed for 1024 px in the original
    pred.set_image(IN["image"])
    rows = {}
    for name, kw in IN["prompts"].items():
        for mm in (True, False):
            logits, iou, low = pred.predict(**kw, multimask_output=mm, return_logits=True)
            rows[(name, mm)] = (logits, iou, low)
    OUT.setdefault("predict", {})[seed] = dict(
        state=model.state_dict(), rows=rows, embed=pred.get_image_embedding().clone()
    )
"""

TIMM = """
import timm
create_model = timm.models.create_model.__wrapped__  # timm's own, without a reduced config's RepViT widths
for name, kw, side, seed in IN["cases"]:
    torch.manual_seed(seed)
    m = perturb(create_model("repvit_m1", pretrained=False, features_only=True, out_indices=(0, 1, 2, 3), **kw), seed)
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(seed + 7))
    with torch.no_grad():
        feats = m(x)
    OUT.setdefault("timm", {})[name] = dict(state=m.state_dict(), x=x, feats=feats, channels=m.feature_info.channels())
"""


def _timm_cases() -> list:
    cfg = get_config("test-small-edgetam")
    return [
        ("repvit_m1", {}, 128, 0),
        ("narrow", dict(embed_dim=cfg.repvit_dims, depth=cfg.repvit_depths), 96, 1),
    ]


def _hf_inputs(folder) -> dict:
    """transformers' EdgeTamModel (full size) on a 1024 px photo: clicks and a box in model-input pixels."""
    from sam2edge.runtime.preprocess import preprocess

    p = _prompts(1024)
    pts = lambda kw: torch.tensor(kw["point_coords"], dtype=torch.float32)[None, None]  # noqa: E731
    labels = lambda kw: torch.tensor(kw["point_labels"])[None, None]  # noqa: E731
    prompts = {
        "click": dict(input_points=pts(p["click"]), input_labels=labels(p["click"])),
        "clicks+negative": dict(input_points=pts(p["clicks+negative"]), input_labels=labels(p["clicks+negative"])),
        "box": dict(input_boxes=torch.tensor(p["box"]["box"], dtype=torch.float32)[None, None]),
    }
    (folder / "video").mkdir()
    return dict(
        hf_seed=3,
        hf_path=str(folder / "model.safetensors"),
        hf_video_path=str(folder / "video" / "model.safetensors"),
        hf_pixels=preprocess(_image(1024), 1024),
        hf_prompts=prompts,
    )


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """Every original output this module compares with, from ONE child process: the original EdgeTAM predictor
    (reduced config, both seeds), timm's repvit_m1, transformers' EdgeTamModel / EdgeTamVideoModel files."""
    s = get_config("test-small-edgetam").image_size
    inputs = dict(config="test-small-edgetam", seeds=SEEDS, image=_image(s), prompts=_prompts(s), cases=_timm_cases())
    inputs.update(_hf_inputs(tmp_path_factory.mktemp("hf-edgetam")))
    return inputs, run_original(PREDICT + TIMM + HF, inputs)


@pytest.fixture(scope="module")
def original_reduced(oracle):
    inputs, out = oracle
    return inputs, out["predict"]


@pytest.fixture(scope="module")
def timm_features(oracle):
    return oracle[1]["timm"]


@pytest.fixture(scope="module")
def hf_files(oracle):
    inputs, out = oracle
    return dict(
        image=_image(1024),
        prompts=_prompts(1024),
        rows=out["hf"],
        image_file=inputs["hf_path"],
        video_file=inputs["hf_video_path"],
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    ma, mb = a > 0, b > 0
    union = (ma | mb).sum()
    return 1.0 if union == 0 else float((ma & mb).sum() / union)


# ---------------------------------------------------------------- RepViT against timm
@pytest.mark.parametrize("case", ["repvit_m1", "narrow"])
def test_repvit_matches_timm(timm_features, case):
    """Folded and trained forms == timm's repvit_m1 features (perturbed weights and batch-norm statistics)."""
    from dataclasses import replace

    ref = timm_features[case]
    base = get_config("edgetam" if case == "repvit_m1" else "test-small-edgetam")
    trunk = RepViT(replace(base, image_size=ref["x"].shape[-1])).eval()
    trunk.load_state_dict({f"body.{k}": v for k, v in ref["state"].items()}, strict=True)  # timm names
    assert list(base.repvit_dims) == ref["channels"]
    with torch.no_grad():
        fused = trunk(ref["x"])
        trunk.set_fused(False)
        trained = trunk(ref["x"])
    for got, raw, want in zip(fused, trained, ref["feats"]):
        assert got.shape == want.shape
        scale = want.abs().max().item()
        assert scale > 0.1
        assert (raw - want).abs().max().item() <= 1e-5 * scale  # the trained form: timm's own operations
        assert (got - want).abs().max().item() <= 1e-4 * scale  # folded: the same function, rounded differently
        assert _cosine(got.numpy(), want.numpy()) > 0.999999


def test_fold_is_one_conv_per_unit():
    """After loading, a token mixer is one depthwise k x k conv and a ConvNorm one conv with bias, and a second
    load re-derives them (no stale folded weights)."""
    from sam2edge.model.repvit import ConvNorm, RepVggDw

    cfg = get_config("test-small-edgetam")
    trunk = RepViT(cfg).eval()
    sd = {k: v + 0.1 for k, v in trunk.state_dict().items() if v.is_floating_point()}
    trunk.load_state_dict(sd, strict=False)
    mixer = trunk.body.stages_0.blocks[0].token_mixer
    assert isinstance(mixer, RepVggDw) and mixer.weight.shape == (cfg.repvit_dims[0], 1, 3, 3)
    w, _ = mixer.conv.folded()
    assert not torch.equal(mixer.weight, w)  # the 1 x 1 branch and the identity sit on the centre tap
    assert torch.equal(mixer.weight[:, :, 0, 0], w[:, :, 0, 0])  # ... and nowhere else
    norm = trunk.body.stem.conv1
    assert isinstance(norm, ConvNorm) and norm.bias.shape == (cfg.repvit_dims[0] // 2,)
    names = {k for k, _ in trunk.named_buffers() if k.endswith((".weight", ".bias"))}
    assert not names & set(trunk.state_dict())  # folded forms are never saved


# ---------------------------------------------------------------- the image predictor against the original
def _ours(state: dict, tmp_path) -> Sam2Predictor:
    ckpt = tmp_path / "edgetam.pt"
    torch.save({"model": state}, ckpt)  # the original repository's layout, memory path included
    return Sam2Predictor.from_checkpoint(str(ckpt))


def _parity(inputs: dict, ref: dict, tmp_path) -> tuple[float, float]:
    ours = _ours(ref["state"], tmp_path)
    assert ours.cfg == get_config(inputs["config"])
    ours.set_image(inputs["image"])
    torch.testing.assert_close(ours.get_image_embedding(), ref["embed"], rtol=0, atol=1e-4)
    worst_cos, worst_iou, fg = 1.0, 1.0, []
    for (name, mm), (logits, iou, low) in ref["rows"].items():
        got, got_iou, got_low = ours.predict(**inputs["prompts"][name], multimask_output=mm, return_logits=True)
        assert got.shape == logits.shape and got_low.shape == low.shape
        np.testing.assert_allclose(got_iou, iou, rtol=0, atol=1e-4)
        worst_cos = min(worst_cos, _cosine(got_low, low))
        worst_iou = min(worst_iou, *(_iou(a, b) for a, b in zip(got, logits)))
        fg += [float((m > 0).mean()) for m in logits]
    assert 0.02 < float(np.median(fg)) < 0.98, f"median foreground {np.median(fg)}: a degenerate test"
    return worst_cos, worst_iou


@pytest.mark.parametrize("seed", SEEDS)
def test_predictor_matches_original(original_reduced, seed, tmp_path):
    inputs, out = original_reduced
    cos, iou = _parity(inputs, out[seed], tmp_path)
    print(f"seed {seed}: worst low-res logits cosine {cos:.7f}, worst mask IoU {iou:.5f}")
    assert cos >= COSINE_MIN and iou >= IOU_MIN


def test_seeds_differ(original_reduced):
    """The two seeds' models disagree (the parity test can fail)."""
    _, out = original_reduced
    a, b = (out[s]["rows"][("click", True)][2] for s in SEEDS)
    assert _cosine(a, b) < 0.9


@pytest.mark.slow
def test_predictor_matches_original_full_size(tmp_path):
    s = 1024
    inputs = dict(config="edgetam", seeds=SEEDS, image=_image(s), prompts=_prompts(s))
    out = run_original(PREDICT, inputs)["predict"]
    for seed in SEEDS:
        cos, iou = _parity(inputs, out[seed], tmp_path)
        print(f"edgetam seed {seed}: worst low-res logits cosine {cos:.7f}, worst mask IoU {iou:.5f}")
        assert cos >= COSINE_MIN and iou >= IOU_MIN


# ---------------------------------------------------------------- transformers' EdgeTamModel (Hugging Face layout)
HF = """
from safetensors.torch import save_file
save = lambda m, path: save_file({k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}, path)
model = hf_edgetam_model(IN["hf_seed"])
save(model, IN["hf_path"])
rows = {}
with torch.no_grad():
    for name, kw in IN["hf_prompts"].items():
        out = model(pixel_values=IN["hf_pixels"], multimask_output=True, **kw)
        rows[name] = (out.pred_masks[0, 0], out.iou_scores[0, 0], out.object_score_logits[0, 0])
OUT["hf"] = rows
save(hf_edgetam_model(IN["hf_seed"] + 1, video=True), IN["hf_video_path"])
"""


def test_hf_layout_matches_transformers(hf_files):
    """EdgeTamModel's safetensors through the strict HF key map (model detected from its tensors) == transformers'
    own forward: low-res logits of clicks and a box (multimask) and their IoU predictions."""
    ours = Sam2Predictor.from_checkpoint(str(hf_files["image_file"]))
    assert ours.cfg == get_config("edgetam")
    ours.set_image(hf_files["image"])
    for name, (masks, iou, _) in hf_files["rows"].items():
        _, got_iou, low = ours.predict(**hf_files["prompts"][name], multimask_output=True)
        assert _cosine(low, masks.numpy()) >= COSINE_MIN, name
        assert min(_iou(a, b) for a, b in zip(low, masks.numpy())) >= IOU_MIN, name
        np.testing.assert_allclose(got_iou, iou.numpy(), rtol=0, atol=1e-4)


def test_hf_video_layout_loads_the_image_path(hf_files):
    """EdgeTamVideoModel's file (video parts included) loads strictly as the image model: video-only names are
    known, nothing else is left over."""
    from sam2edge.weights import load_weights
    from sam2edge.weights.load import expected_shapes

    sd, prov = load_weights(str(hf_files["video_file"]), get_config("edgetam"))
    assert prov["format"] == "hf" and set(sd) == set(expected_shapes(get_config("edgetam")))


def test_verify_official_accepts_edgetam(hf_files, tmp_path, capsys):
    """verify-official: an edgetam.pt and the model.safetensors written from the same weights are bit-identical
    on the image path; a tampered tensor is named."""
    from sam2edge.cli.main import main
    from sam2edge.weights import load_weights, save_checkpoint

    sd, _ = load_weights(str(hf_files["image_file"]), get_config("edgetam"))
    pt, st = tmp_path / "edgetam.pt", tmp_path / "model.safetensors"
    save_checkpoint(sd, "meta", pt)
    assert main(["verify-official", str(pt), str(hf_files["image_file"])]) == 0
    out = capsys.readouterr().out
    assert "edgetam: no official SHA-256 on record" in out and "bit-identical" in out
    var = "image_encoder.trunk.body.stem.conv1.bn.running_var"
    sd[var] = sd[var] * 1.001
    save_checkpoint(sd, "hf", st)
    assert main(["verify-official", str(pt), str(st)]) == 1
    assert var in capsys.readouterr().out


# ---------------------------------------------------------------- commands and bad input (no EdgeTAM flag anywhere)
@pytest.fixture(scope="module")
def edgetam_pt(original_reduced, tmp_path_factory):
    """The original (reduced) EdgeTAM's full state dict in the original repository's layout."""
    path = tmp_path_factory.mktemp("edgetam-pt") / "edgetam.pt"
    torch.save({"model": original_reduced[1][SEEDS[0]]["state"]}, path)
    return path


def _cli_error(capsys, argv) -> str:
    from sam2edge.cli.main import main

    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


def test_commands_take_an_edgetam_checkpoint(edgetam_pt, tmp_path, capsys):
    """segment, everything, embed and serve run the EdgeTAM checkpoint with no model flag (detected from its
    tensors)."""
    from sam2edge.cli.main import main

    mask, masks, store = tmp_path / "mask.png", tmp_path / "masks.json", tmp_path / "store"
    ck = ["--checkpoint", str(edgetam_pt)]
    seg = ["segment", "sample:astronaut.png", "--point", "200,150", *ck, "--out", str(mask)]
    assert main([*seg, "--overlay", str(tmp_path / "seg-overlay.png")]) == 0
    argv = ["everything", "sample:astronaut.png", *ck, "--points-per-side", "4", "--out", str(masks)]
    assert main([*argv, "--overlay", str(tmp_path / "overlay.png")]) == 0
    photos = tmp_path / "photos"
    photos.mkdir()
    from PIL import Image

    Image.fromarray(_image(256)).save(photos / "a.png")
    assert main(["embed", str(photos), *ck, "--out", str(store), "--quiet"]) == 0
    assert mask.is_file() and masks.is_file() and any(store.iterdir())
    capsys.readouterr()
    from sam2edge.serve.app import default_app_from_args

    app = default_app_from_args(None, str(edgetam_pt), None)  # serve --checkpoint edgetam.pt
    assert app.backend.cfg == get_config("test-small-edgetam")


@pytest.mark.parametrize("damage", ["missing", "misshaped-mixer", "misshaped-bn"])
def test_damaged_edgetam_checkpoint_names_the_tensor(damage, original_reduced, tmp_path, capsys):
    sd = dict(original_reduced[1][SEEDS[0]]["state"])
    name = {
        "missing": "image_encoder.trunk.body.stages_2.blocks.1.channel_mixer.conv2.bn.running_var",
        "misshaped-mixer": "image_encoder.trunk.body.stages_1.blocks.0.token_mixer.conv.c.weight",
        "misshaped-bn": "image_encoder.trunk.body.stem.conv2.bn.weight",
    }[damage]
    if damage == "missing":
        del sd[name]
    else:
        sd[name] = torch.zeros(3, *sd[name].shape[1:])
    bad, out = tmp_path / "edgetam.pt", tmp_path / "mask.png"
    torch.save({"model": sd}, bad)
    argv = ["segment", "sample:astronaut.png", "--point", "100,100", "--checkpoint", str(bad), "--out", str(out)]
    msg = _cli_error(capsys, argv)
    assert name in msg and "EdgeTAM" in msg and not out.exists()
    with pytest.raises(Exception) as e:  # the Python API: the same one line
        Sam2Predictor.from_checkpoint(str(bad))
    assert name in str(e.value) and "\n" not in str(e.value)


def test_neither_sam21_nor_edgetam_is_one_line(tmp_path, capsys):
    bad, out = tmp_path / "other.pt", tmp_path / "mask.png"
    torch.save({"model": {"backbone.conv.weight": torch.zeros(8, 3, 3, 3), "head.bias": torch.zeros(2)}}, bad)
    argv = ["segment", "sample:astronaut.png", "--point", "100,100", "--checkpoint", str(bad), "--out", str(out)]
    msg = _cli_error(capsys, argv)
    assert "no SAM 2.1 or EdgeTAM image encoder" in msg and str(bad) in msg and not out.exists()


# ---------------------------------------------------------------- export through the same pipeline
@pytest.fixture(scope="module")
def litert_encoder(edgetam_pt, tmp_path_factory):
    """The LiteRT encoder graph of the reduced EdgeTAM (the pipeline's own graph and converter)."""
    pytest.importorskip("litert_torch")
    from sam2edge.export.litert import convert_graph, graphs
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.runtime.backends.litert import ENCODER_FILE
    from sam2edge.weights import load_weights

    cfg = get_config("test-small-edgetam")
    sd, _ = load_weights(str(edgetam_pt), cfg)
    model = build_sam2(cfg, Rewrites())
    model.load_state_dict(sd)
    module, sample = graphs(model, 8)[ENCODER_FILE]
    path = tmp_path_factory.mktemp("litert-edgetam") / ENCODER_FILE
    convert_graph(module, sample, path, "fp32")
    with torch.no_grad():
        want = module(**sample)
    return path, sample, want


@pytest.mark.slow  # ~25 s of conversion; in CI the reduced EdgeTAM encoder.tflite is linted (and GPU-checked) by
# test_edgetam_video.py's LiteRT ``export --video`` of test-small-edgetam, which the pipeline refuses when dirty
def test_litert_encoder_is_lint_clean_and_exact(litert_encoder):
    """No banned op, no tensor above rank 4, and the graph computes the eager encoder (fp32)."""
    from ai_edge_litert.interpreter import Interpreter

    from sam2edge.checks.tflite.lint import lint_file

    path, sample, want = litert_encoder
    report = lint_file(path)
    assert report.clean and report.max_rank <= 4, report.problems()
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    got = runner(**{k: v.numpy() for k, v in sample.items()})
    assert set(got) == set(want)
    for name, ref in want.items():
        assert _cosine(got[name], ref.numpy()) > 0.999999, name
        assert np.abs(got[name] - ref.numpy()).max() <= 1e-4 * np.abs(ref.numpy()).max(), name


def _export(target: str, ckpt, out, extra=()) -> dict:
    from sam2edge.bundle import load_card
    from sam2edge.cli.main import main

    assert main(["export", "--target", target, "--checkpoint", str(ckpt), "--out", str(out), *extra]) == 0
    card = load_card(out)
    assert card["model_id"] == "edgetam" and card["config"] == "test-small-edgetam"
    assert card["base_model"] == "facebook/EdgeTAM" and card["license"] == "apache-2.0"
    assert card["status"] == "shippable" and card["fidelity"]["passed"]
    return card


def test_onnx_export_of_an_edgetam_checkpoint(edgetam_pt, tmp_path, capsys):
    """sam2edge export --checkpoint edgetam.pt --target onnx: the bundle passes the export's fidelity bars; its card
    names EdgeTAM, its license, its citation and the measured fidelity."""
    from sam2edge.bundle import load_card
    from sam2edge.cli.main import main

    out = tmp_path / "onnx"
    _export("onnx", edgetam_pt, out)
    assert main(["card", "render", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert "# EdgeTAM" in readme and "EdgeTAM: On-Device Track Anything Model" in readme and "apache-2.0" in readme
    assert "  - edgetam" in readme.split("---")[1]  # the front matter's tags
    e2e = load_card(out)["fidelity"]["end_to_end"]  # the measured fidelity, as the export recorded it
    assert f"| {e2e['iou_median']:.5f} | {e2e['iou_worst']:.5f} |" in readme
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["litert", "executorch"])
def test_litert_and_executorch_exports_of_an_edgetam_checkpoint(edgetam_pt, tmp_path, target, capsys):
    card = _export(target, edgetam_pt, tmp_path / target)
    out = capsys.readouterr().out
    if target == "litert":
        assert card["extra"]["gpu_clean"] is True
        assert "banned ops = NONE, >4-D tensors = 0" in out


@pytest.mark.slow
def test_full_size_litert_encoder_is_lint_clean_and_exact(tmp_path):
    """EdgeTAM at 1024 px (synthetic perturbed weights): the LiteRT encoder graph has no banned op, no tensor above
    rank 4, and computes the eager encoder."""
    from ai_edge_litert.interpreter import Interpreter

    from sam2edge.checks.tflite.lint import lint_file
    from sam2edge.export.litert import convert_graph, graphs
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.runtime.backends.litert import ENCODER_FILE
    from sam2edge.weights import synthetic_state_dict

    cfg = get_config("edgetam")
    model = build_sam2(cfg, Rewrites())
    model.load_state_dict(synthetic_state_dict(cfg, 5))
    module, sample = graphs(model, 8)[ENCODER_FILE]
    path = tmp_path / ENCODER_FILE
    convert_graph(module, sample, path, "fp32")
    report = lint_file(path)
    assert report.clean and report.max_rank <= 4, report.problems()
    with torch.no_grad():
        want = module(**sample)
    got = Interpreter(model_path=str(path)).get_signature_runner()(**{k: v.numpy() for k, v in sample.items()})
    for name, ref in want.items():
        assert _cosine(got[name], ref.numpy()) > 0.999999, name
