"""EdgeTAM's video path against the original EdgeTAM code (``edgetam-dimos``, run in a subprocess under its own
``sys.path``: it installs a top-level ``sam2`` that clashes with Meta's).

Module level (identical perturbed weights, two seeds): the spatial perceiver (EdgeTAM's 256 + 256 latents on a
64x64 memory, and the reduced 16 + 16 on 16x16) and the 2-layer memory attention with ``RoPEAttentionv2``
cross-attention, several objects at once (the original perceiver needs its one-word ``.view`` -> ``.reshape``
fix for that; unpatched it raises, which the test records).
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch

from sam2edge.config import TEST_SMALL, VIDEO_EDGETAM, VIDEO_EDGETAM_TEST, Sam2VideoConfig
from sam2edge.model import UPSTREAM, Rewrites
from sam2edge.model.memory_attention import MemoryAttention
from sam2edge.model.perceiver import PerceiverResampler
from tests.edgetam_oracle import run_original

MAX_ABS = 2e-5  # fp32 vs fp32, same operations in another order


# every case runs in one child process (the original's import costs ~2 s per process)
PERCEIVER = """
import importlib
import sam2.modeling.perceiver as pm
from sam2.modeling.position_encoding import PositionEmbeddingSine

pm = importlib.reload(pm)  # the original module, without the oracle's fix
OUT["cases"] = []
for c in IN["cases"]:
    torch.manual_seed(c["seed"])
    m = perturb(pm.PerceiverResampler(
        dim=c["dim"], depth=c["depth"], dim_head=c["dim_head"], heads=1, num_latents=c["latents"],
        num_latents_2d=c["latents_2d"], ff_mult=4, hidden_dropout_p=0.0, attention_dropout_p=0.0,
        pos_enc_at_key_value=True, concat_kv_latents=False, use_self_attn=True,
        position_encoding=PositionEmbeddingSine(num_pos_feats=c["dim"], normalize=True, temperature=10000),
    ), c["seed"] + 1)
    x = c["x"]
    pos = PositionEmbeddingSine(num_pos_feats=c["dim"], normalize=True, temperature=10000)(x)
    out = {"state": m.state_dict()}
    with torch.no_grad():
        try:
            m(x, pos)
            out["unpatched"] = "ran"
        except RuntimeError as e:
            out["unpatched"] = str(e).splitlines()[0]
    OUT["cases"].append(out)
patch_perceiver()  # the oracle's one-word fix of forward_2d (``.view`` -> ``.reshape``)
with torch.no_grad():
    for c, out in zip(IN["cases"], OUT["cases"]):
        m = perturb(pm.PerceiverResampler(
            dim=c["dim"], depth=c["depth"], dim_head=c["dim_head"], heads=1, num_latents=c["latents"],
            num_latents_2d=c["latents_2d"], ff_mult=4, hidden_dropout_p=0.0, attention_dropout_p=0.0,
            pos_enc_at_key_value=True, concat_kv_latents=False, use_self_attn=True,
            position_encoding=PositionEmbeddingSine(num_pos_feats=c["dim"], normalize=True, temperature=10000),
        ), 0)
        m.load_state_dict(out["state"])
        pos = PositionEmbeddingSine(num_pos_feats=c["dim"], normalize=True, temperature=10000)(c["x"])
        out["latents"], out["pos"] = m(c["x"], pos)
"""
PERCEIVER_CASES = {  # id -> (video config, memory side, seed)
    "reduced-seed0": (VIDEO_EDGETAM_TEST, 16, 0),
    "reduced-seed1": (VIDEO_EDGETAM_TEST, 16, 1),
    "edgetam-64x64": (VIDEO_EDGETAM, 64, 2),
}


def _perceiver_case(vcfg: Sam2VideoConfig, side: int, seed: int) -> dict:
    m = vcfg.mem_dim
    x = torch.randn(3, m, side, side, generator=torch.Generator().manual_seed(seed + 100))  # three objects
    return dict(
        seed=seed,
        dim=m,
        depth=vcfg.perceiver_layers,
        dim_head=vcfg.perceiver_dim_head,
        latents=vcfg.perceiver_latents,
        latents_2d=vcfg.perceiver_latents_2d,
        x=x,
    )


@pytest.fixture(scope="module")
def perceiver_refs(tmp_path_factory) -> dict:
    cases = {k: _perceiver_case(*v) for k, v in PERCEIVER_CASES.items()}
    out = run_original(PERCEIVER, {"cases": list(cases.values())}, tmp_path_factory.mktemp("perceiver"))
    return {k: (cases[k], ref) for k, ref in zip(cases, out["cases"])}


@pytest.mark.parametrize("case", list(PERCEIVER_CASES))
@pytest.mark.parametrize("rw", [UPSTREAM, Rewrites()], ids=["upstream-ops", "export-forms"])
def test_perceiver_matches_original(perceiver_refs, case: str, rw: Rewrites):
    """Three objects' memories at once: latents and their position encoding == the original (fixed) perceiver;
    the unpatched original refuses a batch of three."""
    vcfg, side, _ = PERCEIVER_CASES[case]
    inputs, ref = perceiver_refs[case]
    x, m = inputs["x"], vcfg.mem_dim
    assert "view size is not compatible" in ref["unpatched"], ref["unpatched"]
    ours = PerceiverResampler(
        m,
        side,
        vcfg.perceiver_layers,
        vcfg.perceiver_latents,
        vcfg.perceiver_latents_2d,
        vcfg.perceiver_dim_head,
        vcfg.perceiver_heads,
        vcfg.perceiver_ff_mult,
        vcfg.perceiver_self_attn,
        rw,
    ).eval()
    ours.load_state_dict(ref["state"], strict=True)
    with torch.no_grad():
        got = ours(x)
        one = ours(x[1:2])  # one object alone == its row of the batch
    assert got.shape == ref["latents"].shape == (3, vcfg.memory_tokens, m)
    assert (got - ref["latents"]).abs().max().item() < MAX_ABS
    assert torch.allclose(one, got[1:2], atol=1e-6, rtol=0)
    assert torch.allclose(ours.out_pos.expand(3, -1, -1), ref["pos"], atol=1e-6, rtol=0)
    assert ref["latents"].std().item() > 0.1  # not a degenerate output


MEMORY_ATTENTION = """
from sam2.modeling.memory_attention import MemoryAttention, MemoryAttentionLayer
from sam2.modeling.sam.transformer import RoPEAttention, RoPEAttentionv2
OUT["cases"] = []
for c in IN["cases"]:
    torch.manual_seed(c["seed"])
    d, e, g = c["d"], c["e"], c["g"]
    layer = MemoryAttentionLayer(
        activation="relu",
        cross_attention=RoPEAttentionv2(rope_theta=10000.0, q_sizes=[e, e], k_sizes=[g, g], embedding_dim=d,
                                        num_heads=1, downsample_rate=1, dropout=0.1, kv_in_dim=c["m"]),
        d_model=d, dim_feedforward=c["mlp"], dropout=0.1, pos_enc_at_attn=False,
        self_attention=RoPEAttention(rope_theta=10000.0, feat_sizes=[32, 32], embedding_dim=d, num_heads=1,
                                     downsample_rate=1, dropout=0.1),
        pos_enc_at_cross_attn_keys=True, pos_enc_at_cross_attn_queries=False,
    )
    m = perturb(MemoryAttention(d_model=d, pos_enc_at_input=True, layer=layer, num_layers=c["layers"]), c["seed"] + 1)
    with torch.no_grad():
        out = m(curr=c["curr"].transpose(0, 1), memory=c["memory"].transpose(0, 1),
                curr_pos=c["curr_pos"].transpose(0, 1), memory_pos=c["memory_pos"].transpose(0, 1),
                num_obj_ptr_tokens=c["ptr_tokens"], num_spatial_mem=c["slots"]).transpose(0, 1)
    OUT["cases"].append({"state": m.state_dict(), "out": out})
"""
ATTENTION_CASES = {  # id -> (video config, d_model, frame side e, memory frames, seed)
    "reduced-3slots": (VIDEO_EDGETAM_TEST, 32, 16, 3, 0),
    "reduced-7slots": (VIDEO_EDGETAM_TEST, 32, 16, 7, 1),
    "edgetam-2slots": (VIDEO_EDGETAM, 256, 64, 2, 2),
}


def _attention_case(vcfg: Sam2VideoConfig, d: int, e: int, slots: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed + 200)
    ptr_tokens, m = 3 * (d // vcfg.mem_dim), vcfg.mem_dim
    nk = slots * vcfg.memory_tokens + ptr_tokens
    return dict(
        seed=seed,
        d=d,
        e=e,
        g=vcfg.cross_rope_k_grid,
        m=m,
        mlp=vcfg.attn_mlp_dim,
        layers=vcfg.attn_layers,
        slots=slots,
        ptr_tokens=ptr_tokens,
        curr=torch.randn(2, e * e, d, generator=g),  # two objects
        curr_pos=torch.randn(2, e * e, d, generator=g),
        memory=torch.randn(2, nk, m, generator=g),
        memory_pos=torch.randn(2, nk, m, generator=g),
    )


@pytest.fixture(scope="module")
def attention_refs(tmp_path_factory) -> dict:
    cases = {k: _attention_case(*v) for k, v in ATTENTION_CASES.items()}
    out = run_original(MEMORY_ATTENTION, {"cases": list(cases.values())}, tmp_path_factory.mktemp("attention"))
    return {k: (cases[k], ref) for k, ref in zip(cases, out["cases"])}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
@pytest.mark.parametrize("rw", [UPSTREAM, Rewrites()], ids=["upstream-ops", "export-forms"])
def test_memory_attention_matches_original(attention_refs, case: str, rw: Rewrites):
    """2 layers, self RoPE over the e x e frame, cross RoPEAttentionv2 over ``slots`` perceiver frames (global
    latents unrotated, 2-D latents on the G x G grid) + pointer tokens (unrotated); two objects at once."""
    vcfg, d, e, slots, _ = ATTENTION_CASES[case]
    inputs, ref = attention_refs[case]
    cfg = dataclasses.replace(TEST_SMALL, d_model=d, image_size=16 * e)
    ours = MemoryAttention(cfg, vcfg, rw).eval()
    ours.load_state_dict(ref["state"], strict=True)
    with torch.no_grad():
        args = (inputs["curr"], inputs["curr_pos"], inputs["memory"], inputs["memory_pos"])
        got = ours(*args, slots, torch.zeros(2, inputs["memory"].shape[1]))
    assert got.shape == ref["out"].shape == (2, e * e, d)
    assert (got - ref["out"]).abs().max().item() < MAX_ABS * 5


# ---- the video predictor ------------------------------------------------------------------------------------
# The original EdgeTAM predictor, built from modules (the reduced config) with the EdgeTAM yaml's flags plus the
# video predictor's overrides; memories kept fp32 (its bfloat16 cast fails on a CPU), the perceiver's one-word
# fix, and an 8-connected scipy stand-in for its CUDA connected components (so both fill holes as on a GPU).
PREDICTOR = """
import types
import numpy as np
import sam2.sam2_video_predictor as svp
import sam2.utils.misc as misc


class Fp32Torch(types.ModuleType):
    def __getattr__(self, name):
        return torch.float32 if name == "bfloat16" else getattr(torch, name)


svp.torch = Fp32Torch("torch")


def components(mask):
    from scipy import ndimage
    m = mask.to(torch.bool).numpy()
    labels, areas = np.zeros(m.shape, np.int32), np.zeros(m.shape, np.int32)
    for i in range(m.shape[0]):
        lab, _ = ndimage.label(m[i, 0], structure=np.ones((3, 3), bool))
        cnt = np.bincount(lab.ravel())
        cnt[0] = 0
        labels[i, 0], areas[i, 0] = lab, cnt[lab]
    return torch.from_numpy(labels), torch.from_numpy(areas)


misc.get_connected_components = components
svp.fill_holes_in_mask_scores = misc.fill_holes_in_mask_scores
exec(IN["build"])  # -> model: the original SAM2VideoPredictor, perturbed, object score lifted
OUT["state"] = model.state_dict()
exec(IN["session"])
OUT["steps"] = session(model, IN["folder"])
"""

BUILD_ORIGINAL = """
model = build_original(IN["config"], IN["seed"], video=True)
"""

BUILD_FROM_MODULES = """
from sam2.modeling.memory_attention import MemoryAttention, MemoryAttentionLayer
from sam2.modeling.memory_encoder import CXBlock, Fuser, MaskDownSampler, MemoryEncoder
from sam2.modeling.perceiver import PerceiverResampler
from sam2.modeling.position_encoding import PositionEmbeddingSine
from sam2.modeling.sam.transformer import RoPEAttention, RoPEAttentionv2
from sam2edge.checks.fidelity.upstream import UpstreamImagePath
from sam2edge.config import get_config

cfg, v = get_config(IN["config"]), IN["vcfg"]
d, e, m = cfg.d_model, cfg.image_embedding_size, v["mem_dim"]
torch.manual_seed(IN["seed"])
image = UpstreamImagePath(cfg)
layer = MemoryAttentionLayer(
    activation="relu",
    cross_attention=RoPEAttentionv2(rope_theta=10000.0, q_sizes=[e, e], k_sizes=[v["cross_rope_k_grid"]] * 2,
                                    embedding_dim=d, num_heads=1, downsample_rate=1, dropout=0.1, kv_in_dim=m),
    d_model=d, dim_feedforward=v["attn_mlp_dim"], dropout=0.1, pos_enc_at_attn=False,
    self_attention=RoPEAttention(rope_theta=10000.0, feat_sizes=[32, 32], embedding_dim=d, num_heads=1,
                                 downsample_rate=1, dropout=0.1),
    pos_enc_at_cross_attn_keys=True, pos_enc_at_cross_attn_queries=False,
)
memory_encoder = MemoryEncoder(
    out_dim=m,
    mask_downsampler=MaskDownSampler(embed_dim=d, kernel_size=3, stride=2, padding=1),
    fuser=Fuser(CXBlock(dim=d, kernel_size=7, padding=3), 2),
    position_encoding=PositionEmbeddingSine(num_pos_feats=m, normalize=True, temperature=10000),
    in_dim=d,
)
perceiver = PerceiverResampler(
    dim=m, depth=v["perceiver_layers"], dim_head=v["perceiver_dim_head"], heads=1, num_latents=v["perceiver_latents"],
    num_latents_2d=v["perceiver_latents_2d"], ff_mult=4, hidden_dropout_p=0.0, attention_dropout_p=0.0,
    pos_enc_at_key_value=True, concat_kv_latents=False, use_self_attn=True,
    position_encoding=PositionEmbeddingSine(num_pos_feats=m, normalize=True, temperature=10000),
)
model = svp.SAM2VideoPredictor(
    image_encoder=image.image_encoder,
    memory_attention=MemoryAttention(d_model=d, pos_enc_at_input=True, layer=layer, num_layers=v["attn_layers"]),
    memory_encoder=memory_encoder,
    spatial_perceiver=perceiver,
    image_size=cfg.image_size,
    num_maskmem=7, sigmoid_scale_for_mem_enc=20.0, sigmoid_bias_for_mem_enc=-10.0,
    use_mask_input_as_output_without_sam=True, directly_add_no_mem_embed=True, use_high_res_features_in_sam=True,
    multimask_output_in_sam=True, iou_prediction_use_sigmoid=True, use_obj_ptrs_in_encoder=True,
    add_tpos_enc_to_obj_ptrs=False, only_obj_ptrs_in_the_past_for_eval=True, pred_obj_scores=True,
    pred_obj_scores_mlp=True, fixed_no_obj_ptr=True, multimask_output_for_tracking=True,
    use_multimask_token_for_obj_ptr=True, multimask_min_pt_num=0, multimask_max_pt_num=1,
    use_mlp_for_obj_ptr_proj=True, compile_image_encoder=False,
    binarize_mask_from_pts_for_mem_enc=True, fill_hole_area=8,
    sam_mask_decoder_extra_args=dict(dynamic_multimask_via_stability=True, dynamic_multimask_stability_delta=0.05,
                                     dynamic_multimask_stability_thresh=0.98),
)
model.sam_prompt_encoder, model.sam_mask_decoder = image.sam_prompt_encoder, image.sam_mask_decoder
model = perturb(model.eval(), IN["seed"] + 4000)
with torch.no_grad():
    model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.add_(10.0)
"""

# Two objects prompted on frame 0 (a click, a box), forward; both corrected on a tracked later frame (points on
# object 1, a click on object 2: the original re-encodes every object's memory of a corrected frame, so both are
# corrected), forward from the frame after it, reverse from the frame before it. The original predictor runs
# objects as one batch; the corrected frame stays a non-conditioning frame in both.
SESSION = """
def session(pred, folder):
    out = []
    state = pred.init_state(video_path=folder)
    h, w, n = state["video_height"], state["video_width"], state["num_frames"]
    c = n // 2
    rec = lambda step, r: out.append((step, int(r[0]), list(r[1]), torch.as_tensor(r[2]).float().clone()))
    with torch.inference_mode():
        rec("click", pred.add_new_points_or_box(state, 0, 1, points=[[0.45 * w, 0.4 * h]], labels=[1]))
        rec("box", pred.add_new_points_or_box(state, 0, 2, box=[0.1 * w, 0.5 * h, 0.5 * w, 0.95 * h]))
        for r in pred.propagate_in_video(state):
            rec("forward", r)
        pts = [[0.3 * w, 0.5 * h], [0.6 * w, 0.3 * h]]
        rec("correct", pred.add_new_points_or_box(state, c, 1, points=pts, labels=[1, 0]))
        rec("correct", pred.add_new_points_or_box(state, c, 2, points=[[0.3 * w, 0.8 * h]], labels=[1]))
        for r in pred.propagate_in_video(state, start_frame_idx=c + 1):
            rec("forward2", r)
        for r in pred.propagate_in_video(state, start_frame_idx=c - 1, reverse=True):
            rec("reverse", r)
    return out
"""
IOU_MIN = 0.999


def _iou(a: torch.Tensor, b: torch.Tensor) -> float:
    ma, mb = a > 0, b > 0
    union = (ma | mb).sum().item()
    return 1.0 if union == 0 else (ma & mb).sum().item() / union


def _compare_sessions(ours, theirs) -> list[tuple[str, int, int, float]]:
    assert [(s, f, ids) for s, f, ids, _ in ours] == [(s, f, ids) for s, f, ids, _ in theirs]
    return [
        (step, f, obj, _iou(a[i, 0], b[i, 0]))
        for (step, f, ids, a), (_, _, _, b) in zip(ours, theirs)
        for i, obj in enumerate(ids)
    ]


def _ours(state: dict, cfg, vcfg):
    from sam2edge.runtime.video_backend import EagerVideoBackend
    from sam2edge.runtime.video_predictor import Sam2VideoPredictor

    return Sam2VideoPredictor(EagerVideoBackend.from_state_dict(state, cfg, vcfg), fill_hole_area=8)


def _track_parity(tmp_path, cfg, vcfg, build: str, config_name: str, seed: int, frames: int, size):
    from tests.video_oracles import drifting_clip

    folder = tmp_path / "clip"
    drifting_clip(folder, frames, size)
    inputs = dict(
        seed=seed,
        config=config_name,
        vcfg=dataclasses.asdict(vcfg),
        build=textwrap.dedent(build),
        session=textwrap.dedent(SESSION),
        folder=str(folder),
    )
    ref = run_original(PREDICTOR, inputs, tmp_path)
    ours = _ours(ref["state"], cfg, vcfg)
    ns: dict = {"torch": torch}
    exec(textwrap.dedent(SESSION), ns)
    mine = ns["session"](ours, str(folder))
    rows = _compare_sessions(mine, ref["steps"])
    bad = [r for r in rows if r[3] < IOU_MIN]
    assert not bad, f"{len(bad)} of {len(rows)} (step, frame, obj, iou) below {IOU_MIN}: {bad[:6]}"
    assert {"forward", "correct", "forward2", "reverse"} <= {r[0] for r in rows}
    fg = [(m[i, 0] > 0).float().mean().item() for _, _, ids, m in mine for i in range(len(ids))]
    assert 0.02 < sorted(fg)[len(fg) // 2] < 0.98, f"median foreground {sorted(fg)[len(fg) // 2]}"
    return min(r[3] for r in rows)


@pytest.mark.parametrize("seed", [0, 1])
def test_tracking_matches_original_hiera_small(tmp_path, seed):
    """EdgeTAM's memory path (reduced) behind test-small's image path: our predictor == the original's."""
    args = (TEST_SMALL, VIDEO_EDGETAM_TEST, BUILD_FROM_MODULES, "test-small", seed, 6, (200, 150))
    worst = _track_parity(tmp_path, *args)
    print(f"worst IoU {worst:.6f}")
