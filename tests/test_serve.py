"""`sam2edge serve` server: limits, refusals, static-file safety and session isolation (no browser needed).

The server runs in a thread on 127.0.0.1 with the eager TEST_SMALL model; every refusal must be a clear
4xx JSON error and the server must keep serving afterwards.
"""

from __future__ import annotations

import http.client
import io
import json
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from sam2edge.checks.fidelity import photo, photo_path
from sam2edge.config import TEST_SMALL
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.serve.app import App, Limits
from sam2edge.serve.uploads import decode_upload

MAX_UPLOAD = 2_000_000
MAX_PIXELS = 4_000_000


@pytest.fixture(scope="module")
def server():
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    app = App(
        pred.backend,
        None,
        "no bundle in this test",
        Limits(max_upload_bytes=MAX_UPLOAD, max_pixels=MAX_PIXELS),
        provenance=pred.provenance,
    )
    srv = app.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, pred
    srv.shutdown()
    srv.server_close()


def request(srv, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """Raw http.client request (no URL normalisation, so '..' reaches the server as sent)."""
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def session(srv) -> str:
    status, _, body = request(srv, "POST", "/api/session", b"")
    assert status == 200
    return json.loads(body)["session"]


def upload(srv, token: str, data: bytes):
    return request(srv, "POST", "/api/images", data, {"X-Session": token, "Content-Type": "application/octet-stream"})


def png_bytes(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def huge_png(w: int, h: int) -> bytes:
    """A valid PNG header announcing w x h (1-bit gray), with a tiny compressed body: a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    row = b"\x00" + b"\x00" * ((w + 7) // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(64)) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def assert_alive(srv) -> None:
    status, headers, body = request(srv, "GET", "/api/info")
    assert status == 200 and json.loads(body)["resolution"] == TEST_SMALL.image_size


def error_of(status: int, body: bytes) -> str:
    assert 400 <= status < 500, (status, body[:200])
    msg = json.loads(body)["error"]
    assert isinstance(msg, str) and 20 < len(msg) < 300 and "\n" not in msg
    return msg


def test_page_and_headers(server):
    srv, _ = server
    status, headers, body = request(srv, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"importmap" in body
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    for path, mime in (
        ("/static/app.js", "text/javascript"),
        ("/static/style.css", "text/css"),
        ("/vendor/@litertjs/core/wasm/litert_wasm_threaded_internal.wasm", "application/wasm"),
        ("/vendor/@litertjs/core/dist/index.js", "text/javascript"),
    ):
        status, headers, _ = request(srv, "GET", path)
        assert status == 200 and headers["Content-Type"].startswith(mime), (path, status, headers.get("Content-Type"))
    assert srv.server_address[0] == "127.0.0.1"


def test_oversized_upload_is_refused(server):
    srv, _ = server
    status, _, body = upload(srv, session(srv), b"\0" * (MAX_UPLOAD + 1))
    assert status == 413 and "limit" in error_of(status, body)
    assert_alive(srv)


def test_non_image_is_refused(server):
    srv, _ = server
    status, _, body = upload(srv, session(srv), b"%PDF-1.7\n" + b"this is not a photo " * 100)
    assert status == 415 and "not an image" in error_of(status, body)
    status, _, body = upload(srv, session(srv), png_bytes(photo("coffee.png"))[:5000])  # truncated PNG
    assert status == 400 and "truncated" in error_of(status, body)
    assert_alive(srv)


def test_unknown_encode_place_is_refused(server):
    """``?encode=`` takes server or page; anything else is a 400 naming both (upload and sample alike)."""
    srv, _ = server
    token = session(srv)
    data = png_bytes(photo("coffee.png"))
    headers = {"X-Session": token, "Content-Type": "application/octet-stream"}
    status, _, body = request(srv, "POST", "/api/images?encode=gpu", data, headers)
    assert status == 400 and "use encode=server (the default) or encode=page" in error_of(status, body)
    status, _, body = request(srv, "POST", "/api/images?sample=coffee.png&encode=Page", b"", headers)
    assert status == 400 and "encode='Page'" in error_of(status, body)
    assert_alive(srv)


def test_decompression_bomb_is_refused(server):
    srv, _ = server
    data = huge_png(20000, 20000)
    assert len(data) < MAX_UPLOAD  # small file, 400 MP announced
    status, _, body = upload(srv, session(srv), data)
    assert status == 413 and "MP" in error_of(status, body)
    assert_alive(srv)


def test_bomb_refused_before_decoding():
    with pytest.raises(Exception) as e:
        decode_upload(huge_png(20000, 20000), 50_000_000)
    assert getattr(e.value, "status", None) == 413


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2f..%2fconfig.py",
        "/static//etc/passwd",
        "/vendor/@litertjs/core/../../../pyproject.toml",
        "/model/../card.json",
        "/static/.hidden",
    ],
)
def test_path_traversal_is_refused(server, path):
    srv, _ = server
    status, _, body = request(srv, "GET", path)
    assert status == 404 and "no such" in error_of(status, body)
    assert b"root:" not in body and b"[project]" not in body
    assert_alive(srv)


def test_foreign_host_is_refused(server):
    """DNS rebinding: a page served as evil.example that resolves to 127.0.0.1 gets nothing."""
    srv, _ = server
    status, _, body = request(srv, "POST", "/api/session", b"", {"Host": "evil.example:8000"})
    assert status == 403 and "Host" in error_of(status, body)
    assert_alive(srv)


def test_image_api_needs_a_session(server):
    srv, _ = server
    status, _, body = upload(srv, "not-a-session", png_bytes(photo("coffee.png")))
    assert status == 401 and "session" in error_of(status, body)


def test_two_sessions_are_isolated(server):
    srv, pred = server
    a, b = session(srv), session(srv)
    photos = {a: photo("chelsea.png"), b: photo("coffee.png")}
    with ThreadPoolExecutor(2) as pool:  # both tabs open their photos at the same time
        answers = dict(zip(photos, pool.map(lambda t: upload(srv, t, png_bytes(photos[t])), photos)))
    ids = {}
    for token, (status, _, body) in answers.items():
        assert status == 200, body
        meta = json.loads(body)
        h, w = photos[token].shape[:2]
        assert (meta["height"], meta["width"]) == (h, w)
        ids[token] = meta["id"]
    assert len(ids[a]) >= 20 and ids[a] != ids[b]
    # each session reads its own photo back, pixel-exact, and its features are the predictor's
    for token in (a, b):
        status, _, body = request(srv, "GET", f"/api/images/{ids[token]}/photo.png", headers={"X-Session": token})
        assert status == 200
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(body)).convert("RGB")), photos[token])
        status, _, body = request(srv, "GET", f"/api/images/{ids[token]}/features.bin", headers={"X-Session": token})
        pred.set_image(photos[token])
        emb = pred.get_image_embedding().numpy().ravel()
        assert status == 200 and np.array_equal(np.frombuffer(body, "<f4")[: emb.size], emb)
    # neither sees the other's photo, features or masks, even knowing the id
    prompt = json.dumps({"coords": [[100.0, 100.0], [0.0, 0.0]], "labels": [1, -1]}).encode()
    for token, other in ((a, b), (b, a)):
        for method, part, data in (
            ("GET", "photo.png", None),
            ("GET", "features.bin", None),
            ("POST", "decode", prompt),
        ):
            status, _, body = request(srv, method, f"/api/images/{ids[other]}/{part}", data, {"X-Session": token})
            assert status == 404 and "no such image" in error_of(status, body)


def test_server_decode_equals_predictor(server):
    srv, pred = server
    token = session(srv)
    # encode=page (the page encodes): no encoder run at upload; /decode encodes it here on first use
    status, _, body = request(srv, "POST", "/api/images?sample=astronaut.png&encode=page", b"", {"X-Session": token})
    assert status == 200
    meta = json.loads(body)
    assert meta["features"] is None and meta["encode_ms"] is None
    image_id = meta["id"]
    img = photo("astronaut.png")
    h, w = img.shape[:2]
    xy = np.array([[300.0, 180.0]], np.float32)
    model_xy = (xy / np.array([w, h], np.float32)) * np.float32(TEST_SMALL.image_size)
    prompt = {"coords": [model_xy[0].tolist(), [0.0, 0.0]], "labels": [1, -1]}
    status, _, body = request(
        srv, "POST", f"/api/images/{image_id}/decode", json.dumps(prompt).encode(), {"X-Session": token}
    )
    assert status == 200
    side = 4 * TEST_SMALL.image_embedding_size
    masks = np.frombuffer(body, "<f4")[: 3 * side * side].reshape(3, side, side)
    pred.set_image(img)
    _, _, low = pred.predict(point_coords=xy, point_labels=[1], multimask_output=True)
    np.testing.assert_allclose(np.clip(masks, -32, 32), low, atol=1e-5)
    bad = request(
        srv, "POST", f"/api/images/{image_id}/decode", b'{"coords": [[1e9, 0]], "labels": [1]}', {"X-Session": token}
    )
    assert bad[0] == 400 and "coords" in error_of(bad[0], bad[2])


def test_samples_are_served(server):
    srv, _ = server
    status, _, body = request(srv, "GET", "/api/info")
    info = json.loads(body)
    assert all(photo_path(s).is_file() for s in info["samples"])
    assert info["decoder"] is None and info["synthetic_weights"] is True


def test_segment_everything_equals_the_generator():
    """The "segment everything" button's API on eager weights that give confident masks (tests/amg_oracle.py):
    /api/info offers it; the answer is the photo with the masks of ``Sam2AutomaticMaskGenerator`` (same
    weights, photo and grid, upstream's default filters) drawn by ``render_masks``, pixel for pixel, X-Masks their
    count; a bad grid size is one 400 line. A backend without a batched decoder is not offered it."""
    from types import SimpleNamespace

    from amg_oracle import confident_
    from oracles import meta_image_path

    from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.backends import EagerBackend, has_batched_decoder
    from sam2edge.runtime.overlay import render_masks

    backend = EagerBackend.from_state_dict(confident_(meta_image_path(TEST_SMALL, seed=0)).state_dict(), TEST_SMALL)
    srv = App(backend, None, "no bundle in this test").make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert json.loads(request(srv, "GET", "/api/info")[2])["everything"] is True
        token = session(srv)
        _, _, body = request(srv, "POST", "/api/images?sample=chelsea.png", b"", {"X-Session": token})
        url = f"/api/images/{json.loads(body)['id']}/everything"
        status, headers, png = request(srv, "POST", f"{url}?points_per_side=8", b"", {"X-Session": token})
        assert status == 200 and headers["Content-Type"] == "image/png", png[:200]
        img = photo("chelsea.png")
        records = Sam2AutomaticMaskGenerator(Sam2Predictor(backend), points_per_side=8).generate(img)
        assert int(headers["X-Masks"]) == len(records) > 0
        got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert np.array_equal(got, np.asarray(render_masks(img, [r["segmentation"] for r in records])))
        assert not np.array_equal(got, img)
        bad = request(srv, "POST", f"{url}?points_per_side=0", b"", {"X-Session": token})
        assert bad[0] == 400 and "points_per_side" in error_of(bad[0], bad[2])
    finally:
        srv.shutdown()
        srv.server_close()
    assert not has_batched_decoder(SimpleNamespace(batched=None, batched_file=None))
