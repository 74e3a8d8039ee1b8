"""In headless Debian chromium (Python playwright, /usr/bin/chromium): the tap-to-segment page and the sweep.

End to end: the page opens a real photo through the file picker, the exported LiteRT encoder runs on it in the
browser and a tap / a dragged box runs the decoder there (LiteRT.js), and the mask drawn on the page's mask layer
must equal the Python predictor's mask for the same prompt and the same bundle (IoU >= 0.99); with
``?encode=server`` (and ``?decoder=server``) the server's encoder (and decoder) run instead, as the page says.
Chromium missing is a failure, not a skip: CI installs it (scripts/setup.sh).
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from sam2edge.checks.fidelity import mask_iou, photo, photo_path
from sam2edge.config import TEST_SMALL
from sam2edge.runtime.backends.litert import CPU_ONLY_FILES
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.serve.app import App
from sam2edge.serve.assets import browser_decoder, browser_encoder, litertjs_version
from sam2edge.serve.sweep import SweepConfig, sweep_bundle
from tests.pages import open_ready_page

PHOTO = "chelsea.png"
TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def bundle(small_bundle) -> Path:
    """The session's TEST_SMALL fp32 LiteRT bundle from the real exporter (conftest ``small_bundle``, shared with
    tests/test_litert.py and tests/test_everything.py; read only here)."""
    return small_bundle("litert")


@pytest.fixture(scope="module")
def predictor(bundle) -> Sam2Predictor:
    return Sam2Predictor.from_export(bundle)


@pytest.fixture(scope="module")
def server(bundle, predictor):
    decoder, note = browser_decoder(bundle)
    assert decoder is not None, note
    app = App(predictor.backend, decoder, note, provenance=predictor.provenance)
    app.encoder, app.encoder_note = browser_encoder(bundle)
    assert app.encoder is not None, app.encoder_note
    srv = app.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def open_page(browser, server, query: str):
    url = f"http://127.0.0.1:{server.server_address[1]}/{query}"
    page, logs = open_ready_page(browser, url, {"width": 1100, "height": 900}, TIMEOUT_MS)
    page.set_input_files("#file", str(photo_path(PHOTO)))
    page.wait_for_function("window.sam2edge.image !== null && !window.sam2edge.busy", timeout=TIMEOUT_MS)
    return page, logs


def decodes(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.decodes || 0)"))


def wait_decode(page, before: int) -> None:
    page.wait_for_function(f"Number(document.body.dataset.decodes || 0) > {before}", timeout=TIMEOUT_MS)
    err = page.evaluate("document.getElementById('status').classList.contains('error')")
    assert not err, page.inner_text("#status")


def drawn_mask(page) -> np.ndarray:
    """The mask layer's pixels as drawn (alpha > 0 = object), HxW bool."""
    b64, w, h = page.evaluate("""() => { const c = document.getElementById('mask-layer');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const bits = new Uint8Array(c.width * c.height); for (let i = 0; i < bits.length; i++) bits[i] = d[4*i+3] > 0;
        let s = '';
        for (let i = 0; i < bits.length; i += 4096) s += String.fromCharCode.apply(null, bits.subarray(i, i + 4096));
        return [btoa(s), c.width, c.height]; }""")
    return np.frombuffer(base64.b64decode(b64), np.uint8).reshape(h, w).astype(bool)


def client_xy(page, x: float, y: float) -> tuple[float, float]:
    """Photo pixel (x, y) -> viewport position on the prompt layer."""
    r = page.locator("#prompt-layer").bounding_box()
    h, w = photo(PHOTO).shape[:2]
    return r["x"] + (x + 0.5) * r["width"] / w, r["y"] + (y + 0.5) * r["height"] / h


def reference_mask(predictor, points=None, labels=None, box=None, multimask=True) -> np.ndarray:
    predictor.set_image(photo(PHOTO))
    masks, iou, _ = predictor.predict(point_coords=points, point_labels=labels, box=box, multimask_output=multimask)
    return masks[int(np.argmax(iou))] if multimask else masks[0]


@pytest.mark.parametrize("accel", ["wasm", "webgpu"])
def test_tap_mask_equals_python_predictor(browser, server, predictor, accel, tmp_path):
    page, logs = open_page(browser, server, f"?accel={accel}")
    try:
        status = page.inner_text("#decoder-status")
        assert "in this browser" in status and accel in status, status
        video = page.inner_text("#video-status")  # this bundle has no video graphs: said once, nothing else
        assert "no tracking here" in video and "--video" in video, video
        encoder = page.inner_text("#encoder-status")
        assert "encoder: in this browser" in encoder, encoder
        assert page.evaluate("window.sam2edge.lastEncode.where") == "browser"
        n = decodes(page)
        page.mouse.click(*client_xy(page, 200, 140))
        wait_decode(page, n)
        pts = page.evaluate("window.sam2edge.points")
        assert len(pts) == 1 and pts[0]["label"] == 1
        got = drawn_mask(page)
        want = reference_mask(predictor, np.array([[pts[0]["x"], pts[0]["y"]]], np.float32), np.array([1]))
        assert got.shape == want.shape and 0.01 < want.mean() < 0.99
        assert mask_iou(got, want) >= 0.99, (mask_iou(got, want), logs[-5:])
        # a background point (right click) refines it: single-mask answer, as the predictor's
        n = decodes(page)
        page.mouse.click(*client_xy(page, 330, 60), button="right")
        wait_decode(page, n)
        pts = page.evaluate("window.sam2edge.points")
        assert [p["label"] for p in pts] == [1, 0]
        want = reference_mask(
            predictor, np.array([[p["x"], p["y"]] for p in pts], np.float32), np.array([1, 0]), multimask=False
        )
        assert mask_iou(drawn_mask(page), want) >= 0.99
        shot = tmp_path / f"serve_tap_{accel}.png"
        page.screenshot(path=str(shot))
        print(f"screenshot: {shot}")
        assert "ms" in page.inner_text("#latency")
    finally:
        page.close()


def test_box_mask_equals_python_predictor(browser, server, predictor, tmp_path):
    """The server's encoder (?encode=server), the decoder in the page."""
    page, logs = open_page(browser, server, "?accel=wasm&encode=server")
    try:
        assert "encoder: on the server (fallback: forced by ?encode=server)" in page.inner_text("#encoder-status")
        assert page.evaluate("window.sam2edge.lastEncode.where") == "server"
        n = decodes(page)
        x0, y0 = client_xy(page, 90, 40)
        x1, y1 = client_xy(page, 380, 290)
        page.mouse.move(x0, y0)
        page.mouse.down()
        page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=4)
        page.mouse.move(x1, y1, steps=4)
        page.mouse.up()
        wait_decode(page, n)
        b = page.evaluate("window.sam2edge.box")
        assert b is not None and page.evaluate("window.sam2edge.points.length") == 0
        box = np.array([b["x0"], b["y0"], b["x1"], b["y1"]], np.float32)
        want = reference_mask(predictor, box=box, multimask=False)
        got = drawn_mask(page)
        assert 0.01 < want.mean() < 0.99 and mask_iou(got, want) >= 0.99, mask_iou(got, want)
        shot = tmp_path / "serve_box.png"
        page.screenshot(path=str(shot))
        print(f"screenshot: {shot}")
        # undo removes the box; clear leaves no mask
        n = decodes(page)
        page.click("#undo")
        wait_decode(page, n)
        assert page.evaluate("window.sam2edge.box") is None and not drawn_mask(page).any()
    finally:
        page.close()


def test_server_fallback_says_so_and_matches(browser, server, predictor):
    page, _ = open_page(browser, server, "?decoder=server")
    try:
        assert "on the server" in page.inner_text("#decoder-status")
        assert "encoder: on the server" in page.inner_text("#encoder-status")
        n = decodes(page)
        page.mouse.click(*client_xy(page, 200, 140))
        wait_decode(page, n)
        pts = page.evaluate("window.sam2edge.points")
        want = reference_mask(predictor, np.array([[pts[0]["x"], pts[0]["y"]]], np.float32), np.array([1]))
        assert mask_iou(drawn_mask(page), want) >= 0.99
    finally:
        page.close()


def test_segment_everything_button(browser, server, predictor):
    """The bundle has the batched decoder, so the page shows "Segment everything"; a click shows the server's
    overlay in place of the photo and the mask count of the Python generator on the same bundle and grid."""
    from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator

    page, _ = open_page(browser, server, "?everything_side=4")
    try:
        assert page.is_visible("#everything")
        plain = page.evaluate("document.getElementById('photo').src")
        page.click("#everything")
        page.wait_for_function("window.sam2edge.everything && !window.sam2edge.busy", timeout=TIMEOUT_MS)
        want = Sam2AutomaticMaskGenerator(predictor, points_per_side=4).generate(photo(PHOTO))
        assert page.evaluate("window.sam2edge.everything.masks") == len(want)
        assert page.evaluate("document.getElementById('photo').src") != plain
        assert "segment everything:" in page.inner_text("#status")
    finally:
        page.close()


def test_sweep_bundle_records(browser, bundle, tmp_path):
    """Every .tflite of the bundle on wasm vs ai-edge-litert CPU: pass, records in the documented layout."""
    paths = sweep_bundle(
        bundle,
        SweepConfig(backends=("wasm",), runs=2, warmup=1, timeout_s=240),
        progress=lambda m: None,
        out_root=tmp_path / "sweep",
        browser=browser,
    )
    gpu_facing = [f for f in bundle.glob("*.tflite") if f.name not in CPU_ONLY_FILES]  # the browser's graphs
    assert sorted(p.name for p in paths) == sorted(f"sam2.1-hiera-tiny__{f.stem}.json" for f in gpu_facing)
    for p in paths:
        assert p.parent.parent.name == litertjs_version()
        rec = json.loads(p.read_text())
        assert rec["provenance"] == "measured" and rec["environment"]["chromium"][:3].isdigit()
        (row,) = rec["results"]
        assert row["backend"] == "wasm_xnnpack" and row["status"] == "pass", row
        assert row["max_rel_diff"] < 1e-4 and row["latency_p50_ms"] > 0 and row["runs"] == 2


def test_sweep_classifies_partial_delegation(browser, tmp_path):
    """A graph with a rank-5 reshape is partly run on the CPU under WebGPU: status 'fallback', with the counts
    parsed from the console (isFullyAccelerated claims true); a clean graph passes fully delegated."""
    import litert_torch

    class Clean(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2.0 + 1.0).mean(dim=1, keepdim=True)

    class Rank5(torch.nn.Module):
        def forward(self, x):
            y = (x * 2.0 + 1.0).reshape(1, 2, 4, 8, 8) * 3.0
            return torch.relu(y.sum(dim=1))

    folder = tmp_path / "models"
    folder.mkdir()
    x = torch.randn(1, 8, 8, 8)
    for name, m in (("clean", Clean()), ("rank5", Rank5())):
        litert_torch.convert(m.eval(), (x,)).export(str(folder / f"{name}.tflite"))
    paths = sweep_bundle(
        folder,
        SweepConfig(backends=("wasm", "webgpu"), runs=2, warmup=1, timeout_s=240),
        progress=lambda m: None,
        out_root=tmp_path / "sweep",
        browser=browser,
    )
    rows = {json.loads(p.read_text())["file"]: json.loads(p.read_text())["results"] for p in paths}
    wasm, gpu = rows["clean.tflite"]
    assert wasm["status"] == "pass" and gpu["status"] == "pass" and gpu["full_delegation"] is True
    wasm, gpu = rows["rank5.tflite"]
    assert wasm["status"] == "pass" and wasm["full_delegation"] is None
    assert gpu["status"] == "fallback" and gpu["full_delegation"] is False, gpu
    assert gpu["delegation"]["cpu_ops"] > 0 and gpu["delegation"]["is_fully_accelerated_claim"] is True
    assert any("RESHAPE" in line for line in gpu["delegation"]["rejected_ops"])
    assert gpu["max_rel_diff"] < 1e-3


def test_js_port_matches_python(tmp_path):
    """sam.js (run by node) vs runtime.prompts.encode_points and the predictor's bilinear upsampling + threshold."""
    import shutil
    import subprocess

    import torch.nn.functional as F

    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.runtime.prompts import encode_points, prompt_tables
    from sam2edge.serve.assets import STATIC_DIR
    from sam2edge.weights import load_weights

    node = shutil.which("node")
    assert node, "node is missing (scripts/setup.sh needs Node.js for LiteRT.js)"
    sd, _ = load_weights(None, TEST_SMALL)
    model = build_sam2(TEST_SMALL, Rewrites())
    model.load_state_dict(sd)
    tables = prompt_tables(model)
    rng = np.random.default_rng(1)
    s, k = TEST_SMALL.image_size, 8
    coords = np.concatenate([rng.uniform(0, s, (5, 2)), np.zeros((1, 2))]).astype(np.float32)
    labels = [2, 3, 1, 0, 1, -1]
    low = rng.standard_normal((64, 64)).astype(np.float32)
    h, w = 300, 451
    shutil.copy(STATIC_DIR / "sam.js", tmp_path / "sam.mjs")
    inp = {
        "tables": {n: t.ravel().tolist() for n, t in tables.items()},
        "coords": coords.tolist(),
        "labels": labels,
        "low": low.ravel().tolist(),
        "s": s,
        "k": k,
        "h": h,
        "w": w,
    }
    (tmp_path / "in.json").write_text(json.dumps(inp))
    (tmp_path / "run.mjs").write_text("""
import { encodePoints, upsampleMask } from './sam.mjs';
import { readFileSync } from 'fs';
const i = JSON.parse(readFileSync(process.argv[2]));
const t = Object.fromEntries(Object.entries(i.tables).map(([n, v]) => [n, Float32Array.from(v)]));
const { tokens, valid } = encodePoints(i.coords, i.labels, t, i.s, i.k);
const mask = upsampleMask(Float32Array.from(i.low), 64, i.h, i.w);
console.log(JSON.stringify({ tokens: Array.from(tokens), valid: Array.from(valid), mask: Array.from(mask) }));
""")
    out = json.loads(
        subprocess.run(
            [node, str(tmp_path / "run.mjs"), str(tmp_path / "in.json")],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    want_tokens, want_valid = encode_points(coords, np.array(labels), tables, s, k)
    np.testing.assert_allclose(np.array(out["tokens"], np.float32).reshape(want_tokens.shape), want_tokens, atol=2e-6)
    np.testing.assert_array_equal(np.array(out["valid"], np.float32), want_valid[0])
    want_mask = F.interpolate(torch.from_numpy(low)[None, None], (h, w), mode="bilinear", align_corners=False)[0, 0] > 0
    got_mask = np.array(out["mask"], bool).reshape(h, w)
    assert (got_mask != want_mask.numpy()).sum() <= 2  # at most a pixel or two exactly at the threshold
