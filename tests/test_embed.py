"""`sam2edge embed` (local and Ray Data) and stored embeddings used by the predictor, `segment` and `serve`.

All at test-small with the eager synthetic model. The Ray run is one CLI subprocess on a local 2-CPU
cluster (bounded by a timeout), compared byte for byte with the local run.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from sam2edge.checks.fidelity import PHOTOS, photo_path
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.embed.job import run_local
from sam2edge.embed.store import INDEX, MARKER, TIMING_COLUMNS, list_images
from sam2edge.errors import UserError
from sam2edge.runtime.embeddings import EmbeddingError, read_embedding
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import load_image

SMALL = ["--config", "test-small"]
RAY_TIMEOUT_S = 480  # Ray start-up on a loaded 2-core machine is slow; a hang still fails the test


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """5 real photos + one broken file named like a JPEG."""
    folder = tmp_path_factory.mktemp("photos")
    for name in PHOTOS:
        shutil.copy(photo_path(name), folder / name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff this is not really a JPEG")
    return folder


@pytest.fixture(scope="module")
def store(photos, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stores") / "local"
    assert main(["embed", str(photos), "--out", str(out), "--quiet", *SMALL]) == 0
    return out


def _index(store: Path) -> list[dict]:
    return pq.read_table(store / INDEX).to_pylist()


def test_local_store_contents(store, capsys):
    rows = _index(store)
    assert [r["name"] for r in rows] == ["astronaut", "broken", "chelsea", "coffee", "motorcycle_left", "rocket"]
    status = {r["name"]: r["status"] for r in rows}
    assert status.pop("broken") == "error" and set(status.values()) == {"embedded"}
    broken = next(r for r in rows if r["name"] == "broken")
    assert "not an image" in broken["error"] and "\n" not in broken["error"]
    names = sorted(p.name for p in store.iterdir())
    assert names == sorted([INDEX, MARKER, *(f"{r}.safetensors" for r in status)])  # no temp files
    emb = read_embedding(store / "coffee.safetensors")
    assert emb.original_size == (400, 600) and emb.features.image_embed.shape == (1, 32, 16, 16)
    assert emb.meta["model"]["config"] == "test-small" and emb.meta["model"]["digest"] == "synthetic"


def test_local_equals_ray_byte_for_byte(photos, store, tmp_path):
    """Same images, same model: the Ray Data job (2 actors, local 2-CPU cluster) writes the same bytes.
    The index may differ only in its timing columns."""
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "sam2edge", "embed", str(photos), "--out", str(out), "--quiet", *SMALL]
    cmd += ["--ray", "--num-cpus", "2", "--actors", "2", "--cpus-per-actor", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_DEDUP_LOGS="0", PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=RAY_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "summary: 6 images: 5 embedded, 0 skipped, 1 error" in r.stdout
    files = sorted(p.name for p in store.iterdir())
    assert files == sorted(p.name for p in out.iterdir())
    for name in files:
        if name != INDEX:
            assert (store / name).read_bytes() == (out / name).read_bytes(), name
    local, ray = pq.read_table(store / INDEX), pq.read_table(out / INDEX)
    assert local.schema == ray.schema
    assert local.drop_columns(list(TIMING_COLUMNS)).equals(ray.drop_columns(list(TIMING_COLUMNS)))


class Stop(Exception):
    pass


def test_interrupted_run_resumes(photos, tmp_path):
    images = list_images(str(photos))
    out = tmp_path / "store"

    def stop_after_3(row: dict) -> None:
        if len(seen) == 2:
            raise Stop
        seen.append(row["name"])

    seen: list[str] = []
    with pytest.raises(Stop):
        run_local(images, out, config="test-small", on_row=stop_after_3, progress=False)
    assert [r["name"] for r in _index(out)] == ["astronaut", "broken", "chelsea"]  # index written on the way out
    done = {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")}
    assert sorted(done) == ["astronaut.safetensors", "chelsea.safetensors"]
    assert not list(out.glob(".*"))  # nothing half-written

    rows = run_local(images, out, config="test-small", progress=False)
    status = {r["name"]: r["status"] for r in rows}
    assert status == {
        "astronaut": "skipped",
        "broken": "error",
        "chelsea": "skipped",
        "coffee": "embedded",
        "motorcycle_left": "embedded",
        "rocket": "embedded",
    }
    assert all((out / n).stat().st_mtime_ns == t for n, t in done.items())  # finished files not rewritten

    changed = tmp_path / "changed"
    changed.mkdir()
    rgb = load_image(photos / "coffee.png")
    Image.fromarray(rgb[::-1].copy()).save(changed / "coffee.png")  # same name, other bytes
    rows = run_local(list_images(str(changed)), out, config="test-small", progress=False)
    assert [r["status"] for r in rows] == ["embedded"]


def _segment(photo: Path, tmp_path: Path, tag: str, extra: list[str]) -> bytes:
    out, ovl = tmp_path / f"{tag}.png", tmp_path / f"{tag}-overlay.png"
    args = ["segment", str(photo), "--point", "300,200", "--box", "150,100,450,350", *SMALL, *extra]
    assert main([*args, "--out", str(out), "--overlay", str(ovl)]) == 0
    return out.read_bytes()


def test_segment_with_embeddings_equals_plain(photos, store, tmp_path, capsys):
    plain = _segment(photos / "coffee.png", tmp_path, "plain", [])
    stored = _segment(photos / "coffee.png", tmp_path, "stored", ["--embeddings", str(store)])
    assert stored == plain
    mask = np.asarray(Image.open(tmp_path / "stored.png"))
    assert 0 < (mask > 0).mean() < 1  # a real mask, not empty or full

    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(photos / "chelsea.png", other / "coffee.png")  # right name, wrong bytes
    capsys.readouterr()
    args = ["segment", str(other / "coffee.png"), "--point", "100,100", *SMALL, "--embeddings", str(store)]
    rc = main([*args, "--out", str(tmp_path / "x.png"), "--overlay", str(tmp_path / "y.png")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(err) == 1 and "other image bytes" in err[0]
    assert not (tmp_path / "x.png").exists()


def test_predictor_skips_the_encoder(store, photos):
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the store was embedded with `embed`'s default --threads 1: same arithmetic
    try:
        pred.set_image(load_image(photos / "chelsea.png"))
    finally:
        torch.set_num_threads(threads)
    want = pred.predict(np.array([[200.0, 150.0]]), np.array([1]))
    encode, pred.backend.encode = pred.backend.encode, None  # any encoder call would fail
    pred.load_embedding(store, "chelsea")
    got = pred.predict(np.array([[200.0, 150.0]]), np.array([1]))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    pred.backend.encode = encode
    with pytest.raises(EmbeddingError, match="no stored embedding"):
        pred.load_embedding(store, "broken")


def test_store_refuses_foreign_folders(photos, tmp_path, capsys):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    assert main(["embed", str(photos), "--out", str(user), "--quiet", *SMALL]) == 2
    assert "not an embedding store" in capsys.readouterr().err
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]

    other = tmp_path / "other-model"
    other.mkdir()
    (other / MARKER).write_text(json.dumps({"format": "x", "model": {"kind": "checkpoint", "digest": "ab" * 32}}))
    assert main(["embed", str(photos), "--out", str(other), "--quiet", *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds embeddings of checkpoint" in err[0]
    assert sorted(p.name for p in other.iterdir()) == [MARKER]


def test_serve_opens_stored_images_without_encoder(store, photos):
    from sam2edge.serve.app import App
    from sam2edge.serve.stored import StoredImages

    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    pred.backend.encode = None  # the server must not encode
    app = App(pred.backend, None, "no bundle in this test", provenance=pred.provenance)
    app.stored = StoredImages(store, pred.backend, pred.provenance)
    srv = app.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        info = json.loads(_get(srv, "GET", "/api/info")[1])
        assert info["stored"] == ["astronaut", "chelsea", "coffee", "motorcycle_left", "rocket"]
        token = json.loads(_get(srv, "POST", "/api/session")[1])["session"]
        status, body = _get(srv, "POST", "/api/images?stored=rocket", token)
        meta = json.loads(body)
        assert status == 200 and (meta["height"], meta["width"]) == (427, 640)
        status, feats = _get(srv, "GET", f"/api/images/{meta['id']}/features.bin", token)
        emb = read_embedding(store / "rocket.safetensors").features
        assert feats == b"".join(a.astype("<f4").tobytes() for a in (emb.image_embed, emb.feat_s0, emb.feat_s1))
        assert _get(srv, "POST", "/api/images?stored=nope", token)[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def _get(srv, method: str, path: str, token: str = "") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers={"X-Session": token})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_bundle_identity_follows_the_model_files():
    """A bundle's identity hashes its model artifacts: `verify`/`card` rewrites keep it, a new file changes it."""
    from sam2edge.runtime.embeddings import model_identity

    arts = [{"file": "encoder.tflite", "sha256": "a" * 64}, {"file": "decoder.tflite", "sha256": "b" * 64}]
    card = {"artifacts": arts, "config": "test-small", "fidelity": {}}
    ident = model_identity(card, TEST_SMALL, "litert")
    assert ident["kind"] == "bundle" and ident["resolution"] == 256 and ident["backend"] == "litert"
    assert model_identity({**card, "fidelity": {"verify": {"ok": True}}}, TEST_SMALL, "litert") == ident
    assert model_identity({**card, "artifacts": arts[::-1]}, TEST_SMALL, "litert") == ident
    other = [arts[0], {"file": "decoder.tflite", "sha256": "c" * 64}]
    assert model_identity({**card, "artifacts": other}, TEST_SMALL, "litert") != ident
    assert model_identity(card, TEST_SMALL, "onnx") != ident


def test_onnx_bundle_store_gives_plain_segment_mask(photos, small_bundle, tmp_path, capsys):
    """With a tiny exported bundle (the session's): embed, then `segment --model B --embeddings S` ==
    `segment --model B`."""
    bundle, out = small_bundle("onnx"), tmp_path / "store"
    assert main(["embed", str(photos / "rocket.jpg"), "--model", str(bundle), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / MARKER).read_text())["model"]["kind"] == "bundle"
    photo, model = photos / "rocket.jpg", ["--model", str(bundle)]
    stored = _segment(photo, tmp_path, "stored", [*model, "--embeddings", str(out)])
    assert stored == _segment(photo, tmp_path, "plain", model)
    capsys.readouterr()
    rc = main(
        ["segment", str(photo), "--point", "9,9", *SMALL, "--embeddings", str(out), "--out", str(tmp_path / "x.png")]
    )
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(err) == 1 and "not this model" in err[0]  # eager predictor, bundle store


def test_image_listing_folder_glob_list_file(photos, tmp_path):
    folder = list_images(str(photos))
    assert [n for n, _ in folder] == ["astronaut", "broken", "chelsea", "coffee", "motorcycle_left", "rocket"]
    assert [n for n, _ in list_images(str(photos / "*.png"))] == ["astronaut", "chelsea", "coffee", "motorcycle_left"]
    lst = tmp_path / "list.txt"
    lst.write_text(f"# photos\n{photos / 'rocket.jpg'}\n\nsub/x.png\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.png").write_bytes(b"")
    assert list_images(str(lst)) == [("rocket", photos / "rocket.jpg"), ("x", (tmp_path / "sub" / "x.png").absolute())]
    (tmp_path / "sub" / "rocket.png").write_bytes(b"")
    lst.write_text(f"{photos / 'rocket.jpg'}\nsub/rocket.png\n")
    with pytest.raises(UserError, match="share the name 'rocket'"):
        list_images(str(lst))
