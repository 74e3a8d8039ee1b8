"""Hostile requests to ``sam2edge serve``: each gets the right 4xx JSON answer (never 500), the server keeps
serving, and no photo is added by a refused upload."""

from __future__ import annotations

import http.client
import io
import json
import socket
import struct
import threading
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from sam2edge.config import TEST_SMALL
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.serve import app as app_module
from sam2edge.serve.app import App, Limits
from sam2edge.serve.web import Handler


@pytest.fixture(scope="module")
def served():
    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    limits = Limits(max_upload_bytes=2_000_000, max_pixels=4_000_000)
    limits.max_decodes = 1  # one upload decoded at a time
    app = App(pred.backend, None, "fuzz", limits)
    srv = app.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, app
    srv.shutdown()
    srv.server_close()


def call(srv, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.fixture
def token(served):
    status, body = call(served[0], "POST", "/api/session")
    return json.loads(body)["session"]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w: int, h: int, extra: bytes = b"") -> bytes:
    raw = b"".join(b"\x00" + b"\x00" * 3 * w for _ in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + extra
        + _chunk(b"IDAT", zlib.compress(raw))
        + _chunk(b"IEND", b"")
    )


def tiff(w: int, h: int) -> bytes:
    """A small valid little-endian TIFF whose header announces w x h (ImageWidth / ImageLength patched)."""
    buf = io.BytesIO()
    Image.new("L", (3, 3)).save(buf, "TIFF")
    data = bytearray(buf.getvalue())
    off = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[off : off + 2])[0]):
        e = off + 2 + 12 * i
        tag, typ = struct.unpack("<HH", data[e : e + 4])
        if tag in (256, 257):
            val = w if tag == 256 else h
            data[e + 8 : e + 12] = struct.pack("<HH", val, 0) if typ == 3 else struct.pack("<I", val)
    return bytes(data)


BOMB = zlib.compress(b"a" * 50_000_000)
UPLOADS = {
    "zTXt text chunk bomb": (png(4, 4, _chunk(b"zTXt", b"Comment\x00\x00" + BOMB)), 413, "metadata inflates"),
    "iTXt text chunk bomb": (png(4, 4, _chunk(b"iTXt", b"Comment\x00\x01\x00\x00\x00" + BOMB)), 413, "metadata"),
    "20000x20000 TIFF": (tiff(20000, 20000), 413, "decompression bomb guard"),
    "3000x3000 TIFF over the limit": (tiff(3000, 3000), 413, "the limit is 4 MP"),
    "zero-width PNG": (png(0, 4), 400, "zero width or height"),
    "zero-height PNG": (png(4, 0), 400, "zero width or height"),
    "zero-size TIFF": (tiff(0, 5), 400, ""),
    "empty body": (b"", 400, "the upload is empty"),
    "text": (b"hello, world", 415, "not an image"),
    "truncated PNG": (png(64, 64)[:60], 400, ""),
    "PNG magic alone": (b"\x89PNG\r\n\x1a\n", 400, ""),
}


@pytest.mark.parametrize("name", list(UPLOADS))
def test_hostile_upload_gets_its_4xx(served, token, name):
    srv, app = served
    data, status, words = UPLOADS[name]
    n = len(app._photos)
    got, body = call(srv, "POST", "/api/images", data, {"X-Session": token})
    assert got == status, body
    assert words in json.loads(body)["error"]
    assert len(app._photos) == n
    assert call(srv, "GET", "/api/info")[0] == 200


@pytest.fixture
def image_id(served, token):
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buf, "PNG")
    status, body = call(served[0], "POST", "/api/images", buf.getvalue(), {"X-Session": token})
    assert status == 200
    return json.loads(body)["id"]


PROMPTS = {
    "deeply nested list": (b"[" * 60_000 + b"]" * 0, "the prompt must be JSON"),
    "deeply nested coords": (b'{"coords": ' + b"[" * 30_000 + b"]" * 30_000 + b', "labels": [1]}', "the prompt"),
    "deeply nested objects": (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "the prompt must be JSON"),
    "NaN literal": (b'{"coords": [[NaN, 3]], "labels": [1]}', "holds NaN or infinity"),
    "Infinity literal": (b'{"coords": [[Infinity, 3]], "labels": [1]}', "holds NaN or infinity"),
    "huge number": (b'{"coords": [[1e999, 3]], "labels": [1]}', "holds NaN or infinity"),
    "label -3": (b'{"coords": [[3, 3]], "labels": [-3]}', "point label -3 is not one of"),
    "label -2": (b'{"coords": [[3, 3]], "labels": [-2]}', "point label -2 is not one of"),
    "label 2.5": (b'{"coords": [[3, 3]], "labels": [2.5]}', "point label 2.5 is not one of"),
    "label NaN": (b'{"coords": [[3, 3]], "labels": [NaN]}', "point_labels holds NaN"),
    "label string": (b'{"coords": [[3, 3]], "labels": ["fg"]}', "not an array of numbers"),
    "label true": (b'{"coords": [[3, 3]], "labels": [true]}', "point_labels holds true / false"),
    "ragged coords": (b'{"coords": [[3, 3], [3]], "labels": [1, 1]}', "not an array of numbers"),
    "coords Nx3": (b'{"coords": [[3, 3, 3]], "labels": [1]}', "must be Nx2"),
    "count mismatch": (b'{"coords": [[3, 3], [4, 4]], "labels": [1]}', "2 points but 1 labels"),
    "no points": (b'{"coords": [], "labels": []}', "must be Nx2"),
    "too many points": (json.dumps({"coords": [[1, 1]] * 65, "labels": [1] * 65}).encode(), "give 1..64 coords"),
    "outside the model input": (b'{"coords": [[-1, 3]], "labels": [1]}', "must lie in [0,"),
    "null": (b"null", "the prompt must be JSON"),
    "a list": (b"[1, 2]", "the prompt must be JSON"),
    "not JSON": (b"\xff\xfe", "the prompt must be JSON"),
    "missing labels": (b'{"coords": [[1, 1]]}', "the prompt must be JSON"),
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_hostile_prompt_gets_400(served, token, image_id, name):
    body, words = PROMPTS[name]
    status, answer = call(served[0], "POST", f"/api/images/{image_id}/decode", body, {"X-Session": token})
    assert status == 400, answer
    assert words in json.loads(answer)["error"]


def _raw(srv, head: bytes, body: bytes, close_write: bool) -> bytes:
    s = socket.create_connection(srv.server_address[:2], timeout=30)
    try:
        s.sendall(head + body)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        s.close()


def test_short_body_is_refused_not_decoded(served, token):
    srv, app = served
    n = len(app._photos)
    data = png(8, 8)
    head = f"POST /api/images HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session: {token}\r\nContent-Length: {len(data) + 500}"
    answer = _raw(srv, head.encode() + b"\r\n\r\n", data, close_write=True)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert f"the body ended after {len(data)} of {len(data) + 500} bytes".encode() in answer
    assert len(app._photos) == n


def test_silent_client_times_out(served, token, monkeypatch):
    monkeypatch.setattr(Handler, "timeout", 0.5)
    head = f"POST /api/images HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session: {token}\r\nContent-Length: 1000\r\n\r\n"
    t0 = time.monotonic()
    answer = _raw(served[0], head.encode(), b"\x89PNG", close_write=False)
    assert answer.startswith(b"HTTP/1.1 408") and b"of 1000 bytes (timeout)" in answer
    assert time.monotonic() - t0 < 10


def test_silent_client_without_headers_is_dropped(served, monkeypatch):
    monkeypatch.setattr(Handler, "timeout", 0.5)
    t0 = time.monotonic()
    assert _raw(served[0], b"POST /api/images HTTP/1.1\r\n", b"", close_write=False) == b""
    assert time.monotonic() - t0 < 10


def test_concurrent_decodes_are_capped(served, token, monkeypatch):
    srv, app = served
    monkeypatch.setattr(app_module, "BUSY_WAIT_S", 0.2)
    assert app._decode_slots.acquire(timeout=5)  # another upload is being decoded (max_decodes=1)
    try:
        status, body = call(srv, "POST", "/api/images", png(8, 8), {"X-Session": token})
    finally:
        app._decode_slots.release()
    assert status == 503 and "busy" in json.loads(body)["error"]
    assert call(srv, "POST", "/api/images", png(8, 8), {"X-Session": token})[0] == 200
