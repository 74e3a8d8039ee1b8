"""`sam2edge web`: the static site in headless Debian chromium, served like `python -m http.server`.

Every model stage runs in the page (encoder too); the mask after a tap must equal the Python predictor's on the
same bundle (IoU >= 0.99). With the COOP/COEP headers LiteRT.js runs threaded wasm, without them the page says
it fell back to one thread; a model file whose SHA-256 differs from the manifest is refused with a message.
"""

from __future__ import annotations

import functools
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from sam2edge.checks.fidelity import mask_iou, photo, photo_path
from sam2edge.cli.main import main
from sam2edge.runtime.predictor import Sam2Predictor
from tests.pages import tampered_copy

PHOTO = "chelsea.png"
TIMEOUT_MS = 120_000


class StaticHandler(SimpleHTTPRequestHandler):
    """`python -m http.server`, optionally with the two cross-origin isolation headers."""

    isolate = True
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm", ".js": "text/javascript"}

    def end_headers(self) -> None:
        if self.isolate:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def bundle(small_bundle) -> Path:
    return small_bundle("litert")


@pytest.fixture(scope="module")
def site(bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    assert main(["web", str(bundle), "--out", str(out)]) == 0
    return out


def static_server(folder: Path, isolate: bool):
    handler = type("H", (StaticHandler,), {"isolate": isolate})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def open_site(browser, folder: Path, isolate: bool):
    srv = static_server(folder, isolate)
    page = browser.new_page(viewport={"width": 1000, "height": 800})
    logs: list[str] = []
    page.on("console", lambda m: logs.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
    page.goto(f"http://127.0.0.1:{srv.server_address[1]}/?accel=wasm")
    page.wait_for_function("window.sam2edge && (window.sam2edge.ready || window.sam2edge.error)", timeout=TIMEOUT_MS)
    return srv, page, logs


def test_web_writes_site_and_refuses_user_folder(bundle, site, tmp_path, capsys):
    assert (site / "index.html").is_file() and (site / "vendor/@litertjs/core/wasm").is_dir()
    readme = (site / "README.md").read_text()
    assert "Cross-Origin-Opener-Policy: same-origin" in readme and "Cross-Origin-Embedder-Policy" in readme
    assert "single-threaded" in readme and "--video" in readme  # this bundle has no video graphs
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    assert main(["web", str(bundle), "--out", str(user)]) == 2
    assert "did not write" in capsys.readouterr().err
    assert [p.name for p in user.iterdir()] == ["notes.txt"] and (user / "notes.txt").read_text() == "keep me"
    again = tmp_path / "again"
    assert main(["web", str(bundle), "--out", str(again)]) == 0
    assert main(["web", str(bundle), "--out", str(again)]) == 0  # a site this command wrote is replaced
    (again / "model" / "mine.txt").write_text("keep me")  # ... unless it holds a file of the user's
    assert main(["web", str(bundle), "--out", str(again)]) == 2
    assert (again / "model" / "mine.txt").read_text() == "keep me"
    assert main(["web", str(tmp_path), "--out", str(tmp_path / "x")]) == 2  # not a bundle
    assert not (tmp_path / "x").exists()


def test_site_with_headers_tap_equals_python(browser, site, bundle):
    srv, page, logs = open_site(browser, site, isolate=True)
    try:
        assert page.evaluate("window.sam2edge.ready"), page.inner_text("#status")
        assert "threads" in page.inner_text("#runtime-status") and "single" not in page.inner_text("#runtime-status")
        assert "--video" in page.inner_text("#status")  # the bundle has no video graphs: said, photos still work
        page.set_input_files("#file", str(photo_path(PHOTO)))
        page.wait_for_function("window.sam2edge.image !== null && !window.sam2edge.busy", timeout=TIMEOUT_MS)
        assert "encoder (page)" in page.inner_text("#status")
        h, w = photo(PHOTO).shape[:2]
        r = page.locator("#mask-layer").bounding_box()
        x, y = 200, 140
        page.mouse.click(r["x"] + (x + 0.5) * r["width"] / w, r["y"] + (y + 0.5) * r["height"] / h)
        page.wait_for_function("window.sam2edge.decodes > 0", timeout=TIMEOUT_MS)
        got = np.array(page.evaluate("Array.from(window.sam2edge.lastMask)"), bool).reshape(h, w)
        pt = page.evaluate("window.sam2edge.image.points[0]")
        pred = Sam2Predictor.from_export(bundle)
        pred.set_image(photo(PHOTO))
        masks, iou, _ = pred.predict(np.array([[pt["x"], pt["y"]]], np.float32), np.array([1]), multimask_output=True)
        want = masks[int(np.argmax(iou))]
        assert 0.01 < want.mean() < 0.99
        assert mask_iou(got, want) >= 0.99, mask_iou(got, want)
        assert not [m for m in logs if m.startswith("pageerror")], logs
    finally:
        page.close()
        srv.shutdown()


def test_site_without_headers_and_tampered_file(browser, site, tmp_path):
    srv, page, logs = open_site(browser, site, isolate=False)
    try:
        assert page.evaluate("window.sam2edge.ready"), page.inner_text("#status")
        assert "single-threaded wasm" in page.inner_text("#runtime-status")
    finally:
        page.close()
        srv.shutdown()
    bad = tampered_copy(site, tmp_path / "bad", "decoder.tflite")
    srv, page, logs = open_site(browser, bad, isolate=True)
    try:
        assert not page.evaluate("window.sam2edge.ready")
        status = page.inner_text("#status")
        assert "decoder.tflite fails its SHA-256 check" in status and "refused" in status, status
        assert not [m for m in logs if m.startswith("pageerror")], logs
    finally:
        page.close()
        srv.shutdown()
    shutil.copyfile(site / "model/decoder.tflite", bad / "model/decoder.tflite")
    (bad / "model/gaussian.bin").unlink()  # a model file that fails to load
    srv, page, logs = open_site(browser, bad, isolate=True)
    try:
        status = page.inner_text("#status")
        assert "gaussian.bin failed to load (HTTP 404)" in status, status
        assert not [m for m in logs if m.startswith("pageerror")], logs
        assert page.locator("#file").is_enabled()  # the page stays usable
    finally:
        page.close()
        srv.shutdown()


def test_web_refuses_bundles_of_other_weights_or_one_resolution_twice(bundle, tmp_path, capsys):
    """Several bundles make one site only when they are one model's weights at distinct resolutions."""
    from sam2edge.bundle.card import sha256_bytes

    out = tmp_path / "site"
    assert main(["web", str(bundle), str(bundle), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pass one bundle per resolution" in err and len(err.strip().splitlines()) == 1
    other = tmp_path / "other"
    shutil.copytree(bundle, other)
    card = json.loads((other / "card.json").read_text())
    card["source"] = {**(card.get("source") or {}), "sha256": "0" * 64}  # another checkpoint
    (other / "card.json").write_text(json.dumps(card))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["files"]["card.json"] = {
        "sha256": sha256_bytes(other / "card.json"),
        "bytes": (other / "card.json").stat().st_size,
    }
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert main(["web", str(bundle), str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exported from the same checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / ".site.new").exists()
