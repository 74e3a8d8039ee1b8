"""The clip's mask IoU leaves out reference logits that sit on the threshold (``checks.fidelity.video.TIE``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sam2edge.checks.fidelity.video import TIE, _per_frame, ties, video_failures


def _frame(seed: int, objects: int = 2, size: tuple[int, int] = (30, 40)) -> np.ndarray:
    """(objects, 1, H, W) logits with masks of a few hundred pixels."""
    return np.random.default_rng(seed).standard_normal((objects, 1, *size)).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.floats(1e-3, 1e3), rel=st.floats(0.0, 0.99))
def test_a_perturbation_under_the_tie_never_lowers_the_iou(seed, scale, rel):
    """Any change of the logits smaller than TIE of each object's scale flips only ties: every IoU stays 1."""
    ref = _frame(seed) * np.float32(scale)
    ref[1, 0, 3, 4] = -2.5e-9 * scale  # a logit on the threshold, as the measured ExecuTorch EdgeTAM clip had
    rng = np.random.default_rng(seed + 1)
    bound = rel * TIE * np.abs(ref).reshape(len(ref), -1).max(1)  # per object
    test = ref + (rng.uniform(-1, 1, ref.shape) * bound[:, None, None, None]).astype(np.float32)
    test[1, 0, 3, 4] = -ref[1, 0, 3, 4]  # the tie flips
    assert _per_frame({0: test}, {0: ref}) == {"0": 1.0}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_flip_beyond_the_tie_still_counts(seed):
    """A pixel 1e-3 of the scale from 0 is no tie: flipping it lowers that object's IoU (and the frame's)."""
    ref = _frame(seed)
    scale = float(np.abs(ref[0]).max())
    ref[0, 0, 5, 5] = -1e-3 * scale
    test = ref.copy()
    test[0, 0, 5, 5] = 1e-3 * scale
    area = int((ref[0] > 0).sum())
    got = _per_frame({0: test}, {0: ref})["0"]
    assert got == pytest.approx(area / (area + 1)) and got < 1.0


def test_ties_never_hide_a_nan():
    """A NaN reference logit is not a tie, and a NaN scale makes no pixel one: nothing is left out."""
    ref = _frame(2)
    assert ties(ref[0]).sum() == 0
    ref[0, 0, 0, 0] = np.nan
    assert ties(ref[0]).sum() == 0
    ref[0, 0, 1, 1] = 0.0
    assert ties(ref[0]).sum() == 0  # the scale is NaN: even an exact 0 stays in the IoU


def test_a_frame_under_the_bar_is_still_refused():
    """The bar is unchanged: a frame below it is named, with its pass and index."""
    report = {
        "bars": {"min_video_iou_worst": 0.999},
        "nonfinite": 0,
        "per_frame_iou": {"forward": {"0": 1.0, "2": 0.998}},
        "iou_worst": 0.998,
        "iou_median": 0.999,
    }
    assert video_failures(report) == ["video mask IoU worst 0.9980 < 0.999 (worst: forward pass, frame 2)"]


def _video_flips():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "video_flips.py"
    spec = importlib.util.spec_from_file_location("video_flips", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_video_flips_rows_name_each_flip_with_its_reference_logit():
    """``benchmarks/video_flips.py``'s rows: per pass, frame and object, the area, largest difference and flips
    relative to the object's scale, the nearest flipped reference logit, and the ties."""
    ref = _frame(3)
    scale = float(np.abs(ref[1]).max())
    ref[1, 0, 2, 2] = -2.5e-9 * scale
    got = ref.copy()
    got[1, 0, 2, 2] = 5e-9 * scale
    rows = _video_flips().rows({"forward": {0: ref}}, {"forward": {0: got}})
    assert [r[:4] for r in rows] == [
        ("forward", 0, 0, int((ref[0] > 0).sum())),
        ("forward", 0, 1, int((ref[1] > 0).sum())),
    ]
    assert rows[0][4:7] == (0.0, 0, None)
    assert rows[1][5] == 1 and rows[1][6] == pytest.approx(2.5e-9, rel=1e-3) and rows[1][4] == pytest.approx(7.5e-9)
    assert rows[1][7] == 1


def test_video_flips_on_a_bundle_and_its_refusals(video_bundle_dir, small_bundle, tmp_path, capsys):
    """A --video bundle's clip is tabulated; a folder without a card, or an image-only bundle, is one line, exit 2."""
    vf = _video_flips()
    assert vf.main([str(video_bundle_dir("onnx"))]) == 0
    out = capsys.readouterr().out
    assert "masks without a flip" in out and "| pass | frame | object |" in out
    assert vf.main([str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path} has no card.json; pass a bundle folder written by `sam2edge export --video`"
    )
    assert vf.main([str(small_bundle("onnx"))]) == 2
    assert capsys.readouterr().err.strip().endswith("has no video graphs; export it with --video")
