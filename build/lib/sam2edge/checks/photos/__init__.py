"""Sample photos: real images from scikit-image's wheel (never downloaded), by file name."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")


def photo_path(name: str) -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data" / name


@functools.lru_cache(maxsize=16)
def _decoded(name: str) -> np.ndarray:
    from sam2edge.runtime.preprocess import load_image

    img = load_image(photo_path(name))
    img.setflags(write=False)
    return img


def photo(name: str) -> np.ndarray:
    """HxWx3 uint8 RGB; decoded once per process (an export's measurements read each photo many times),
    a fresh writable copy per call."""
    return _decoded(name).copy()
