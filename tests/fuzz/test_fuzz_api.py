"""Hostile input to the Python API (``Sam2Predictor``): refused with InputError (a ValueError) naming the
problem, before any backend runs; valid prompts of any shape give finite outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from sam2edge.errors import UserError

# sam2edge.validate.InputError is a UserError (hence a ValueError); tests name only UserError so that they
# run, and fail for what they check, on code older than the validation layer.
InputError = UserError
LABELS = (-1, 0, 1, 2, 3)

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

BAD_IMAGES = {
    "empty 0x0": (np.zeros((0, 0, 3), np.uint8), "0x0 pixels (empty)"),
    "empty 0xW": (np.zeros((0, 7, 3), np.uint8), "7x0 pixels (empty)"),
    "empty Hx0": (np.zeros((5, 0, 3), np.uint8), "0x5 pixels (empty)"),
    "gray HxW": (np.zeros((4, 4), np.uint8), "must be HxWx3 uint8"),
    "RGBA": (np.zeros((4, 4, 4), np.uint8), "must be HxWx3 uint8"),
    "CHW": (np.zeros((3, 4, 4), np.uint8), "must be HxWx3 uint8"),
    "float": (np.zeros((4, 4, 3), np.float32), "must be HxWx3 uint8"),
    "int64": (np.zeros((4, 4, 3), np.int64), "must be HxWx3 uint8"),
    "bool": (np.zeros((4, 4, 3), bool), "must be HxWx3 uint8"),
    "object": (np.empty((4, 4, 3), object), "must be HxWx3 uint8"),
    "4-d batch": (np.zeros((1, 4, 4, 3), np.uint8), "must be HxWx3 uint8"),
    "0-d": (np.array(3, np.uint8), "must be HxWx3 uint8"),
    "structured": (np.zeros((4, 4, 3), [("a", "u1")]), "must be HxWx3 uint8"),
    "list": ([[[0, 0, 0]]], "got list"),
    "None": (None, "got NoneType"),
    "string": ("photo.png", "got str"),
    "PIL 0x0": (Image.new("RGB", (0, 0)), "0x0 pixels (empty)"),
    "PIL 0x5": (Image.new("L", (0, 5)), "0x5 pixels (empty)"),
}


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_bad_image_refused_before_backend(small_predictor, name):
    pred, spy = small_predictor
    image, words = BAD_IMAGES[name]
    before = spy.calls
    with pytest.raises(InputError) as e:
        pred.set_image(image)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert spy.calls == before
    assert pred.predict([[3.0, 4.0]], [1])[0].shape == (3, 24, 32)  # the photo set before is still there


NAN, INF = float("nan"), float("inf")
BAD_PROMPTS = {
    "nan x": (dict(point_coords=[[NAN, 3.0]], point_labels=[1]), "point_coords holds NaN or infinity"),
    "inf y": (dict(point_coords=[[3.0, INF]], point_labels=[1]), "point_coords holds NaN or infinity"),
    "-inf": (dict(point_coords=[[-INF, 3.0]], point_labels=[0]), "point_coords holds NaN or infinity"),
    "float32 overflow": (dict(point_coords=[[1e39, 3.0]], point_labels=[1]), "point_coords holds NaN or infinity"),
    "nan label": (dict(point_coords=[[1.0, 3.0]], point_labels=[NAN]), "point_labels holds NaN or infinity"),
    "label -3": (dict(point_coords=[[1.0, 3.0]], point_labels=[-3]), "point label -3 is not one of"),
    "label -2": (dict(point_coords=[[1.0, 3.0]], point_labels=[-2]), "point label -2 is not one of"),
    "label 4": (dict(point_coords=[[1.0, 3.0]], point_labels=[4]), "point label 4 is not one of"),
    "label 0.5": (dict(point_coords=[[1.0, 3.0]], point_labels=[0.5]), "point label 0.5 is not one of"),
    "label 1e9": (dict(point_coords=[[1.0, 3.0]], point_labels=[1e9]), "is not one of"),
    "bool label": (dict(point_coords=[[1.0, 3.0]], point_labels=[True]), "point_labels holds true / false"),
    "bool label array": (dict(point_coords=[[1.0, 3.0]], point_labels=np.array([False])), "holds true / false"),
    "labels missing": (dict(point_coords=[[1.0, 3.0]]), "point_labels must be supplied"),
    "labels alone": (dict(point_labels=[1]), "point_labels given without point_coords"),
    "count mismatch": (dict(point_coords=[[1.0, 3.0], [2, 2]], point_labels=[1]), "2 points but 1 labels"),
    "odd coords": (dict(point_coords=[1.0, 2.0, 3.0], point_labels=[1]), "must be Nx2"),
    "Nx3 coords": (dict(point_coords=[[1.0, 2.0, 3.0]], point_labels=[1]), "must be Nx2"),
    "empty coords": (dict(point_coords=np.zeros((0, 2)), point_labels=[]), "must be Nx2 (X, Y) with N >= 1"),
    "ragged coords": (dict(point_coords=[[1.0, 2.0], [3.0]], point_labels=[1, 1]), "not an array of numbers"),
    "string coords": (dict(point_coords="1,2", point_labels=[1]), "not an array of numbers"),
    "string labels": (dict(point_coords=[[1.0, 2.0]], point_labels=["fg"]), "not an array of numbers"),
    "dict coords": (dict(point_coords={"x": 1}, point_labels=[1]), "not an array of numbers"),
    "complex coords": (dict(point_coords=[[1j, 2.0]], point_labels=[1]), "not an array of numbers"),
    "nan box": (dict(box=[0.0, 0.0, NAN, 5.0]), "box holds NaN or infinity"),
    "inf box": (dict(box=[0.0, 0.0, INF, 5.0]), "box holds NaN or infinity"),
    "3-number box": (dict(box=[0.0, 0.0, 5.0]), "box must have 4 numbers"),
    "8-number box": (dict(box=np.zeros(8)), "box must have 4 numbers"),
    "string box": (dict(box="0,0,5,5"), "not an array of numbers"),
    "nan mask": (dict(box=[0, 0, 5, 5], mask_input=np.full((1, 64, 64), NAN)), "mask_input holds NaN or infinity"),
    "inf mask": (dict(box=[0, 0, 5, 5], mask_input=np.full((1, 64, 64), -INF)), "mask_input holds NaN"),
    "wrong mask size": (dict(box=[0, 0, 5, 5], mask_input=np.zeros((1, 32, 32))), "mask_input must be 1x64x64"),
    "string mask": (dict(box=[0, 0, 5, 5], mask_input="logits"), "not an array of numbers"),
}


@pytest.mark.parametrize("name", list(BAD_PROMPTS))
def test_bad_prompt_refused_before_backend(small_predictor, name):
    pred, spy = small_predictor
    kwargs, words = BAD_PROMPTS[name]
    before = spy.calls
    with pytest.raises(InputError) as e:
        pred.predict(**kwargs)
    assert words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    assert spy.calls == before


finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)
non_finite = st.sampled_from([NAN, INF, -INF])


@FUZZ
@given(n=st.integers(1, 5), data=st.data())
def test_any_non_finite_coordinate_is_refused(small_predictor, n, data):
    pred, spy = small_predictor
    coords = np.array(data.draw(st.lists(st.tuples(finite, finite), min_size=n, max_size=n)), np.float64)
    i, j = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 1))
    coords[i, j] = data.draw(non_finite)
    before = spy.calls
    with pytest.raises(InputError, match="point_coords holds NaN or infinity"):
        pred.predict(coords, np.ones(n))
    assert spy.calls == before


@FUZZ
@given(label=st.integers(-(2**40), 2**40).filter(lambda v: v not in LABELS))
def test_any_label_outside_the_set_is_refused(small_predictor, label):
    pred, spy = small_predictor
    before = spy.calls
    with pytest.raises(InputError, match=f"point label {label} is not one of"):
        pred.predict(np.array([[3.0, 4.0]]), np.array([label]))
    assert spy.calls == before


@FUZZ
@given(
    points=st.lists(st.tuples(finite, finite, st.sampled_from([0, 1])), min_size=1, max_size=4),
    box=st.one_of(st.none(), st.tuples(finite, finite, finite, finite)),
    multimask=st.booleans(),
)
def test_any_finite_prompt_gives_finite_masks(small_predictor, points, box, multimask):
    pred, _ = small_predictor
    coords = np.array([p[:2] for p in points], np.float32)
    labels = np.array([p[2] for p in points])
    masks, iou, low = pred.predict(coords, labels, None if box is None else np.array(box), multimask_output=multimask)
    assert masks.shape == ((3 if multimask else 1), 24, 32)
    assert np.isfinite(iou).all() and np.isfinite(low).all()


@FUZZ
@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.uint8, np.float32, np.int16, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_any_array_is_accepted_or_refused_with_one_line(small_predictor, arr):
    pred, spy = small_predictor
    ok = arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3 and min(arr.shape[:2]) >= 1
    before = spy.calls
    if ok:
        pred.set_image(arr)
        assert spy.calls == before + 1
        return
    with pytest.raises(InputError) as e:
        pred.set_image(arr)
    assert "\n" not in str(e.value) and spy.calls == before
