"""The stdlib DevTools-pipe driver (sam2edge.serve.cdp) against Debian chromium: a plain page, then the static site.

It is what benchmarks/bench_browser_live.py uses (``--driver cdp``) on machines without playwright.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sam2edge.cli.main import main
from sam2edge.serve.cdp import CdpError, Chromium, static_server
from sam2edge.serve.chromium import QUIET_FLAGS, chromium_path

PAGE = """<!doctype html><title>t</title>
<button id="b" style="position:absolute;left:100px;top:50px;width:80px;height:40px"
  onclick="window.clicked = {gesture: navigator.userActivation.isActive, x: event.clientX, y: event.clientY}">b</button>
<script>console.log('hello', 3); window.later = new Promise((r) => setTimeout(() => r(7), 200));</script>"""


@pytest.fixture(scope="module")
def chromium():
    with Chromium(chromium_path(), [*QUIET_FLAGS, "--disable-gpu"]) as b:
        yield b


def test_cdp_page_evaluate_click_console(chromium, tmp_path):
    (tmp_path / "index.html").write_text(PAGE)
    srv = static_server(tmp_path, isolate=True)
    try:
        page = chromium.new_page(width=640, height=480, init_script="window.early = 1")
        page.goto(f"http://127.0.0.1:{srv.server_address[1]}/")
        assert chromium.version().startswith(("Chrome/", "HeadlessChrome/"))
        assert page.evaluate("window.later") == 7  # promises are awaited
        assert page.evaluate("[window.early, innerWidth, innerHeight, crossOriginIsolated]") == [1, 640, 480, True]
        assert page.box("#b") == {"x": 100, "y": 50, "width": 80, "height": 40}
        page.click_selector("#b")
        assert page.wait_for("window.clicked", 5) == {"gesture": True, "x": 140, "y": 70}  # a real user gesture
        assert "log: hello 3" in page.console()
        assert page.screenshot()[:8] == b"\x89PNG\r\n\x1a\n"
        with pytest.raises(CdpError, match="boom"):
            page.evaluate("(() => { throw new Error('boom'); })()")
        with pytest.raises(CdpError, match="waited"):
            page.wait_for("window.never", 0.3)
    finally:
        srv.shutdown()


@pytest.mark.slow  # exports a test-small bundle when no other test did (minutes on 2 busy cores)
def test_cdp_drives_static_site_on_wasm(chromium, small_bundle, tmp_path):
    site = tmp_path / "site"
    assert main(["web", str(small_bundle("litert")), "--out", str(site)]) == 0
    srv = static_server(site, isolate=True)
    try:
        page = chromium.new_page()
        page.goto(f"http://127.0.0.1:{srv.server_address[1]}/?accel=wasm")
        page.wait_for("window.sam2edge && (window.sam2edge.ready || window.sam2edge.error)", 120)
        assert page.evaluate("window.sam2edge.ready") is True
        runtime = page.evaluate("document.getElementById('runtime-status').innerText")
        assert "wasm with" in runtime and "threads" in runtime  # COOP/COEP served: threaded wasm
    finally:
        srv.shutdown()


def test_cdp_browser_that_cannot_start(tmp_path):
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\necho no GPU here >&2\nexit 3\n")
    fake.chmod(0o755)
    b = Chromium(Path(fake), [])
    with pytest.raises(CdpError, match="exited.*no GPU here"):
        b.send("Browser.getVersion", timeout=20)
    b.close()
