"""Frames per second of live tracking in the static site (``sam2edge web``) with Chromium's fake camera.

    python benchmarks/bench_browser_live.py BUNDLE [BUNDLE ...] [--frames 4] [--modes wasm-1 wasm-2]
        [--record benchmarks/records/92-browser-live-1024.json [--replace]] [--driver cdp] [--clip clip.y4m]
        [--evidence DIR]

Each BUNDLE is a LiteRT bundle exported with ``--video``: any models, each at any resolutions (e.g. EdgeTAM and
SAM 2.1-tiny, each exported with ``--resolution 1024`` and ``512``); rows are per model, resolution and mode, and
the record's notes name every bundle's export. For each bundle the script writes the site, serves it (with the
COOP/COEP headers), and opens it in headless Debian chromium whose fake camera plays a 640x480 clip at 30
frames per second (skimage's astronaut under a drifting window, Y4M, looped). It presses Camera, taps one
object, lets one frame warm up, then counts ``--frames`` processed frames: achieved FPS = processed frames /
page-clock seconds; the page's per-stage milliseconds are medians over those frames; frames the camera
presented meanwhile and the model skipped are the dropped ones. Modes: ``wasm-1`` (LiteRT.js single-threaded
wasm: the page sees one core), ``wasm-2`` (threaded wasm, two threads), ``webgpu`` (only meaningful with a
hardware adapter; on SwiftShader it measures a CPU emulation of a GPU), ``webgpu-vulkan`` (WebGPU on the
machine's own GPU through its Vulkan driver: ``VK_ICD_FILENAMES`` names it; the adapter the page got is recorded).
Nothing else should run meanwhile (``/work/bin/quiet``).

``--driver cdp`` drives Chromium over the DevTools pipe with the standard library alone (no playwright: for a
GPU machine that has only Python, numpy and a Chromium folder; ``SAM2EDGE_CHROMIUM`` names the executable). A
BUNDLE may also be a folder ``sam2edge web`` wrote (then it is served as it is), and ``--clip`` a Y4M clip
written beforehand: with both, nothing heavier than numpy is imported. ``--evidence DIR`` keeps a screenshot of
the page and its adapter, runtime line and console per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = ("encoder", "memory_attention", "decoder", "memory_encoder")
SIZE = (640, 480)
READY = "window.sam2edge && (window.sam2edge.ready || window.sam2edge.error)"


def _adapter_name(a: dict) -> str:
    """The page's WebGPU adapter in a few words, e.g. "nvidia hopper, NVIDIA H200"."""
    return ", ".join(
        x for x in (f"{a.get('vendor', '')} {a.get('architecture', '')}".strip(), a.get("description")) if x
    )


def write_clip(path: Path, frames: int = 30) -> None:
    from tests.test_browser_camera import drifting_frames, write_y4m

    write_y4m(path, drifting_frames(frames, SIZE, step=4, scale=2))


def _measure(hist: list[dict], start: int, frames: int) -> dict:
    """The page's history -> FPS over ``frames`` processed frames after frame ``start - 1``, stage medians, drops."""
    first = next(i for i, h in enumerate(hist) if h["frame"] == start - 1)
    span = hist[first : first + frames + 1]  # the warm frame's end stamp, then `frames` more
    seconds = (span[-1]["t"] - span[0]["t"]) / 1e3
    measured = span[1:]
    return {
        "fps": frames / seconds,
        "ms": {s: float(np.median([h.get(s, 0.0) for h in measured])) for s in STAGES},
        "dropped": span[-1]["dropped"] - span[0]["dropped"],
        "presented": span[-1]["presented"] - span[0]["presented"],
        "frames": frames,
    }


def run_mode_cdp(site: Path, clip: Path, mode: str, frames: int, timeout_ms: int, evidence: Path | None) -> dict:
    """As run_mode, through sam2edge.serve.cdp (no playwright); also the adapter the page's WebGPU got."""
    import os

    from sam2edge.serve.cdp import Chromium, static_server
    from sam2edge.serve.chromium import HARDWARE_WEBGPU_FLAGS, QUIET_FLAGS, SWIFTSHADER_ICD, WEBGPU_FLAGS, chromium_path

    fake = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-video-capture={clip}"]
    gpu = {"webgpu": WEBGPU_FLAGS, "webgpu-vulkan": HARDWARE_WEBGPU_FLAGS}.get(mode, ["--disable-gpu"])
    args = [*QUIET_FLAGS, "--autoplay-policy=no-user-gesture-required", *fake, *gpu]
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    if mode == "webgpu":
        env["VK_ICD_FILENAMES"] = SWIFTSHADER_ICD
    timeout = timeout_ms / 1e3
    one_core = "Object.defineProperty(navigator, 'hardwareConcurrency', {get: () => 1})"
    srv = static_server(site)
    try:
        with Chromium(chromium_path(), args, env) as b:
            page = b.new_page(init_script=one_core if mode == "wasm-1" else None)
            origin = f"http://127.0.0.1:{srv.server_address[1]}"
            b.send("Browser.grantPermissions", {"permissions": ["videoCapture"], "origin": origin})
            accel = "webgpu" if mode.startswith("webgpu") else "wasm"
            page.goto(f"{origin}/?accel={accel}", timeout)
            adapter = page.evaluate(
                "navigator.gpu ? navigator.gpu.requestAdapter().then((a) => a && {vendor: a.info.vendor, "
                "architecture: a.info.architecture, device: a.info.device, description: a.info.description, "
                "isFallbackAdapter: a.info.isFallbackAdapter}) : null"
            )
            try:
                page.wait_for(READY, timeout)
                if not page.evaluate("window.sam2edge.ready"):
                    raise SystemExit("page: " + page.evaluate("document.getElementById('status').innerText"))
                runtime = page.evaluate("document.getElementById('runtime-status').innerText")
                page.click_selector("#camera")
                page.wait_for("window.sam2edge.live.processed >= 1 || window.sam2edge.error", timeout)
                r = page.box("#live-layer")
                page.click(r["x"] + 0.5 * r["width"], r["y"] + 0.4 * r["height"])
                page.wait_for("window.sam2edge.live.calls.some((c) => c.op === 'add')", timeout)
                start = page.evaluate("window.sam2edge.live.processed") + 1  # one tracked frame to warm up
                page.wait_for(f"window.sam2edge.live.processed >= {start + frames}", timeout)
                hist = page.evaluate("window.sam2edge.live.history")
                status = page.evaluate("document.getElementById('status').innerText")
            finally:
                if evidence is not None:
                    evidence.mkdir(parents=True, exist_ok=True)
                    (evidence / f"{site.name}-{mode}.png").write_bytes(page.screenshot())
                    facts = {"chromium": b.version(), "adapter": adapter, "console": page.console()}
                    facts["stderr"] = b.stderr_tail(4000)
                    (evidence / f"{site.name}-{mode}.json").write_text(json.dumps(facts, indent=1))
            return {
                "mode": mode,
                "runtime": runtime,
                "adapter": adapter,
                "status": status,
                **_measure(hist, start, frames),
            }
    finally:
        srv.shutdown()


def run_mode(site: Path, clip: Path, mode: str, frames: int, timeout_ms: int) -> dict:
    """One browser, one mode -> {fps, per-stage medians, dropped, runtime line}."""
    from playwright.sync_api import sync_playwright

    from sam2edge.serve.chromium import SWIFTSHADER_ICD, WEBGPU_FLAGS, chromium_path
    from tests.test_browser_camera import camera_args
    from tests.test_browser_site import static_server

    args = camera_args(clip)
    if mode == "webgpu":
        args = [a for a in args if a != "--disable-gpu"] + WEBGPU_FLAGS
    env = {"XDG_RUNTIME_DIR": "/tmp", "VK_ICD_FILENAMES": SWIFTSHADER_ICD} if mode == "webgpu" else None
    srv = static_server(site, isolate=True)
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=str(chromium_path()), headless=True, args=args, env=env)
            ctx = b.new_context(viewport={"width": 1000, "height": 800}, permissions=["camera"])
            if mode == "wasm-1":  # the page sees one core: LiteRT.js loads its single-threaded wasm
                ctx.add_init_script("Object.defineProperty(navigator, 'hardwareConcurrency', {get: () => 1})")
            page = ctx.new_page()
            accel = "webgpu" if mode == "webgpu" else "wasm"
            page.goto(f"http://127.0.0.1:{srv.server_address[1]}/?accel={accel}")
            page.wait_for_function(
                "window.sam2edge && (window.sam2edge.ready || window.sam2edge.error)", timeout=timeout_ms
            )
            if not page.evaluate("window.sam2edge.ready"):
                raise SystemExit(f"page: {page.inner_text('#status')}")
            runtime = page.inner_text("#runtime-status")
            page.click("#camera")
            page.wait_for_function("window.sam2edge.live.processed >= 1 || window.sam2edge.error", timeout=timeout_ms)
            r = page.locator("#live-layer").bounding_box(timeout=timeout_ms)
            page.mouse.click(r["x"] + 0.5 * r["width"], r["y"] + 0.4 * r["height"])
            page.wait_for_function("window.sam2edge.live.calls.some((c) => c.op === 'add')", timeout=timeout_ms)
            start = page.evaluate("window.sam2edge.live.processed") + 1  # one tracked frame to warm up
            page.wait_for_function(f"window.sam2edge.live.processed >= {start + frames}", timeout=timeout_ms)
            hist = page.evaluate("window.sam2edge.live.history")
            status = page.inner_text("#status")
            b.close()
    finally:
        srv.shutdown()
    return {"mode": mode, "runtime": runtime, "status": status, **_measure(hist, start, frames)}


def _site(bundle: Path, out: Path) -> Path:
    """A folder ``sam2edge web`` wrote is used as it is; a bundle gets its site written to ``out``."""
    if (bundle / "sam2edge-site.json").is_file():
        return bundle
    from sam2edge.serve.site import write_site

    return write_site(bundle, out)


def main() -> None:
    import sam2edge
    from sam2edge.checks.bench.records import machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", type=Path, nargs="+")
    ap.add_argument("--frames", type=int, default=4, help="processed frames measured per mode (after one warm-up)")
    ap.add_argument(
        "--modes", nargs="+", default=["wasm-1", "wasm-2"], choices=("wasm-1", "wasm-2", "webgpu", "webgpu-vulkan")
    )
    ap.add_argument("--driver", choices=("playwright", "cdp"), default="playwright", help="how Chromium is driven")
    ap.add_argument("--clip", type=Path, help="the fake camera's Y4M clip (default: written from skimage's astronaut)")
    ap.add_argument("--evidence", type=Path, help="cdp: keep a screenshot, the adapter and the console per run here")
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--record", type=Path, help="write a sam2edge.table/1 record here (a new file)")
    ap.add_argument("--replace", action="store_true", help="--record may replace an existing record")
    args = ap.parse_args()
    if args.record is not None and args.record.exists() and not args.replace:
        raise SystemExit(f"{args.record} already exists; pass a new file to --record (or add --replace)")
    for bundle in args.bundles:
        if (bundle / "sam2edge-site.json").is_file():
            continue  # a site ``sam2edge web`` wrote: its page says whether it tracks
        card = json.loads((bundle / "card.json").read_text()) if (bundle / "card.json").is_file() else {}
        if not (card.get("extra") or {}).get("video"):
            raise SystemExit(f"{bundle} is not a --video bundle; export it with `sam2edge export ... --video`")
    rows, exports = [], []
    with tempfile.TemporaryDirectory() as tmp:
        clip = args.clip or Path(tmp) / "clip.y4m"
        if args.clip is None:
            write_clip(clip)
        for bundle in args.bundles:
            site = _site(bundle, Path(tmp) / f"site-{bundle.name}")
            card = json.loads((site / "model" / "card.json").read_text())
            size = json.loads((site / "config.json").read_text())["resolution"]
            exports.append(_export_note(bundle, card))
            for mode in args.modes:
                t0 = time.time()
                if args.driver == "cdp":
                    r = run_mode_cdp(site, clip, mode, args.frames, args.timeout_s * 1000, args.evidence)
                else:
                    r = run_mode(site, clip, mode, args.frames, args.timeout_s * 1000)
                print(f"{card.get('config')} {size}px {mode}: {r['fps']:.3f} FPS {r['ms']} ({time.time() - t0:.0f} s)")
                print(f"  {r['runtime']} · adapter {r.get('adapter')} · {r['status']}")
                rows.append(
                    {
                        "model": card.get("config"),
                        "resolution": size,
                        "mode": mode if not r.get("adapter") else f"{mode} ({_adapter_name(r['adapter'])})",
                        "fps": round(r["fps"], 3),
                        **{f"{s}_ms": round(v) for s, v in r["ms"].items()},
                        "dropped": f"{r['dropped']} of {r['presented']}",
                    }
                )
    for r in rows:
        print(r)
    if args.record:
        record = {
            "schema": "sam2edge.table/1",
            "id": args.record.stem.split("-", 1)[1],
            "title": "Live tracking in the page with the camera (static site, LiteRT.js), fp32 --video bundles, "
            "640x480 fake camera at 30 FPS",
            "date": date.today().isoformat(),
            "command": "python benchmarks/bench_browser_live.py " + " ".join(_argv(args)),
            "machine": {k: v for k, v in machine().items() if k in ("cpu", "cores", "vector_extensions")},
            "sam2edge": {"version": sam2edge.__version__},
            "columns": [
                ["model", "model"],
                ["resolution", "px"],
                ["mode", "LiteRT.js"],
                ["fps", "FPS"],
                ["encoder_ms", "encoder (ms)"],
                ["memory_attention_ms", "memory attention (ms)"],
                ["decoder_ms", "decoder (ms)"],
                ["memory_encoder_ms", "memory encoder (ms)"],
                ["dropped", "camera frames dropped"],
            ],
            "rows": rows,
            "notes": [*exports, *_goal_notes(rows)],
        }
        args.record.write_text(json.dumps(record, indent=2) + "\n")


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line with each bundle as its folder name (the notes say how each was exported)."""
    out = [b.name for b in args.bundles] + ["--frames", str(args.frames), "--modes", *args.modes]
    out += ["--driver", args.driver] if args.driver != "playwright" else []
    return out + (["--record", str(args.record), "--replace"] if args.record else [])


def _export_note(bundle: Path, card: dict) -> str:
    """How ``bundle`` was made, from its card."""
    src = card.get("source") or {}
    ckpt = src.get("checkpoint") or "synthetic"
    name = Path(str(ckpt)).name  # the file's name: the record names no local folders
    weights = "synthetic weights" if ckpt == "synthetic" or src.get("sha256") is None else f"checkpoint {name}"
    return (
        f"{bundle.name}: sam2edge export --target litert --config {card.get('config')} --precision "
        f"{card.get('precision')} --resolution {card.get('resolution')} --video ({weights}; speed does not depend on "
        "the weights' values)"
    )


def _goal_notes(rows: list[dict]) -> list[str]:
    """The >= 1 FPS goal on 2 wasm threads, per model: met at which resolutions, measured FPS otherwise."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        two = [r for r in rows if r["model"] == model and r["mode"] == "wasm-2"]
        if not two:
            continue
        met = [f"{r['resolution']} px ({r['fps']:.2f} FPS)" for r in two if r["fps"] >= 1.0]
        missed = [f"{r['resolution']} px ({r['fps']:.2f} FPS)" for r in two if r["fps"] < 1.0]
        out.append(
            f"{model}, >= 1 FPS on 2 wasm threads: "
            + (f"met at {', '.join(met)}" if met else "not met at any resolution measured")
            + (f"; missed at {', '.join(missed)}" if missed else "")
            + "."
        )
    return out


if __name__ == "__main__":
    main()
