"""Work an export does once instead of twice (export time): the job's shared eager reference,
the shared encoder outputs of one graph, the photos decoded once, the manifest reusing the card's hashes.
Each reuse must give exactly what the work done again gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sam2edge.bundle import finalize_bundle, verify_manifest
from sam2edge.bundle.card import _manifest_files
from sam2edge.checks.fidelity.measure import CachedEncoder, CachedReference, model_prompt
from sam2edge.checks.fidelity.metrics import click_set
from sam2edge.checks.photos import photo
from sam2edge.config import TEST_SMALL
from sam2edge.runtime.backends import EagerBackend
from sam2edge.runtime.preprocess import preprocess
from sam2edge.weights import synthetic_state_dict


class Counting:
    """A backend that counts its encodes and decodes."""

    def __init__(self, backend) -> None:
        self.inner, self.name, self.cfg = backend, backend.name, backend.cfg
        self.encodes = self.decodes = 0

    def encode(self, image):
        self.encodes += 1
        return self.inner.encode(image)

    def decode(self, feats, coords, labels, mask_input):
        self.decodes += 1
        return self.inner.decode(feats, coords, labels, mask_input)


def _fields(d) -> list[np.ndarray]:
    return [np.asarray(getattr(d, f)) for f in d.__dataclass_fields__]


def test_cached_reference_computes_once_and_equals_a_fresh_run() -> None:
    sd = synthetic_state_dict(TEST_SMALL)
    counted = Counting(EagerBackend.from_state_dict(sd, TEST_SMALL))
    ref, fresh = CachedReference(counted), EagerBackend.from_state_dict(sd, TEST_SMALL)
    p = next(q for q in click_set(8) if q.photo == "astronaut.png")
    img = photo(p.photo)
    x = preprocess(img, TEST_SMALL.image_size).numpy()
    coords, labels = model_prompt(p, img.shape[:2], TEST_SMALL.image_size)
    mask = np.full((1, 1, 64, 64), 2.0, np.float32)
    feats = ref.encode(x)
    assert ref.encode(x.copy()) is feats and counted.encodes == 1
    for m in (None, mask, None, mask):
        got, want = ref.decode(feats, coords, labels, m), fresh.decode(fresh.encode(x), coords, labels, m)
        assert all(np.array_equal(a, b) for a, b in zip(_fields(got), _fields(want)))
    assert counted.decodes == 2  # one per distinct (features, prompt, mask input)
    ref.decode(feats, coords + 1.0, labels, None)
    assert counted.decodes == 3  # another prompt is decoded
    ref.decode(fresh.encode(x), coords, labels, None)
    assert counted.decodes == 4  # features it did not return are never looked up
    assert CachedEncoder(ref).backend is counted  # wrapping again shares the backend and its encodes
    CachedEncoder(ref).encode(x)
    assert counted.encodes == 1


def test_shared_encoder_cache_encodes_once_per_photo_but_decodes_each_backend() -> None:
    sd, shared = synthetic_state_dict(TEST_SMALL), {}
    a, b = (Counting(EagerBackend.from_state_dict(sd, TEST_SMALL)) for _ in range(2))
    x = preprocess(photo("chelsea.png"), TEST_SMALL.image_size).numpy()
    fa = CachedEncoder(a, shared).encode(x)
    assert CachedEncoder(b, shared).encode(x) is fa and (a.encodes, b.encodes) == (1, 0)
    coords, labels = np.array([[[30.0, 40.0], [0.0, 0.0]]], np.float32), np.array([[1.0, -1.0]], np.float32)
    CachedEncoder(a, shared).decode(fa, coords, labels, None)
    CachedEncoder(b, shared).decode(fa, coords, labels, None)
    assert (a.decodes, b.decodes) == (1, 1)  # decodes are the backends' own (two decoders, one encoder)


def test_photo_is_a_fresh_copy_each_call() -> None:
    first = photo("coffee.png")
    first[:] = 0
    again = photo("coffee.png")
    assert again.flags.writeable and again.any() and again is not first


def test_manifest_reuses_the_card_hashes_and_matches_fresh_ones(tmp_path: Path) -> None:
    (tmp_path / "encoder.bin").write_bytes(bytes(range(256)) * 3)
    (tmp_path / "decoder.bin").write_bytes(b"decoder" * 50)
    fidelity = {"reference": "r", "outputs": {}, "end_to_end": {}, "bars": {}, "passed": True, "failures": []}
    finalize_bundle(
        tmp_path,
        target="onnx",
        precision="fp32",
        resolution=256,
        config="test-small",
        source={"checkpoint": "synthetic", "format": "synthetic", "sha256": None},
        command="test",
        artifacts={"encoder.bin": "encoder", "decoder.bin": "decoder"},
        fidelity=fidelity,
    )
    written = json.loads((tmp_path / "manifest.json").read_text())["files"]
    assert written == _manifest_files(tmp_path) and verify_manifest(tmp_path) == []
