"""``sam2edge sweep DIR [--backends wasm,webgpu]``: every .tflite of a bundle in headless Chromium (LiteRT.js)
vs the Python CPU result; one JSON record per model under ``DIR/sweep/<litertjs version>/<date>/``."""

from __future__ import annotations

import argparse
import json

from sam2edge.errors import UserError
from sam2edge.extras import require_all
from sam2edge.progress import stage


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sam2edge.serve.sweep import DEFAULT_TOLERANCE

    p.add_argument("bundle", metavar="DIR", help="LiteRT bundle folder (from `sam2edge export --target litert`)")
    p.add_argument("--backends", default="wasm,webgpu", help="comma list of wasm, webgpu (default both)")
    p.add_argument("--files", default="", help="comma list of .tflite names to sweep (default: every one)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per model and backend (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per model and backend before 'timeout'")
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"largest max relative diff that counts as a match (default {DEFAULT_TOLERANCE})",
    )


def run(args: argparse.Namespace) -> int:
    require_all(("playwright", "ai_edge_litert"), "sweep")
    from sam2edge.serve.sweep import SweepConfig, sweep_bundle

    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if not backends:
        raise UserError("--backends is empty; give e.g. wasm,webgpu")
    if args.runs < 1 or args.warmup < 0 or args.timeout <= 0:
        raise UserError("--runs must be >= 1, --warmup >= 0 and --timeout > 0")
    files = tuple(f.strip() for f in args.files.split(",") if f.strip())
    cfg = SweepConfig(
        backends=backends,
        files=files,
        runs=args.runs,
        warmup=args.warmup,
        timeout_s=args.timeout,
        tolerance=args.tolerance,
    )
    paths = sweep_bundle(args.bundle, cfg, progress=stage)
    print(f"{'model':<22} {'backend':<15} {'status':<16} {'full deleg.':<11} {'max rel diff':<13} p50 ms")
    for p in paths:
        rec = json.loads(p.read_text())
        for r in rec["results"]:
            full = "-" if r["full_delegation"] is None else ("yes" if r["full_delegation"] else "no")
            rel = "-" if r["max_rel_diff"] is None else f"{r['max_rel_diff']:.2e}"
            p50 = "-" if r["latency_p50_ms"] is None else f"{r['latency_p50_ms']:.1f}"
            print(f"{rec['file']:<22} {r['backend']:<15} {r['status']:<16} {full:<11} {rel:<13} {p50}")
    print(f"records: {paths[0].parent}" if paths else "no records written")
    return 0
