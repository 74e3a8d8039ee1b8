"""Hostile options to segment-everything: ``Sam2AutomaticMaskGenerator`` (Python API) refuses what
``sam2edge everything`` refuses, with the same one-line message, before any model call."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import tree_state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from sam2edge.cli.main import main
from sam2edge.errors import UserError
from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
THRESHOLDS = ("pred_iou_thresh", "stability_score_thresh", "box_nms_thresh", "crop_nms_thresh", "crop_overlap_ratio")
OUT_OF_UNIT = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.floats(min_value=1.0, exclude_min=True, allow_infinity=False),
    st.floats(max_value=0.0, exclude_max=True, allow_infinity=False),
)

BAD_KWARGS = {
    "nan pred_iou_thresh": ({"pred_iou_thresh": math.nan}, "pred_iou_thresh"),
    "stability 2": ({"stability_score_thresh": 2.0}, "out of range; use a value in 0..1"),
    "negative crop layers": ({"crop_n_layers": -1}, "crop_n_layers"),
    "40 crop layers": ({"crop_n_layers": 40}, "GiB of memory"),
    "grid 100000": ({"points_per_side": 100_000}, "GiB of memory"),
    "grid 1.5": ({"points_per_side": 1.5}, "must be an integer"),
    "grid 0": ({"points_per_side": 0}, "points_per_side"),
    "batch 0": ({"points_per_batch": 0}, "points_per_batch"),
    "downscale 0": ({"crop_n_points_downscale_factor": 0}, "downscale"),
    "nan offset": ({"stability_score_offset": math.nan}, "stability_score_offset"),
    "inf mask threshold": ({"mask_threshold": math.inf}, "mask_threshold"),
    "negative area": ({"min_mask_region_area": -5}, "min_mask_region_area"),
    "area 2.5": ({"min_mask_region_area": 2.5}, "min_mask_region_area"),
}


@pytest.mark.parametrize("name", list(BAD_KWARGS))
def test_generator_refuses_before_model(small_predictor, name):
    pred, spy = small_predictor
    kwargs, words = BAD_KWARGS[name]
    before = spy.calls
    with pytest.raises(UserError) as e:
        Sam2AutomaticMaskGenerator(pred, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert spy.calls == before


@FUZZ
@given(name=st.sampled_from(THRESHOLDS), value=OUT_OF_UNIT)
def test_any_threshold_outside_unit_interval_is_refused(small_predictor, name, value):
    with pytest.raises(UserError, match=name):
        Sam2AutomaticMaskGenerator(small_predictor[0], **{name: value})


@FUZZ
@given(side=st.integers(1, 10**9), layers=st.integers(0, 64))
def test_grid_bound_is_stated_or_the_grid_is_built(small_predictor, side, layers):
    """A grid either fits the bound (generator built, layer sizes as upstream) or the refusal states it."""
    from sam2edge.validate import BYTES_PER_PROMPT, grid_prompts, max_crop_layers, memory_bytes

    fits = (
        layers <= max_crop_layers() and grid_prompts(min(side, 1 << 20), layers, 1) * BYTES_PER_PROMPT <= memory_bytes()
    )
    if not fits:
        with pytest.raises(UserError, match="GiB of memory"):
            Sam2AutomaticMaskGenerator(small_predictor[0], points_per_side=side, crop_n_layers=layers)
    elif side <= 64 and layers <= 2:  # cheap enough to build here
        gen = Sam2AutomaticMaskGenerator(small_predictor[0], points_per_side=side, crop_n_layers=layers)
        assert [len(g) for g in gen.point_grids] == [side**2] * (layers + 1)


CLI_CASES = {
    "nan iou": (["--pred-iou-thresh", "nan"], "--pred-iou-thresh"),
    "stability 2": (["--stability-thresh", "2"], "--stability-thresh"),
    "nms inf": (["--box-nms-thresh", "inf"], "--box-nms-thresh"),
    "huge grid": (["--points-per-side", "100000"], "GiB of memory"),
    "crop layers 40": (["--crop-layers", "40"], "GiB of memory"),
    "crop layers -1": (["--crop-layers", "-1"], "--crop-layers"),
    "negative area": (["--min-region-area", "-1"], "--min-region-area"),
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_everything_cli_refuses_in_one_line(tmp_path, capsys, name):
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "p.png")
    args, words = CLI_CASES[name]
    before = tree_state(tmp_path)
    out = ["--out", str(tmp_path / "m.json"), "--overlay", str(tmp_path / "o.png")]
    rc = main(["everything", str(tmp_path / "p.png"), "--config", "test-small", *out, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert tree_state(tmp_path) == before
