"""EdgeTAM's image path against the original EdgeTAM code (``edgetam-dimos``, in a subprocess: tests/edgetam_oracle.py).

* RepViT: our trunk (folded and trained forms) == timm's ``repvit_m1`` (features_only) with the same perturbed
  weights, batch-norm statistics included; the full-width repvit_m1 and the reduced narrow one.
* Predictor: ``Sam2Predictor.from_checkpoint`` on the original model's own state dict (the ``edgetam.pt`` layout,
  memory path included, config detected from its tensors) == the original ``SAM2ImagePredictor``: clicks, a
  negative click, a box, box + click, multimask on and off; low-res logits cosine >= 0.99999 and mask IoU >= 0.999;
  two seeds. Reduced config in CI; full size under ``-m slow``.

One child process per module and config computes every original output (session fixtures, cached).
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
    OUT[seed] = dict(state=model.state_dict(), rows=rows, embed=pred.get_image_embedding().clone())
"""

TIMM = """
import timm
from timm.models import create_model
for name, kw, side, seed in IN["cases"]:
    torch.manual_seed(seed)
    m = perturb(create_model("repvit_m1", pretrained=False, features_only=True, out_indices=(0, 1, 2, 3), **kw), seed)
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(seed + 7))
    with torch.no_grad():
        OUT[name] = dict(state=m.state_dict(), x=x, feats=m(x), channels=m.feature_info.channels())
"""


@pytest.fixture(scope="module")
def original_reduced():
    s = get_config("test-small-edgetam").image_size
    inputs = dict(config="test-small-edgetam", seeds=SEEDS, image=_image(s), prompts=_prompts(s))
    return inputs, run_original(PREDICT, inputs)


@pytest.fixture(scope="module")
def timm_features():
    cfg = get_config("test-small-edgetam")
    cases = [
        ("repvit_m1", {}, 128, 0),
        ("narrow", dict(embed_dim=cfg.repvit_dims, depth=cfg.repvit_depths), 96, 1),
    ]
    return run_original(TIMM, dict(cases=cases))


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
    out = run_original(PREDICT, inputs)
    for seed in SEEDS:
        cos, iou = _parity(inputs, out[seed], tmp_path)
        print(f"edgetam seed {seed}: worst low-res logits cosine {cos:.7f}, worst mask IoU {iou:.5f}")
        assert cos >= COSINE_MIN and iou >= IOU_MIN
