"""Fixtures of the fuzz suite: a TEST_SMALL predictor whose backend records every call, and file hashes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from sam2edge.config import TEST_SMALL
from sam2edge.runtime.predictor import Sam2Predictor


class SpyBackend:
    """Wraps a backend; counts encode/decode calls so a test can prove a refusal came *before* the backend."""

    def __init__(self, inner) -> None:
        self.inner, self.cfg, self.name = inner, inner.cfg, inner.name
        self.calls = 0

    def encode(self, x):
        self.calls += 1
        return self.inner.encode(x)

    def decode(self, *args):
        self.calls += 1
        return self.inner.decode(*args)


PHOTO = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def _shared_predictor():
    eager = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    spy = SpyBackend(eager.backend)
    return Sam2Predictor(spy, eager.provenance), spy


@pytest.fixture
def small_predictor(_shared_predictor):
    """(predictor with a 32x24 photo set, its spy backend); the photo is set again if a test unset it."""
    pred, spy = _shared_predictor
    if not pred._is_image_set or pred._orig_hw != PHOTO.shape[:2]:
        pred.set_image(PHOTO)
    return pred, spy


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_state(folder: Path) -> dict[str, str]:
    """name -> SHA-256 of every file under ``folder`` (hidden ones included): 'no file changed' is equality."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(Path(folder).rglob("*")) if p.is_file()}
