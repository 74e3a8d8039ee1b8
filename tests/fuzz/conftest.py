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


@pytest.fixture(scope="session")
def small_predictor():
    eager = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    spy = SpyBackend(eager.backend)
    pred = Sam2Predictor(spy, eager.provenance)
    pred.set_image(np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8))
    return pred, spy


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_state(folder: Path) -> dict[str, str]:
    """name -> SHA-256 of every file under ``folder`` (hidden ones included): 'no file changed' is equality."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(Path(folder).rglob("*")) if p.is_file()}
