"""Tracking in the page (headless Debian chromium, Python playwright): ``serve`` with a LiteRT ``--video`` bundle.

End to end: the page uploads a real clip (skimage's astronaut, a drifting window, encoded as WebM), the server
decodes it and encodes each frame when the page asks; the memory attention, the video decoder and the memory
encoder run in the page (LiteRT.js) and ``static/tracker.js`` keeps the memory bank. The page logs every
tracker call; the same calls replayed on ``Sam2VideoPredictor.from_export`` (the same bundle, in Python) must
give the same masks on every frame (IoU >= 0.99 per object): two objects (a point, a box), forward and
backward passes, a correction and a second pass. tracker.js's host logic is also compared with the Python
host (``memory_bank.select_memory``, ``stable_single_mask``, ``fill_holes``) under node.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sam2edge.checks.fidelity import mask_iou
from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL, get_config, get_video_config
from sam2edge.runtime.video.io import close_writer, open_writer, write_frame
from sam2edge.runtime.video.masks import fill_holes, stable_single_mask
from sam2edge.runtime.video.memory_bank import FrameOutput, ObjectMemory, select_memory
from sam2edge.runtime.video.predictor import Sam2VideoPredictor
from sam2edge.serve.app import default_app_from_args
from sam2edge.serve.assets import STATIC_DIR
from tests.pages import add_page_prompt, open_ready_page
from tests.video_oracles import drifting_clip

TIMEOUT_MS = 180_000
FRAMES, SIZE = 6, (320, 240)  # clip frames, (W, H)


@pytest.fixture(scope="module")
def bundle(video_bundle_dir) -> Path:
    return video_bundle_dir("litert")


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """The drifting-window clip as a VP9 WebM file (what a user uploads)."""
    folder = tmp_path_factory.mktemp("clip")
    frames = drifting_clip(folder / "jpeg", FRAMES, SIZE)
    path = folder / "clip.webm"
    container, stream = open_writer(path, ".webm", *SIZE, 10)
    for f in frames:
        write_frame(container, stream, f)
    close_writer(container, stream)
    return path


@pytest.fixture(scope="module")
def edgetam_bundle(edgetam_video_bundle_dir) -> Path:
    """test-small-edgetam fp32 LiteRT ``--video`` (perturbed synthetic weights, objects kept present): memory slots
    of 32 perceiver tokens, key RoPE tables, the perceiver's latents as a host table."""
    return edgetam_video_bundle_dir("litert")


def _serve(bundle: Path):
    app = default_app_from_args(str(bundle), None, None)
    assert app.clips is not None, app.tracker_note
    srv = app.make_server("127.0.0.1", 0)
    srv.sam2edge_app = app  # the tests look at what the server loaded
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def server(bundle):
    srv = _serve(bundle)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def edgetam_server(edgetam_bundle):
    srv = _serve(edgetam_bundle)
    yield srv
    srv.shutdown()
    srv.server_close()


def _open_clip(browser, server, clip: Path, accel: str, encode: str = "page"):
    url = f"http://127.0.0.1:{server.server_address[1]}/?accel={accel}&encode={encode}"
    page, logs = open_ready_page(browser, url, {"width": 900, "height": 800}, TIMEOUT_MS)
    assert page.is_visible("#open-video")
    page.set_input_files("#video-file", str(clip))
    page.wait_for_function("window.sam2edge.video.tracker && !window.sam2edge.video.busy", timeout=TIMEOUT_MS)
    assert not page.evaluate("document.getElementById('status').classList.contains('error')"), logs[-5:]
    return page, logs


def _act(page, fn) -> None:
    """Run ``fn`` (a click, a drag) and wait until the page has finished the prompt or the tracking it started."""
    n = int(page.evaluate("Number(document.body.dataset.tracks || 0)"))
    fn()
    page.wait_for_function(f"Number(document.body.dataset.tracks || 0) > {n}", timeout=TIMEOUT_MS)
    assert not page.evaluate("document.getElementById('status').classList.contains('error')"), page.inner_text(
        "#status"
    )


def _xy(page, x: float, y: float) -> tuple[float, float]:
    """Video pixel -> viewport position on the prompt layer."""
    r = page.locator("#prompt-layer").bounding_box()
    return r["x"] + (x + 0.5) * r["width"] / SIZE[0], r["y"] + (y + 0.5) * r["height"] / SIZE[1]


SET_FRAME = "(f) => { const s = document.getElementById('frame'); s.value = f; s.dispatchEvent(new Event('input')) }"


def _goto(page, frame: int) -> None:
    page.evaluate(SET_FRAME, frame)
    page.wait_for_function(f"window.sam2edge.video.frame === {frame} && !window.sam2edge.video.busy")


def _page_masks(page, frame: int) -> np.ndarray:
    """Every object's mask on ``frame`` as the page holds it: (objects, H, W) bool."""
    n = page.evaluate(f"window.sam2edge.video.results.get({frame}).lows.length")
    masks = [page.evaluate(f"window.sam2edge.video.labelMapB64({frame}, {i})") for i in range(n)]
    return np.stack([np.frombuffer(base64.b64decode(m), np.uint8).reshape(SIZE[1], SIZE[0]) for m in masks]) > 0


def _replay(bundle: Path, clip: Path, calls: list[dict]) -> tuple[list[dict[int, np.ndarray]], np.ndarray]:
    """The page's tracker calls on Sam2VideoPredictor.from_export -> per page action, frame -> (objects, H, W)
    masks (objects in the order they were first prompted, as the page's); and the final low-res logits
    (frames, objects, side * side) of the memory bank."""
    pred = Sam2VideoPredictor.from_export(bundle)
    state = pred.init_state(str(clip))
    actions: list[dict[int, np.ndarray]] = []
    for i, c in enumerate(calls):
        if c["op"] == "add":
            f, mask = add_page_prompt(pred, state, c)
            actions.append({f: mask})
            continue
        if i == 0 or calls[i - 1]["op"] != "propagate":
            actions.append({})  # one "Track" press: its passes, the last output of each frame wins
        for f, _, masks in pred.propagate_in_video(state, reverse=c["reverse"]):
            actions[-1][f] = (masks[:, 0] > 0).numpy()
    final = [[m.lookup(f, True).pred_masks.ravel() for m in state.memory.values()] for f in range(state.num_frames)]
    return actions, np.array(final)


@pytest.mark.parametrize(
    ("model", "accel", "encode"),
    [("sam2.1", "wasm", "server"), ("sam2.1", "webgpu", "page"), ("edgetam", "wasm", "page")],
)
def test_tracking_in_the_page_equals_python(browser, request, clip, model, accel, encode, tmp_path):
    """SAM 2.1 (IoU >= 0.99 per frame and object) and EdgeTAM (perceiver memory slots, IoU >= 0.999); the frame
    encoder in the page, or the server's (?encode=server, the fallback)."""
    prefix = "edgetam_" if model == "edgetam" else ""
    server, bundle = request.getfixturevalue(prefix + "server"), request.getfixturevalue(prefix + "bundle")
    iou_min = 0.999 if model == "edgetam" else 0.99
    page, logs = _open_clip(browser, server, clip, accel, encode)
    want_status = "frame encoder here" if encode == "page" else "frame encoder on the server"
    assert want_status in page.inner_text("#status"), page.inner_text("#status")
    try:
        seen: list[dict[int, np.ndarray]] = []  # per page action, frame -> the page's label map
        w, h = SIZE
        _goto(page, 2)
        _act(page, lambda: page.mouse.click(*_xy(page, 0.6 * w, 0.3 * h)))  # object 1: a point
        seen.append({2: _page_masks(page, 2)})
        page.click("#new-object")
        x0, y0, x1, y1 = (*_xy(page, 0.05 * w, 0.5 * h), *_xy(page, 0.45 * w, 0.9 * h))

        def drag() -> None:
            page.mouse.move(x0, y0)
            page.mouse.down()
            page.mouse.move(x1, y1, steps=5)
            page.mouse.up()

        _act(page, drag)  # object 2: a box
        seen.append({2: _page_masks(page, 2)})
        _act(page, lambda: page.click("#track"))  # forwards from frame 2, then backwards to frame 0
        seen.append({f: _page_masks(page, f) for f in range(FRAMES)})
        page.select_option("#object", "1")
        _goto(page, 4)
        _act(page, lambda: page.mouse.click(*_xy(page, 0.2 * w, 0.2 * h), button="right"))  # a correction
        seen.append({4: _page_masks(page, 4)})
        _act(page, lambda: page.click("#track"))
        seen.append({f: _page_masks(page, f) for f in range(FRAMES)})
        shot = tmp_path / f"serve_track_{model}_{accel}.png"
        page.screenshot(path=str(shot))
        print(f"screenshot: {shot}")
        assert page.locator("#stage-times").is_visible()
        calls = page.evaluate("window.sam2edge.video.calls")
        lows = np.array(
            page.evaluate(
                f"[...Array({FRAMES}).keys()].map((f) => "
                "window.sam2edge.video.results.get(f).lows.map((a) => Array.from(a)))"
            )
        )
    finally:
        page.close()
    assert [c["op"] for c in calls] == ["add", "add", "propagate", "propagate", "add", "propagate", "propagate"]
    # the server never loads the video graphs the page runs; with the encoder in the page it encodes no frame
    app = server.sam2edge_app
    assert app.clips.predictor.backend.run.loaded() == ()
    encoded_here = list(list(app.clips._clips.values())[-1].state.cache)  # this test's clip (the newest)
    assert (encoded_here == []) == (encode == "page"), encoded_here
    want, want_lows = _replay(bundle, clip, calls)
    scale = np.abs(want_lows).max()
    print(
        f"{model} {accel}: low-res logits max |page - python| {np.abs(lows - want_lows).max():.3g} (scale {scale:.3g})"
    )
    assert np.abs(lows - want_lows).max() <= 1e-4 * scale, (np.abs(lows - want_lows).max(), scale)
    assert [sorted(a) for a in want] == [sorted(a) for a in seen]
    present = 0
    for action, (got_maps, want_maps) in enumerate(zip(seen, want)):
        for f in got_maps:
            assert got_maps[f].shape == want_maps[f].shape
            for obj, (got, ref) in enumerate(zip(got_maps[f], want_maps[f])):
                present += bool(0.005 < ref.mean() < 0.995)
                assert mask_iou(got, ref) >= iou_min, (action, f, obj, mask_iou(got, ref), got.sum(), ref.sum())
    assert present >= 20  # both objects are really tracked on most frames, not empty (or full) on both sides


def test_a_video_graph_that_fails_to_load_is_one_message(browser, bundle, clip, tmp_path):
    """A video graph the page cannot load (damaged after the server opened the bundle): one line in the page naming
    the file and the fix, nothing uncaught; the page stays usable (a photo opens and a tap decodes)."""
    folder = tmp_path / "bundle"
    shutil.copytree(bundle, folder)
    srv = _serve(folder)
    try:
        (folder / "memory_attention.tflite").write_bytes(b"not a flatbuffer" * 64)
        url = f"http://127.0.0.1:{srv.server_address[1]}/?accel=wasm"
        page, logs = open_ready_page(browser, url, {"width": 900, "height": 800}, TIMEOUT_MS)
        try:
            page.set_input_files("#video-file", str(clip))
            page.wait_for_function("document.getElementById('status').classList.contains('error')", timeout=TIMEOUT_MS)
            status = page.inner_text("#status")
            assert "memory_attention.tflite failed to load" in status and "re-export" in status, status
            assert "\n" not in status
            page.select_option("#sample", "chelsea.png")
            page.wait_for_function("window.sam2edge.image !== null && !window.sam2edge.busy", timeout=TIMEOUT_MS)
            n = int(page.evaluate("Number(document.body.dataset.decodes || 0)"))
            r = page.locator("#prompt-layer").bounding_box()
            page.mouse.click(r["x"] + 0.5 * r["width"], r["y"] + 0.4 * r["height"])
            page.wait_for_function(f"Number(document.body.dataset.decodes || 0) > {n}", timeout=TIMEOUT_MS)
            assert not page.evaluate("document.getElementById('status').classList.contains('error')")
            assert page.evaluate("window.sam2edge.mask !== null")
        finally:
            page.close()
        assert not [line for line in logs if line.startswith("pageerror")], logs
    finally:
        srv.shutdown()
        srv.server_close()


def _post(server, path: str, body: bytes, session: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{server.url}{path}", data=body, headers={"X-Session": session}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_video_upload_refusals(server, clip):
    _, sess = _post(server, "/api/session", b"", "")
    token = sess["session"]
    status, body = _post(server, "/api/videos", b"not a video at all", token)
    assert status == 415 and "valid .mp4/.webm/.mov" in body["error"] and "\n" not in body["error"]
    status, body = _post(server, "/api/videos", b"", token)
    assert status == 400 and "empty" in body["error"]
    status, body = _post(server, "/api/videos", clip.read_bytes(), "no-such-session")
    assert status == 401
    status, ok = _post(server, "/api/videos", clip.read_bytes(), token)
    assert status == 200 and ok["num_frames"] == FRAMES and (ok["width"], ok["height"]) == SIZE
    req = urllib.request.Request(f"{server.url}/api/videos/{ok['id']}/features/{FRAMES}", headers={"X-Session": token})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 404 and f"0..{FRAMES - 1}" in json.loads(e.value.read())["error"]


# ---- tracker.js's host logic vs the Python host (node) ---------------------------------------------------------
def _memory_case(rng, num_frames: int, dense: bool, cfg=TEST_SMALL, vcfg=VIDEO_TEST_SMALL) -> tuple[ObjectMemory, dict]:
    """A memory bank with random conditioning / tracked frames (``dense``: every frame has an output, so the
    slots overflow), as numpy and as JSON for node; memory frames of ``vcfg``'s shape (EdgeTAM: N x M tokens)."""
    e, c = cfg.image_embedding_size, cfg.d_model
    mem, js = ObjectMemory(), {"cond": [], "nonCond": []}
    frames = rng.permutation(num_frames)
    n_cond = int(rng.integers(1, min(5, num_frames + 1)))
    n_out = num_frames if dense else n_cond + int(rng.integers(0, num_frames - n_cond + 1))
    for i, f in enumerate(frames[:n_out]):
        out = FrameOutput(
            np.zeros((1, 1, 4 * e, 4 * e), np.float32),
            rng.standard_normal((1, c)).astype(np.float32),
            np.zeros((1, 1), np.float32),
            rng.standard_normal((1, *vcfg.memory_frame_shape(e))).astype(np.float32),
        )
        (mem.cond if i < n_cond else mem.non_cond)[int(f)] = out
        rec = {"frame": int(f), "objPtr": out.obj_ptr.ravel().tolist(), "maskmem": out.maskmem.ravel().tolist()}
        js["cond" if i < n_cond else "nonCond"].append(rec)
    return mem, js


def _run_node(tmp_path: Path, script: str, payload: dict) -> dict:
    node = shutil.which("node")
    assert node, "node is missing (scripts/setup.sh needs Node.js for LiteRT.js)"
    shutil.copy(STATIC_DIR / "tracker.js", tmp_path / "tracker.mjs")
    (tmp_path / "in.json").write_text(json.dumps(payload))
    (tmp_path / "run.mjs").write_text(script)
    done = subprocess.run(
        [node, str(tmp_path / "run.mjs"), str(tmp_path / "in.json")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


SELECT_JS = """
import { ObjectMemory, selectMemory } from './tracker.mjs';
import { readFileSync } from 'fs';
const { cases, v } = JSON.parse(readFileSync(process.argv[2]));
const out = cases.map((c) => {
  const mem = new ObjectMemory();
  const rec = (r) => ({ objPtr: Float32Array.from(r.objPtr), maskmem: Float32Array.from(r.maskmem) });
  for (const r of c.memory.cond) mem.cond.set(r.frame, rec(r));
  for (const r of c.memory.nonCond) mem.nonCond.set(r.frame, rec(r));
  const s = selectMemory(mem, c.frame, c.numFrames, v, c.reverse);
  const inputs = Object.fromEntries(Object.entries(s.inputs).map(([k, a]) => [k, Array.from(a)]));
  return { inputs, spatial: s.spatial, pointers: s.pointers, dropped: s.dropped };
});
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("config", ["test-small", "test-small-edgetam"])
def test_tracker_js_selects_memory_as_python(config, tmp_path):
    """selectMemory vs memory_bank.select_memory: random banks (more frames than slots included), both
    directions; every slot input, the frames chosen, the dropped count. EdgeTAM: slots of N perceiver tokens."""
    cfg, vcfg = get_config(config), get_video_config(config)
    rng = np.random.default_rng(5)
    cases, banks = [], []
    for i in range(24):
        num_frames = int(rng.integers(2, 30))
        mem, js = _memory_case(rng, num_frames, i % 3 == 0, cfg, vcfg)
        frame, reverse = int(rng.integers(0, num_frames)), bool(i % 2)
        cases.append({"memory": js, "frame": frame, "numFrames": num_frames, "reverse": reverse})
        banks.append((mem, frame, num_frames, reverse))
    e = cfg.image_embedding_size
    v = {"e": e, "M": vcfg.mem_dim, "C": cfg.d_model, "K": vcfg.memory_slots, "P": vcfg.max_obj_ptrs}
    v |= {"numMaskmem": vcfg.num_maskmem, "maxObjPtrs": vcfg.max_obj_ptrs}
    if vcfg.memory_tokens:
        v["memoryTokens"] = vcfg.memory_tokens  # absent for SAM 2.1 (the API as before)
    got = _run_node(tmp_path, SELECT_JS, {"cases": cases, "v": v})
    dropped = 0
    for (mem, frame, n, reverse), g in zip(banks, got):
        want = select_memory(mem, frame, n, cfg, vcfg, reverse)
        assert g["spatial"] == want.spatial and g["pointers"] == want.pointers and g["dropped"] == want.dropped
        for k, a in vars(want.inputs).items():
            np.testing.assert_array_equal(np.array(g["inputs"][k], np.float32), a.ravel(), err_msg=k)
        dropped += want.dropped
    assert dropped > 0  # some case had more frames than slots


HEADS_JS = """
import { stableToken, fillHoles } from './tracker.mjs';
import { readFileSync } from 'fs';
const { cases, side } = JSON.parse(readFileSync(process.argv[2]));
const out = cases.map((c) => ({
  token: stableToken(Float32Array.from(c.masks), Float32Array.from(c.iou), side * side, 0.05, 0.98),
  filled: Array.from(fillHoles(Float32Array.from(c.masks.slice(0, side * side)), side, 8)),
}));
console.log(JSON.stringify(out));
"""


def test_tracker_js_mask_rules_as_python(tmp_path):
    """stableToken vs stable_single_mask (values exactly at the float32 stability band included) and
    fillHoles vs fill_holes (scipy, 8-connected) on random blobby logits."""
    side, rng = 32, np.random.default_rng(9)
    cases = []
    for i in range(12):
        masks = rng.standard_normal((1, 4, side, side)).astype(np.float32)
        if i % 3:  # a confident single mask with 1 % (stable) or 3 % (unstable) of it exactly at the band's
            masks[0, 0] = np.abs(masks[0, 0]) + np.float32(0.3)  # edge: numpy compares 0.05 as float32, so
            masks[0, 0][rng.random((side, side)) < 0.01 * (2 * (i % 3) - 1)] = np.float32(0.05)  # it is outside
        cases.append({"masks": masks.ravel().tolist(), "iou": rng.random(4).astype(np.float32).tolist()})
    got = _run_node(tmp_path, HEADS_JS, {"cases": cases, "side": side})
    tokens = set()
    for c, g in zip(cases, got):
        masks = np.array(c["masks"], np.float32).reshape(1, 4, side, side)
        iou = np.array(c["iou"], np.float32).reshape(1, 4)
        chosen = stable_single_mask(masks, iou, TEST_SMALL)
        want = next(k for k in range(4) if np.array_equal(masks[:, k : k + 1], chosen))
        assert g["token"] == want
        tokens.add(want)
        np.testing.assert_array_equal(np.array(g["filled"], np.float32), fill_holes(masks[:, :1], 8).ravel())
    assert 0 in tokens and len(tokens) > 1  # both outcomes of the stability rule occurred
