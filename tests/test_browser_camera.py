"""Live tracking from the camera in the static site (``sam2edge web``), in headless Debian chromium.

Chromium's fake camera plays a clip the test writes (skimage's astronaut under a drifting window, as Y4M) and
loops it. The page encodes every frame it processes and runs the video graphs with tracker.js; it keeps the
pixels of the frames it processed (``?keep=frames``: frames the model could not keep up with are dropped and
counted, never queued), its masks, and its tracker calls. The same calls on the same frames, replayed on
``Sam2VideoPredictor.from_export`` (the same bundle, in Python), must give the same masks (IoU >= 0.999 per
object and frame). Bad input: camera permission denied, a camera that stops, a bundle without video graphs, a
tampered video graph: one message in the page, no uncaught error, the page stays usable.
"""

from __future__ import annotations

import base64
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sam2edge.checks.fidelity import mask_iou
from sam2edge.cli.main import main
from sam2edge.runtime.video.predictor import Sam2VideoPredictor
from tests.pages import add_page_prompt, tampered_copy
from tests.test_browser_site import static_server

TIMEOUT_MS = 180_000
LIVE = "window.sam2edge.live"
END_TRACK = "document.getElementById('live-video').srcObject.getVideoTracks()[0].dispatchEvent(new Event('ended'))"
SIZE, FRAMES = (256, 192), 8  # fake camera (W, H), clip frames (the camera loops them)


def write_y4m(path: Path, frames: list[np.ndarray], fps: int = 30) -> None:
    """HxWx3 uint8 RGB frames -> a YUV4MPEG2 file (4:2:0, BT.601 full range), Chromium's fake-camera format."""
    h, w = frames[0].shape[:2]
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for rgb in frames:
            r, g, b = (rgb[..., i].astype(np.float32) for i in range(3))
            y = 0.299 * r + 0.587 * g + 0.114 * b
            u = (b - y) * 0.564 + 128
            v = (r - y) * 0.713 + 128
            sub = lambda p: p.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))  # noqa: E731  2x2 chroma average
            f.write(b"FRAME\n")
            for plane in (y, sub(u), sub(v)):
                f.write(np.clip(np.rint(plane), 0, 255).astype(np.uint8).tobytes())


def drifting_frames(n: int, size: tuple[int, int], step: int = 6, scale: int = 1) -> list[np.ndarray]:
    """A (W, H) window drifting right and down across skimage's astronaut (512 px, enlarged ``scale`` times)."""
    from skimage import data

    photo, (w, h) = data.astronaut(), size
    if scale > 1:
        photo = np.asarray(Image.fromarray(photo).resize((512 * scale, 512 * scale)))
    frames = [np.ascontiguousarray(photo[10 + step * i // 2 :][:h, 20 + step * i :][:, :w]) for i in range(n)]
    assert all(f.shape[:2] == (h, w) for f in frames), "the window leaves the photo; use a smaller step or size"
    return frames


def camera_args(clip: Path | None) -> list[str]:
    """Chromium flags: quiet, no GPU (wasm), and the fake camera playing ``clip`` (None: no camera at all)."""
    from sam2edge.serve.chromium import QUIET_FLAGS

    fake = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-video-capture={clip}"] if clip else []
    return [*QUIET_FLAGS, "--disable-gpu", "--autoplay-policy=no-user-gesture-required", *fake]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("camera") / "clip.y4m"
    write_y4m(path, drifting_frames(FRAMES, SIZE))
    return path


@pytest.fixture(scope="module")
def clip_webm(tmp_path_factory) -> Path:
    """The same drifting window as a VP9 WebM file (what a user opens with "Open video")."""
    from sam2edge.runtime.video.io import close_writer, open_writer, write_frame

    path = tmp_path_factory.mktemp("video") / "clip.webm"
    container, stream = open_writer(path, ".webm", *SIZE, 4)  # 2 s
    for f in drifting_frames(FRAMES, SIZE):
        write_frame(container, stream, f)
    close_writer(container, stream)
    return path


@pytest.fixture(scope="module")
def cam_browser(clip):
    from playwright.sync_api import sync_playwright

    from sam2edge.serve.chromium import chromium_path

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(chromium_path()), headless=True, args=camera_args(clip))
        yield b
        b.close()


@pytest.fixture(scope="module", params=["sam2.1", "edgetam", pytest.param("edgetam-512", marks=pytest.mark.slow)])
def bundle(request, video_bundle_dir, edgetam_video_bundle_dir) -> Path:
    """A test-small LiteRT ``--video`` bundle of each model family (EdgeTAM's memory slots are perceiver tokens);
    under ``-m slow`` also full-size EdgeTAM at 512 px."""
    if request.param == "edgetam-512":
        return request.getfixturevalue("edgetam_full_512")
    return (video_bundle_dir if request.param == "sam2.1" else edgetam_video_bundle_dir)("litert")


@pytest.fixture(scope="module")
def edgetam_full_512(tmp_path_factory) -> Path:
    """Full-size EdgeTAM (RepViT-M1, 256 + 256 latents) at 512 px, perturbed synthetic weights with the
    object-score head lifted, exported as a LiteRT fp32 ``--video`` bundle (minutes)."""
    from sam2edge.config import get_config, get_video_config
    from sam2edge.export.pipeline import run_export
    from sam2edge.weights.video import synthetic_video_state_dict

    sd = synthetic_video_state_dict(get_config("edgetam").at_resolution(512), get_video_config("edgetam", 512), seed=3)
    sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += 10.0
    out = tmp_path_factory.mktemp("edgetam512") / "bundle"
    source = {"checkpoint": "synthetic edgetam", "format": "meta", "sha256": None}
    run_export(
        "litert", "edgetam", "fp32", out, resolution=512, weights=(sd, source), clicks=4, video=True,
        options={"batch": 0},
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def site(bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    assert main(["web", str(bundle), "--out", str(out)]) == 0
    return out


def open_live(browser, folder: Path, camera: bool, query: str = "accel=wasm&keep=frames"):
    """The site in a new context (camera permission granted or not) -> (server, context, page, logs)."""
    srv = static_server(folder, isolate=True)
    ctx = browser.new_context(viewport={"width": 1000, "height": 800}, permissions=["camera"] if camera else [])
    page = ctx.new_page()
    logs: list[str] = []
    page.on("console", lambda m: logs.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
    page.goto(f"http://127.0.0.1:{srv.server_address[1]}/?{query}")
    page.wait_for_function("window.sam2edge && (window.sam2edge.ready || window.sam2edge.error)", timeout=TIMEOUT_MS)
    assert page.evaluate("window.sam2edge.ready"), page.inner_text("#status")
    return srv, ctx, page, logs


def _site_px(site: Path) -> int:
    return __import__("json").loads((site / "config.json").read_text())["resolution"]


def uncaught(logs: list[str]) -> list[str]:
    """Page errors and unhandled rejections (LiteRT.js prints INFO lines through console.error: not these)."""
    return [m for m in logs if m.startswith("pageerror") or "Uncaught" in m or "Unhandled" in m]


def _wait_processed(page, n: int) -> None:
    page.wait_for_function(f"window.sam2edge.live.processed >= {n} || window.sam2edge.live.error", timeout=TIMEOUT_MS)


def _xy(page, x: float, y: float) -> tuple[float, float]:
    r = page.locator("#live-layer").bounding_box()
    return r["x"] + (x + 0.5) * r["width"] / SIZE[0], r["y"] + (y + 0.5) * r["height"] / SIZE[1]


def _replay(bundle: Path, frames: list[np.ndarray], calls: list[dict], max_ptrs: int) -> dict[int, np.ndarray]:
    """The page's calls on Sam2VideoPredictor.from_export over the frames it processed -> frame -> (objects, H, W)
    masks as the page showed them (a frame's last answer). The live stream has no end: the frames are padded so
    that, as on the page, no pointer's temporal position is scaled by a short clip's length."""
    pred = Sam2VideoPredictor.from_export(bundle)
    padded = frames + [frames[-1]] * max_ptrs  # never encoded: tracking stops at the last processed frame
    state = pred.init_state(padded)
    shown: dict[int, np.ndarray] = {}
    for c in calls:
        if c["op"] == "track":
            for f, _, masks in pred.propagate_in_video(state, start_frame_idx=c["frame"], max_frame_num_to_track=0):
                shown[f] = (masks[:, 0] > 0).numpy()
        else:
            f, mask = add_page_prompt(pred, state, c)
            shown[f] = mask
    return shown


def test_camera_tracking_equals_python(cam_browser, site, bundle, clip_webm, tmp_path):
    srv, ctx, page, logs = open_live(cam_browser, site, camera=True)
    w, h = SIZE
    try:
        page.click("#camera")
        _wait_processed(page, 2)
        assert page.is_visible("#live-layer") and page.inner_text("#resolution") == f"{_site_px(site)} px"
        page.click("#record")
        page.mouse.click(*_xy(page, 0.55 * w, 0.35 * h))  # object 1: a point
        page.wait_for_function("window.sam2edge.live.calls.some((c) => c.op === 'add')", timeout=TIMEOUT_MS)
        n = page.evaluate("window.sam2edge.live.processed")
        _wait_processed(page, n + 2)
        page.click("#new-object")
        x0, y0, x1, y1 = (*_xy(page, 0.05 * w, 0.5 * h), *_xy(page, 0.45 * w, 0.95 * h))
        page.mouse.move(x0, y0)
        page.mouse.down()
        page.mouse.move(x1, y1, steps=5)
        page.mouse.up()  # object 2: a box
        page.wait_for_function("window.sam2edge.live.calls.filter((c) => c.op === 'add').length >= 2")
        n = page.evaluate("window.sam2edge.live.processed")
        _wait_processed(page, n + 3)
        page.click("#record")  # stop recording: WebM + zip of mask PNGs
        page.wait_for_function("window.sam2edge.live.recording !== null", timeout=TIMEOUT_MS)
        # a camera that stops (the track ends): one message, the page stays usable
        page.evaluate(
            "document.getElementById('live-video').srcObject.getVideoTracks()[0].dispatchEvent(ENDED)".replace(
                "ENDED", "new Event('ended')"
            )
        )
        page.wait_for_function("!window.sam2edge.live.running")
        assert "the camera stopped" in page.inner_text("#status")
        stats = page.inner_text("#live-stats")
        live = page.evaluate(
            "(() => { const l = window.sam2edge.live; return {processed: l.processed, presented: l.presented, "
            "dropped: l.dropped, calls: l.calls, kept: l.kept.map((k) => [k.frame, k.lows.length]), "
            "rec: l.recording.frames, webm: l.recording.webmBytes} })()"
        )
        frames = [
            np.frombuffer(base64.b64decode(page.evaluate(f"window.sam2edge.live.frameB64({i})")), np.uint8).reshape(
                h, w, 3
            )
            for i in range(len(live["kept"]))
        ]
        got = {
            f: np.stack(
                [
                    np.frombuffer(base64.b64decode(page.evaluate(f"window.sam2edge.live.maskB64({f}, {o})")), np.uint8)
                    for o in range(n_obj)
                ]
            ).reshape(n_obj, h, w)
            > 0
            for f, n_obj in live["kept"]
            if n_obj
        }
        labels = {
            f: np.frombuffer(base64.b64decode(page.evaluate(f"window.sam2edge.live.labelsB64({f})")), np.uint8)
            for f, _ in live["kept"]
        }
        archive = zipfile.ZipFile(io.BytesIO(base64.b64decode(page.evaluate("window.sam2edge.live.zipB64()"))))
        # a video file instead of the camera: decoded by the page's <video> element, tracked the same way
        page.set_input_files("#video-file", str(clip_webm))
        page.wait_for_function("window.sam2edge.live.source === 'clip' && window.sam2edge.live.processed >= 1")
        page.mouse.click(*_xy(page, 0.55 * w, 0.35 * h))
        page.wait_for_function(f"{LIVE}.calls.some((c) => c.op === 'track') || !{LIVE}.running")
        assert not page.evaluate("document.getElementById('status').classList.contains('error')"), page.inner_text(
            "#status"
        )
        page.screenshot(path=str(tmp_path / "camera.png"))
        assert not uncaught(logs), logs
    finally:
        ctx.close()
        srv.shutdown()
    assert f"processed {live['processed']}" in stats and "FPS" in stats and "encoder" in stats
    assert [k[0] for k in live["kept"]] == list(range(live["processed"]))
    assert live["dropped"] == live["presented"] - live["processed"] >= 0
    assert len({f.tobytes() for f in frames}) >= 3, "the fake camera's frames did not change"
    # the recording: a WebM, and one PNG label map per recorded frame equal to the page's
    assert live["webm"] > 0 and live["rec"] == len(archive.namelist()) >= 3
    name = archive.namelist()[-1]
    png = np.asarray(Image.open(io.BytesIO(archive.read(name))))[..., 0]
    assert np.array_equal(png.ravel(), labels[int(name[6:12])])
    cfg = __import__("json").loads((site / "config.json").read_text())
    want = _replay(bundle, frames, live["calls"], cfg["tracker"]["config"]["max_obj_ptrs"])
    assert sorted(want) == sorted(got)
    present = 0
    for f in got:
        assert got[f].shape == want[f].shape, (f, got[f].shape, want[f].shape)
        for o, (a, b) in enumerate(zip(got[f], want[f])):
            present += bool(0.005 < b.mean() < 0.995)
            assert mask_iou(a, b) >= 0.999, (f, o, mask_iou(a, b), a.sum(), b.sum())
    assert present >= 6, present  # objects really tracked, not empty (or full) on both sides


def test_camera_denied_and_bad_bundles(cam_browser, site, small_bundle, tmp_path):
    srv, ctx, page, logs = open_live(cam_browser, site, camera=False)  # permission not granted: denied
    try:
        page.click("#camera")
        page.wait_for_function("document.getElementById('status').classList.contains('error')", timeout=TIMEOUT_MS)
        assert "camera permission denied" in page.inner_text("#status")
        assert not page.evaluate("window.sam2edge.live.running") and page.is_enabled("#camera")
        assert not uncaught(logs), logs
    finally:
        ctx.close()
        srv.shutdown()
    bad = tampered_copy(site, tmp_path / "bad", "memory_attention.tflite")
    srv, ctx, page, logs = open_live(cam_browser, bad, camera=True)  # photos work; tracking refuses the file
    try:
        page.click("#camera")
        page.wait_for_function("document.getElementById('status').classList.contains('error')", timeout=TIMEOUT_MS)
        status = page.inner_text("#status")
        assert "memory_attention.tflite fails its SHA-256 check" in status, status
        assert page.evaluate("window.sam2edge.ready") and not uncaught(logs), logs
    finally:
        ctx.close()
        srv.shutdown()
    plain = tmp_path / "plain"
    assert main(["web", str(small_bundle("litert")), "--out", str(plain)]) == 0
    srv, ctx, page, logs = open_live(cam_browser, plain, camera=True)  # a bundle without video graphs
    try:
        page.click("#camera")
        page.wait_for_function("document.getElementById('status').classList.contains('error')", timeout=TIMEOUT_MS)
        assert "--video" in page.inner_text("#status")
        assert page.evaluate("window.sam2edge.ready") and not uncaught(logs), logs
    finally:
        ctx.close()
        srv.shutdown()


@pytest.fixture(scope="module")
def small_video_128(tmp_path_factory, video_checkpoint) -> Path:
    """The test-small ``--video`` LiteRT bundle of ``video_checkpoint`` at 128 px (``video_bundle_dir`` is 256)."""
    from once import built_once

    from sam2edge.export.pipeline import run_export

    def build(out: Path) -> None:
        run_export(
            "litert", "test-small", "fp32", out, resolution=128, checkpoint=str(video_checkpoint), clicks=4,
            video=True, options={"batch": 0},
        )  # fmt: skip

    return built_once(tmp_path_factory, "video-litert-128", build)


@pytest.mark.slow  # one more test-small --video export (128 px); move to CI once it has a measured runtime there
def test_site_of_two_resolutions_switches_model(cam_browser, video_bundle_dir, small_video_128, small_bundle, tmp_path):
    """`sam2edge web B256 B128`: both resolutions in one site (model/<px>/, one manifest); refused in one line for
    bundles of other weights or of one resolution twice. In the page the picker switches model while the camera
    runs: graphs reloaded, tracking reset (said on the page), and the masks after the switch equal
    Sam2VideoPredictor on the 128 px bundle."""
    b256 = video_bundle_dir("litert")
    for argv, why in (
        ([str(b256), str(small_bundle("litert"))], "same checkpoint"),
        ([str(b256), str(b256)], "two bundles are at 256 px"),
    ):
        assert main(["web", *argv, "--out", str(tmp_path / "refused")]) == 2
        assert not (tmp_path / "refused").exists(), why
    site = tmp_path / "site"
    assert main(["web", str(b256), str(small_video_128), "--out", str(site)]) == 0
    cfg = __import__("json").loads((site / "config.json").read_text())
    assert cfg["resolutions"] == [128, 256] and cfg["resolution"] == 256 and sorted(cfg["models"]) == ["128", "256"]
    assert cfg["models"]["128"]["tracker"]["graphs"]["memory-attention"]["url"].startswith("model/128/")
    assert (site / "model/128/memory_attention.tflite").is_file() and (site / "model/256/encoder.tflite").is_file()
    w, h = SIZE
    srv, ctx, page, logs = open_live(cam_browser, site, camera=True)
    try:
        assert page.is_visible("#resolution") and page.inner_text("#resolution").split() == ["128", "px", "256", "px"]
        page.click("#camera")
        _wait_processed(page, 1)
        page.mouse.click(*_xy(page, 0.55 * w, 0.35 * h))
        page.wait_for_function(f"{LIVE}.calls.some((c) => c.op === 'track')", timeout=TIMEOUT_MS)
        page.select_option("#resolution", "128")
        page.wait_for_function("document.body.dataset.resolution === '128'", timeout=TIMEOUT_MS)
        page.wait_for_function(f"{LIVE}.running && {LIVE}.processed >= 1", timeout=TIMEOUT_MS)
        status = page.inner_text("#status")
        assert "model resolution 128 px: graphs reloaded, tracking reset" in status, status
        assert page.evaluate(f"{LIVE}.calls.length") == 0  # a new tracker: no objects
        page.mouse.click(*_xy(page, 0.55 * w, 0.35 * h))
        page.wait_for_function(f"{LIVE}.calls.some((c) => c.op === 'track')", timeout=TIMEOUT_MS)
        n = page.evaluate(f"{LIVE}.processed")
        _wait_processed(page, n + 2)
        page.evaluate(f"{LIVE}.stop()")
        kept = f"{LIVE}.kept.map((k) => [k.frame, k.lows.length])"
        live = page.evaluate(f"(() => ({{calls: {LIVE}.calls, kept: {kept}}}))()")
        frames = [
            np.frombuffer(base64.b64decode(page.evaluate(f"{LIVE}.frameB64({i})")), np.uint8).reshape(h, w, 3)
            for i in range(len(live["kept"]))
        ]
        got = {
            f: np.frombuffer(base64.b64decode(page.evaluate(f"{LIVE}.maskB64({f}, 0)")), np.uint8).reshape(h, w) > 0
            for f, n_obj in live["kept"]
            if n_obj
        }
        assert not uncaught(logs), logs
    finally:
        ctx.close()
        srv.shutdown()
    want = _replay(small_video_128, frames, live["calls"], cfg["models"]["128"]["tracker"]["config"]["max_obj_ptrs"])
    assert len(got) >= 3 and set(got) <= set(want)
    for f in got:
        assert want[f].shape == (1, h, w) and mask_iou(got[f], want[f][0]) >= 0.999, (f, mask_iou(got[f], want[f][0]))
    assert any(0.005 < want[f][0].mean() < 0.995 for f in got)  # the object is really tracked
