"""Browser sweep: every .tflite of a bundle in headless Chromium with LiteRT.js, per backend, against the
Python CPU result (ai-edge-litert) on the same inputs; one JSON record per model.

Inputs are meaningful, not noise: the encoder gets a real photo (skimage astronaut) preprocessed to its
input side; the decoder gets the encoder's own CPU outputs for that photo (random features when the
bundle has no encoder) plus one click encoded from the bundle's prompt tables and the no-mask dense
prompt; any other model gets seeded normal noise.

Record (``<bundle>/sweep/<litertjs version>/<date>/<model_id>__<stem>.json``):
  schema, model_id, file, sha256, bytes, precision, date, provenance "measured",
  environment {chromium, headless, os, machine, litertjs, adapter, label},
  config {tolerance, inputs, reference, latency},
  results [{backend ("wasm_xnnpack" | "webgpu_mldrift"), accelerator ("wasm" | "webgpu"), status,
            full_delegation (true | false | None for wasm), delegation {gpu_ops, cpu_ops, whole_graph_fell_back,
            report, is_fully_accelerated_claim}, output_match (bool | None), max_rel_diff, max_abs_diff,
            min_cosine, per_output {...}, latency_p50_ms, latency_min_ms, first_run_ms, compile_ms, runs,
            warmup, timeout_s, runtime_variant, threads, error, evidence?, console_tail? (status != pass)}]
A later sweep of the same file (same SHA-256) on the same date replaces the rows of the backends it ran
and keeps the others, so backends can be swept one at a time (e.g. slow WebGPU with fewer runs).
Status: ``load_error`` (runtime, inputs or compile failed), ``timeout``, ``output_mismatch`` (max_rel_diff >
tolerance), ``fallback`` (WebGPU graph partly or wholly run on wasm: parsed from the console's partition
report, never from ``isFullyAccelerated``, which says true for partly delegated graphs), else ``pass``.
max_rel_diff = max |browser - cpu| / max |cpu| over each output, worst output.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.checks.fidelity import photo
from sam2edge.errors import UserError
from sam2edge.io import atomic_path
from sam2edge.serve.sweep_results import BACKEND_LABELS, STATUSES, _r, _result_row  # noqa: F401

DEFAULT_TOLERANCE = 1e-3


@dataclass
class SweepConfig:
    backends: tuple[str, ...] = ("wasm", "webgpu")
    files: tuple[str, ...] = ()  # only these .tflite names (default: all)
    runs: int = 5
    warmup: int = 1
    timeout_s: float = 900.0
    tolerance: float = DEFAULT_TOLERANCE


# ---- inputs and the Python CPU reference ------------------------------------------------------------
def _runner(path: Path):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=2)
    sig = interp.get_signature_list()
    key = next(iter(sig))
    return interp.get_signature_runner(key), sig[key]["inputs"], sig[key]["outputs"]


def _input_shapes(runner, names: list[str]) -> list[tuple[int, ...]]:
    details = runner.get_input_details()
    return [tuple(int(d) for d in details[n]["shape"]) for n in names]


def cpu_reference(path: Path, inputs: list[np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Outputs of the .tflite on ai-edge-litert CPU (2 threads), in signature output order."""
    runner, in_names, out_names = _runner(path)
    out = runner(**{n: a for n, a in zip(in_names, inputs)})
    return [(n, np.asarray(out[n], np.float32)) for n in out_names]


def _role(bundle: Path, file: str, card: dict) -> str:
    for a in card.get("artifacts", []):
        if isinstance(a, dict) and a.get("file") == file and a.get("role"):
            return str(a["role"])
    stem = Path(file).stem
    return "encoder" if "encoder" in stem and "mask" not in stem else ("decoder" if "decoder" in stem else "other")


def _photo_input(side: int) -> np.ndarray:
    from sam2edge.runtime.preprocess import preprocess

    return preprocess(photo("astronaut.png"), side).numpy()  # 1x3xSxS


def make_inputs(bundle: Path, file: str, card: dict, encoder_file: str | None) -> tuple[list[np.ndarray], str]:
    """(positional float32 inputs for ``file``, one-line description of what they are)."""
    from sam2edge.runtime.prompts import encode_points
    from sam2edge.serve.assets import ALIASES, DECODER_INPUTS, browser_decoder

    runner, names, _ = _runner(bundle / file)
    shapes = _input_shapes(runner, names)
    role = _role(bundle, file, card)
    rng = np.random.default_rng(0)
    if role == "encoder" and len(shapes) == 1 and len(shapes[0]) == 4 and shapes[0][1] == 3:
        return [_photo_input(shapes[0][2])], "astronaut.png preprocessed (ImageNet mean/std, NCHW)"
    dec, _ = browser_decoder(bundle)
    if role == "decoder" and dec is not None and dec.decoder == file and len(shapes) == 6:
        canon = [ALIASES.get(n, n) for n in names]
        if sorted(canon) != sorted(DECODER_INPUTS):
            canon = list(dec.inputs)  # unnamed signature (args_0, ...): the card's order
        by = dict(zip(canon, shapes))
        side = by["image_embeddings"][-1] * 16
        feats, what = None, "random features (no encoder in the bundle)"
        if encoder_file:
            ref = cpu_reference(bundle / encoder_file, [_photo_input(side)])
            got = {tuple(a.shape): a for _, a in ref}
            if all(by[k] in got for k in ("image_embeddings", "feat_s0", "feat_s1")):
                feats = {k: got[by[k]] for k in ("image_embeddings", "feat_s0", "feat_s1")}
                what = f"{encoder_file} CPU outputs for astronaut.png"
        if feats is None:
            feats = {
                k: rng.standard_normal(by[k]).astype(np.float32) for k in ("image_embeddings", "feat_s0", "feat_s1")
            }
        tables = {k: np.fromfile(bundle / v, dtype="<f4") for k, v in dec.tables.items()}
        c = tables["not_a_point"].shape[0]
        tables["gaussian"] = tables["gaussian"].reshape(2, c // 2)
        tables["point_embed"] = tables["point_embed"].reshape(-1, c)
        k_slots = by["sparse_prompt"][1]
        click = np.array([[0.45 * side, 0.40 * side], [0.0, 0.0]], np.float32)
        tokens, valid = encode_points(click, np.array([1, -1]), tables, side, k_slots)
        dense = np.broadcast_to(tables["no_mask"].reshape(1, c, 1, 1), by["dense_prompt"]).astype(np.float32)
        named = {**feats, "sparse_prompt": tokens, "sparse_valid": valid, "dense_prompt": dense}
        return [np.ascontiguousarray(named[n], np.float32) for n in canon], f"{what}; one click + pad"
    return [rng.standard_normal(s).astype(np.float32) for s in shapes], "seeded normal noise"


# ---- the browser side -------------------------------------------------------------------------------
def run_in_browser(browser, base_url: str, model_url: str, inputs_url: str, accel: str, cfg: SweepConfig) -> dict:
    """One compile + timed runs in a fresh page; {ok, outputs, run_ms, delegation, ...} or timed_out."""
    from playwright.sync_api import TimeoutError as PwTimeout

    q = urllib.parse.urlencode(
        {"model": model_url, "inputs": inputs_url, "accel": accel, "runs": cfg.runs, "warmup": cfg.warmup}
    )
    page = browser.new_page()
    try:
        page.goto(f"{base_url}/static/sweep.html?{q}")
        try:
            page.wait_for_function(
                "window.sweepResult !== null && window.sweepResult !== undefined",
                timeout=cfg.timeout_s * 1000,
                polling=500,
            )
        except PwTimeout:
            lines = page.evaluate("window.sweepConsole ? window.sweepConsole() : []")
            return {
                "ok": False,
                "timed_out": True,
                "error": f"no result within {cfg.timeout_s:.0f} s",
                "console": lines,
            }
        return page.evaluate("window.sweepResult")
    finally:
        page.close()


def environment(browser, base_url: str, chromium: str, litertjs: str) -> dict:
    page = browser.new_page()
    try:
        page.goto(f"{base_url}/static/sweep.html")  # without ?model= the harness stays idle
        adapter = page.evaluate("""async () => { if (!navigator.gpu) return null;
            const a = await navigator.gpu.requestAdapter(); if (!a) return null; const i = a.info || {};
            return {vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description,
                    isFallbackAdapter: Boolean(i.isFallbackAdapter), features: [...a.features].sort()}; }""")
        ua = page.evaluate("navigator.userAgent")
        cores = page.evaluate("navigator.hardwareConcurrency")
    finally:
        page.close()
    os_name = f"{platform.system()} {platform.release()}"
    label = " · ".join(
        x
        for x in (
            f"{platform.machine()} {cores} cores",
            f"chromium {chromium} headless",
            platform.system(),
            f"@litertjs/core {litertjs}",
            f"webgpu adapter {adapter['architecture'] or adapter['vendor']}" if adapter else "no webgpu adapter",
        )
        if x
    )
    return {
        "chromium": chromium,
        "headless": True,
        "user_agent": ua,
        "os": os_name,
        "machine": platform.machine(),
        "hardware_concurrency": cores,
        "litertjs": litertjs,
        "adapter": adapter,
        "label": label,
    }


# ---- the sweep --------------------------------------------------------------------------------------
def tflite_files(bundle: Path) -> list[str]:
    """The bundle's GPU-facing graphs (the CPU-only decoder graphs are left out: the browser loads decoder.tflite)."""
    from sam2edge.runtime.backends.litert import CPU_ONLY_FILES

    files = sorted(p.name for p in bundle.glob("*.tflite") if p.name not in CPU_ONLY_FILES)
    if not files:
        raise UserError(
            f"{bundle} holds no .tflite file; pass a LiteRT bundle written by `sam2edge export --target litert`"
        )
    return files


def _request(bundle: Path, cfg: SweepConfig, nm: Path | None) -> tuple[Path, dict, list[str], list[str]]:
    """Check the sweep request -> (node_modules, card (or {}), every .tflite, the ones to sweep)."""
    if not bundle.is_dir():
        raise UserError(f"{bundle} is not a folder; pass a bundle folder written by `sam2edge export`")
    for b in cfg.backends:
        if b not in BACKEND_LABELS:
            raise UserError(f"unknown backend {b!r}; choose from {', '.join(BACKEND_LABELS)}")
    if nm is None:
        raise UserError("LiteRT.js is not installed; run `npm ci` at the repo root (scripts/setup.sh does it)")
    try:
        card = json.loads((bundle / "card.json").read_text())
    except (OSError, json.JSONDecodeError):
        card = {}
    all_files = tflite_files(bundle)
    unknown = [f for f in cfg.files if f not in all_files]
    if unknown:
        raise UserError(f"{', '.join(unknown)} not in {bundle}; its models are {', '.join(all_files)}")
    return nm, card, all_files, [f for f in all_files if not cfg.files or f in cfg.files]


def sweep_bundle(
    bundle: str | Path, cfg: SweepConfig, progress=print, out_root: Path | None = None, browser=None
) -> list[Path]:
    """Sweep every .tflite of ``bundle`` on ``cfg.backends``; returns the record paths written.

    ``browser``: an already launched playwright chromium (``serve.chromium.launch``, WebGPU flags on) to
    reuse; by default one is launched and closed here.
    """
    from playwright.sync_api import sync_playwright

    from sam2edge.bundle import sha256_bytes
    from sam2edge.serve.assets import STATIC_DIR, litertjs_version, node_modules, vendor_mounts
    from sam2edge.serve.chromium import chromium_version, launch
    from sam2edge.serve.web import Mounts, WebServer

    bundle = Path(bundle)
    nm, card, all_files, files = _request(bundle, cfg, node_modules())
    encoder = next((f for f in all_files if _role(bundle, f, card) == "encoder"), None)
    litertjs = litertjs_version(nm)
    chromium = chromium_version()
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    out_dir = (out_root or bundle / "sweep") / litertjs / date
    written = []
    with tempfile.TemporaryDirectory(prefix="sam2edge-sweep-") as tmp:
        tmp = Path(tmp)
        mounts = Mounts({"/static/": STATIC_DIR, "/bundle/": bundle, "/inputs/": tmp, **vendor_mounts(nm)})
        server = WebServer("127.0.0.1", 0, mounts, {})
        threading.Thread(target=server.serve_forever, daemon=True).start()

        def sweep_all(b) -> None:
            env = environment(b, server.url, chromium, litertjs)
            for file in files:
                written.append(
                    _sweep_one(
                        bundle, file, card, encoder, cfg, b, server.url, tmp, env, date, out_dir, sha256_bytes, progress
                    )
                )

        try:
            if browser is not None:
                sweep_all(browser)
            else:
                with sync_playwright() as pw:
                    own = launch(pw, webgpu="webgpu" in cfg.backends)
                    try:
                        sweep_all(own)
                    finally:
                        own.close()
        finally:
            server.shutdown()
            server.server_close()
    return written


def _sweep_one(bundle, file, card, encoder, cfg, browser, url, tmp, env, date, out_dir, sha, progress) -> Path:
    progress(f"{file}: inputs and the CPU reference (ai-edge-litert)")
    inputs, what = make_inputs(bundle, file, card, encoder)
    ref = cpu_reference(bundle / file, inputs)
    _, in_names, _ = _runner(bundle / file)
    spec = {"inputs": []}
    stem = Path(file).stem
    for i, (tensor, a) in enumerate(zip(in_names, inputs)):
        name = f"{stem}.in{i}.bin"
        np.ascontiguousarray(a, dtype="<f4").tofile(tmp / name)
        spec["inputs"].append({"name": tensor, "url": f"/inputs/{name}", "shape": list(a.shape)})
    (tmp / f"{stem}.inputs.json").write_text(json.dumps(spec))
    rows = []
    for accel in cfg.backends:
        progress(f"{file}: {accel} in chromium ({cfg.warmup} warm-up + {cfg.runs} runs)")
        t0 = time.time()
        res = run_in_browser(
            browser, url, f"/bundle/{urllib.parse.quote(file)}", f"/inputs/{stem}.inputs.json", accel, cfg
        )
        row = _result_row(accel, res, ref, cfg)
        rows.append(row)
        progress(
            f"{file}: {accel}: {row['status']}, max rel diff {row['max_rel_diff']}, "
            f"p50 {row['latency_p50_ms']} ms ({time.time() - t0:.0f} s)"
        )
    record = {
        "schema": 1,
        "model_id": card.get("model_id", "unknown"),
        "file": file,
        "sha256": sha(bundle / file),
        "bytes": (bundle / file).stat().st_size,
        "precision": card.get("precision"),
        "resolution": card.get("resolution"),
        "date": date,
        "provenance": "measured",
        "environment": env,
        "config": {
            "tolerance": cfg.tolerance,
            "inputs": what,
            "reference": "ai-edge-litert CPU, 2 threads",
            "latency": "model.run + copy of every output to the page, after warm-up",
        },
        "results": rows,
    }
    path = out_dir / f"{record['model_id']}__{stem}.json"
    if path.is_file():  # keep rows of backends this run did not touch
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
        if old.get("sha256") == record["sha256"]:
            kept = [r for r in old.get("results", []) if r.get("accelerator") not in cfg.backends]
            order = {b: i for i, b in enumerate(BACKEND_LABELS)}
            record["results"] = sorted(kept + rows, key=lambda r: order.get(r.get("accelerator"), 99))
    with atomic_path(path) as p:
        p.write_text(json.dumps(record, indent=2) + "\n")
    return path
