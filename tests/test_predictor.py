"""Sam2Predictor against upstream SAM2ImagePredictor on a real photo, same weights (full size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracles import TorchvisionStandIn
from PIL import Image

from sam2edge import Sam2Predictor
from sam2edge.checks.fidelity import photo
from sam2edge.config import TEST_SMALL

PROMPTS = {
    "point": dict(point_coords=np.array([[512.0, 400.0]]), point_labels=np.array([1])),
    "points+negative": dict(point_coords=np.array([[512.0, 400.0], [200.0, 800.0]]), point_labels=np.array([1, 0])),
    "box": dict(box=np.array([250.0, 200.0, 760.0, 820.0])),
    "box+point": dict(
        point_coords=np.array([[480.0, 500.0]]), point_labels=np.array([1]), box=np.array([250.0, 200.0, 760.0, 820.0])
    ),
}


@pytest.fixture(scope="module")
def retina_1024() -> np.ndarray:
    """A real photo at exactly 1024x1024, so no resize step can differ between the two predictors."""
    img = photo("retina.jpg")
    return np.ascontiguousarray(img[180:1204, 200:1224])


@pytest.fixture(scope="module")
def predictors(upstream_meta, meta_state_dict, retina_1024, tmp_path_factory):
    TorchvisionStandIn.install()
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    ckpt = tmp_path_factory.mktemp("w") / "sam2.1_hiera_tiny.pt"
    torch.save({"model": meta_state_dict}, ckpt)  # the official layout, video parts included
    ours = Sam2Predictor.from_checkpoint(str(ckpt))
    ref = SAM2ImagePredictor(upstream_meta)
    ours.set_image(retina_1024)
    ref.set_image(retina_1024)
    return ours, ref


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("multimask", [True, False])
def test_predict_equals_upstream(predictors, prompt, multimask):
    ours, ref = predictors
    kw = dict(PROMPTS[prompt], multimask_output=multimask)
    m1, s1, l1 = ours.predict(**kw)
    m2, s2, l2 = ref.predict(**kw)
    assert m1.shape == m2.shape and m1.dtype == m2.dtype == np.float32
    assert np.array_equal(m1, m2)
    np.testing.assert_allclose(s1, s2, rtol=0, atol=1e-6)
    np.testing.assert_allclose(l1, l2, rtol=0, atol=1e-4)
    logits1, _, _ = ours.predict(**kw, return_logits=True)
    logits2, _, _ = ref.predict(**kw, return_logits=True)
    np.testing.assert_allclose(logits1, logits2, rtol=0, atol=1e-4 * np.abs(logits2).max())


def test_mask_input_round_trip_equals_upstream(predictors):
    ours, ref = predictors
    _, s, low = ref.predict(**PROMPTS["point"])
    prev = low[np.argmax(s)][None]
    a = ours.predict(**PROMPTS["points+negative"], mask_input=prev, multimask_output=False)
    b = ref.predict(**PROMPTS["points+negative"], mask_input=prev, multimask_output=False)
    assert np.array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], atol=1e-6)


def test_embedding_equals_upstream(predictors):
    ours, ref = predictors
    torch.testing.assert_close(ours.get_image_embedding(), ref.get_image_embedding(), rtol=0, atol=1e-5)


# ---------------------------------------------------------------- images of every kind (small config)
@pytest.fixture(scope="module")
def small_predictor():
    return Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "I;16", "P", "CMYK", "LA", "F"])
def test_any_pil_mode(small_predictor, mode):
    rgb = Image.fromarray(photo("chelsea.png"))
    if mode == "I;16":
        img = Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257)
    elif mode == "F":
        img = Image.fromarray(np.asarray(rgb.convert("L"), np.float32) / 255.0)
    else:
        img = rgb.convert(mode)
    assert img.mode == mode
    small_predictor.set_image(img)
    masks, scores, low = small_predictor.predict(np.array([[200.0, 150.0]]), np.array([1]))
    assert masks.shape == (3, 300, 451) and scores.shape == (3,) and low.shape == (3, 64, 64)


def test_exif_orientation_is_applied(small_predictor, tmp_path):
    img = Image.fromarray(photo("chelsea.png"))  # 451 wide x 300 high
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    path = tmp_path / "rotated.jpg"
    img.save(path, exif=exif)
    with Image.open(path) as im:
        small_predictor.set_image(im)
    masks, _, _ = small_predictor.predict(np.array([[100.0, 300.0]]), np.array([1]))
    assert masks.shape[1:] == (451, 300)


def test_predict_before_set_image_raises():
    p = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    with pytest.raises(RuntimeError, match="set_image"):
        p.predict(np.array([[1.0, 1.0]]), np.array([1]))
