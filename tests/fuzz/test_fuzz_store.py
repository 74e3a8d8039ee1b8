"""Damaged embedding stores: a cut or NaN embedding file, a cut or foreign ``index.parquet``. ``embed`` re-embeds
what is damaged and names it; ``segment --embeddings``, ``serve --embeddings`` and the Python API refuse it in
one line and write nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_state
from PIL import Image

from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.runtime.predictor import Sam2Predictor

SMALL = ["--config", "test-small"]


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("store")
    photos = root / "photos"
    photos.mkdir()
    for i, name in enumerate(("a", "b")):
        rgb = np.random.default_rng(i).integers(0, 256, (24, 32, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(photos / f"{name}.png")
    assert main(["embed", str(photos), "--out", str(root / "store"), "--quiet", *SMALL]) == 0
    return photos, root / "store"


@pytest.fixture
def store(clean_store, tmp_path) -> tuple[Path, Path]:
    photos, clean = clean_store
    shutil.copytree(clean, tmp_path / "store")
    return photos, tmp_path / "store"


def _nan_file(path: Path) -> None:
    """Rewrite an embedding with every tensor NaN, keeping its metadata (a consistent, signed-looking file)."""
    from sam2edge.runtime.backends import Features
    from sam2edge.runtime.embeddings import FEATURE_KEYS, embedding_bytes, read_meta

    meta = read_meta(path)
    meta.pop("format")
    e = TEST_SMALL.image_embedding_size
    shapes = [(1, TEST_SMALL.d_model, e, e), (1, TEST_SMALL.d_model // 8, 4 * e, 4 * e)]
    shapes.append((1, TEST_SMALL.d_model // 4, 2 * e, 2 * e))
    feats = Features(*(np.full(s, np.nan, np.float32) for s in shapes))
    assert len(FEATURE_KEYS) == 3
    path.write_bytes(embedding_bytes(feats, meta))


DAMAGE = {
    "cut in half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "one byte flipped": lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])),
    "all NaN": _nan_file,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_re_embeds_a_damaged_file_and_names_it(store, capsys, damage):
    photos, st = store
    good = (st / "a.safetensors").read_bytes()
    DAMAGE[damage](st / "a.safetensors")
    capsys.readouterr()
    assert main(["embed", str(photos), "--out", str(st), "--quiet", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "1 re-embedded" in out and "re-embedded damaged: a" in out, out
    assert (st / "a.safetensors").read_bytes() == good


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_segment_and_api_refuse_a_damaged_file(store, tmp_path, capsys, damage):
    photos, st = store
    DAMAGE[damage](st / "a.safetensors")
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    with pytest.raises(UserError) as e:
        pred.load_embedding(st, "a")
    assert "\n" not in str(e.value) and "a.safetensors" in str(e.value)
    before = tree_state(tmp_path)
    out = ["--out", str(tmp_path / "m.png"), "--overlay", str(tmp_path / "o.png")]
    rc = main(["segment", str(photos / "a.png"), "--point", "5,5", *SMALL, "--embeddings", str(st), *out])
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("WARNING")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and "a.safetensors" in err[0], err
    assert tree_state(tmp_path) == before


def test_api_refuses_non_finite_features():
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    feats = pred.backend.encode(np.zeros((1, 3, TEST_SMALL.image_size, TEST_SMALL.image_size), np.float32))
    feats.feat_s1[0, 0, 0, 0] = np.inf
    with pytest.raises(UserError, match="NaN or infinity"):
        pred.set_image_embedding(feats, (24, 32))


INDEX_DAMAGE = {
    "cut in half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "not parquet": lambda p: p.write_bytes(b"PAR1 garbage"),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_damaged_index(store, tmp_path, capsys, damage):
    import pyarrow.parquet as pq

    photos, st = store
    want = pq.read_table(st / "index.parquet").to_pylist()
    INDEX_DAMAGE[damage](st / "index.parquet")

    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    with pytest.raises(UserError) as e:  # the API refuses a store whose index cannot be read
        pred.load_embedding(st, "a")
    assert "index.parquet is damaged" in str(e.value) and "\n" not in str(e.value)

    from sam2edge.serve.stored import StoredImages

    with pytest.raises(UserError, match="index.parquet is damaged"):
        StoredImages(st, pred.backend, pred.provenance)

    out = ["--out", str(tmp_path / "m.png"), "--overlay", str(tmp_path / "o.png")]
    capsys.readouterr()
    rc = main(["segment", str(photos / "a.png"), "--point", "5,5", *SMALL, "--embeddings", str(st), *out])
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("WARNING")]
    assert rc == 2 and len(err) == 1 and "index.parquet is damaged" in err[0], err

    # embed: rebuilt before any work (a note), then every image is found done
    assert main(["embed", str(photos), "--out", str(st), "--quiet", *SMALL]) == 0
    cap = capsys.readouterr()
    assert "rebuilt it from 2 embedding files" in cap.err and "2 skipped" in cap.out, (cap.err, cap.out)
    got = pq.read_table(st / "index.parquet").to_pylist()
    keep = ("name", "image", "sha256", "status", "file_bytes", "file_sha256")
    assert [{k: r[k] for k in keep} for r in got] == [{**{k: r[k] for k in keep}, "status": "skipped"} for r in want]


def test_serve_refuses_a_cut_file_at_start(store):
    from sam2edge.serve.stored import StoredImages

    photos, st = store
    DAMAGE["cut in half"](st / "b.safetensors")
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    with pytest.raises(UserError, match="b.safetensors is .* bytes, the index says"):
        StoredImages(st, pred.backend, pred.provenance)
