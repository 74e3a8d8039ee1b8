"""Sample photos: real images from scikit-image's wheel (never downloaded), by file name."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")


def photo_path(name: str) -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data" / name


def photo(name: str) -> np.ndarray:
    from sam2edge.runtime.preprocess import load_image

    return load_image(photo_path(name))
