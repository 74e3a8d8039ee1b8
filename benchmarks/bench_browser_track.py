"""Tracking in the page vs tracking in Python, one run: per-frame time and masks of the same bundle.

    python benchmarks/bench_browser_track.py BUNDLE [--frames 4] [--accel wasm] [--encode page] [--threads 2]
        [--json out.json]

BUNDLE is a LiteRT bundle exported with ``--video`` (SAM 2.1 or EdgeTAM). The script serves it (``sam2edge
serve``'s app), opens the page in headless Debian chromium, uploads a clip (skimage's astronaut under a drifting
640x480 window, VP9), clicks one object on frame 0 and presses Track (forwards only). The page's per-frame stage
times come from its own clock (features: the frame encoder in LiteRT.js with ``--encode page``, the server's
encoder + transfer with ``--encode server``; the three video graphs in LiteRT.js). Then the
same calls are replayed on ``Sam2VideoPredictor.from_export(BUNDLE)`` (ai-edge-litert, ``--threads``), timed
per frame, and the masks are compared frame by frame (IoU). Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def write_clip(path: Path, frames: int, size=(640, 480), step: int = 12) -> None:
    from skimage import data

    from sam2edge.runtime.video.io import close_writer, open_writer, write_frame

    photo, (w, h) = data.astronaut(), size
    container, stream = open_writer(path, ".webm", w, h, 10)
    for i in range(frames):
        x0, y0 = step * i, (step * i) // 2
        write_frame(container, stream, np.ascontiguousarray(photo[y0 : y0 + h, x0 : x0 + w]))
    close_writer(container, stream)


def run_page(bundle: Path, clip: Path, accel: str, timeout_ms: int, encode: str = "page") -> dict:
    """Serve, upload, click, track in chromium -> {"calls", "times", "masks" {frame: HxW bool}}."""
    from playwright.sync_api import sync_playwright

    from sam2edge.serve.app import default_app_from_args
    from sam2edge.serve.chromium import launch

    app = default_app_from_args(str(bundle), None, None)
    if app.clips is None:
        raise SystemExit(f"{bundle}: {app.tracker_note}")
    srv = app.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = launch(pw, webgpu=accel == "webgpu")
            page = browser.new_page(viewport={"width": 900, "height": 800})
            page.goto(f"{srv.url}/?accel={accel}&encode={encode}")
            page.wait_for_selector("body[data-ready='1']", state="attached", timeout=timeout_ms)
            page.set_input_files("#video-file", str(clip))
            page.wait_for_function("window.sam2edge.video.tracker && !window.sam2edge.video.busy", timeout=timeout_ms)
            page.uncheck("#backwards")
            r = page.locator("#prompt-layer").bounding_box()
            for action in (
                lambda: page.mouse.click(r["x"] + 0.5 * r["width"], r["y"] + 0.45 * r["height"]),
                lambda: page.click("#track"),
            ):
                n = page.evaluate("Number(document.body.dataset.tracks || 0)")
                action()
                page.wait_for_function(f"Number(document.body.dataset.tracks || 0) > {n}", timeout=timeout_ms)
                if page.evaluate("document.getElementById('status').classList.contains('error')"):
                    raise SystemExit(f"page: {page.inner_text('#status')}")
            out = page.evaluate(
                "({calls: window.sam2edge.video.calls, times: window.sam2edge.video.times,"
                " n: window.sam2edge.video.clip.num_frames})"
            )
            out["masks"] = {f: _page_mask(page, f) for f in range(out["n"])}
            browser.close()
    finally:
        srv.shutdown()
        srv.server_close()
    return out


def _page_mask(page, frame: int) -> np.ndarray:
    import base64

    b64, w, h = page.evaluate(
        f"[window.sam2edge.video.labelMapB64({frame}, 0), window.sam2edge.video.clip.width,"
        " window.sam2edge.video.clip.height]"
    )
    return np.frombuffer(base64.b64decode(b64), np.uint8).reshape(h, w) > 0


def run_python(bundle: Path, clip: Path, calls: list[dict], threads: int) -> tuple[list[float], dict]:
    """The page's calls on Sam2VideoPredictor.from_export -> (ms per tracked frame, {frame: mask})."""
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor

    pred = Sam2VideoPredictor.from_export(bundle, threads=threads)
    state = pred.init_state(str(clip))
    add = next(c for c in calls if c["op"] == "add")
    _, _, masks = pred.add_new_points_or_box(
        state,
        add["frame"],
        add["obj"],
        points=np.array(add["points"], np.float32),
        labels=np.array(add["labels"]),
        clear_old_points=add["clear"],
    )
    out, ms, t0 = {add["frame"]: masks[0, 0].numpy() > 0}, [], time.perf_counter()
    for f, _, m in pred.propagate_in_video(state):
        if f != add["frame"]:
            ms.append((time.perf_counter() - t0) * 1e3)
        out[f] = m[0, 0].numpy() > 0
        t0 = time.perf_counter()
    return ms, out


def main() -> None:
    from sam2edge.checks.fidelity import mask_iou

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--accel", choices=("wasm", "webgpu"), default="wasm")
    ap.add_argument("--encode", choices=("page", "server"), default="page", help="where the frame encoder runs")
    ap.add_argument("--threads", type=int, default=2, help="ai-edge-litert threads of the Python subject")
    ap.add_argument("--timeout-s", type=int, default=3600)
    ap.add_argument("--json", type=Path, help="write the per-frame numbers here")
    args = ap.parse_args()
    if args.json is not None and args.json.exists():
        raise SystemExit(f"{args.json} already exists; pass a new file to --json")
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "clip.webm"
        write_clip(clip, args.frames)
        page = run_page(args.bundle, clip, args.accel, args.timeout_s * 1000, args.encode)
        py_ms, py_masks = run_python(args.bundle, clip, page["calls"], args.threads)
    tracked = [t for t in page["times"] if "memory_attention" in t]
    stages = ("features", "memory_attention", "decoder", "memory_encoder", "total")
    med = {s: float(np.median([t.get(s, 0.0) for t in tracked])) for s in stages}
    ious = {f: mask_iou(page["masks"][f], py_masks[f]) for f in sorted(py_masks)}
    where = f"page, LiteRT.js {args.accel}, encoder {'in the page' if args.encode == 'page' else 'on the server'}"
    print(f"| stage (median of {len(tracked)} tracked frames) | {where} | Python, ai-edge-litert |")
    print("|---|---|---|")
    for s in stages[:-1]:
        print(f"| {s.replace('_', ' ')} | {med[s]:.0f} ms | |")
    print(f"| **per frame** | **{med['total']:.0f} ms** | **{np.median(py_ms):.0f} ms** |")
    print("mask IoU page vs Python per frame: " + " ".join(f"{f}:{v:.5f}" for f, v in ious.items()))
    if args.json:
        record = {"accel": args.accel, "encode": args.encode, "page_times": page["times"], "python_ms": py_ms}
        record |= {"iou": ious, "medians": med}
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
