"""``sam2edge gpu-check FILE.tflite|DIR [--json] [--clicks N] [--timeout S] [--record]``.

Runs every .tflite file on LiteRT's GPU delegate over a software Vulkan device (SwiftShader) and on
the CPU, and prints residency (ops on the GPU, partitions, rejected ops with the delegate's reasons),
GPU-vs-CPU numerics per output, decoder mask IoU over clicks on real photos, and a verdict per file.
Exit 0 when every file is ``resident``, 1 otherwise; 2 (one-line error) when no software Vulkan
device is installed or a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sam2edge.checks.gpu.check import DEFAULT_CLICKS, DEFAULT_TIMEOUT_S, check_file, environment, vulkan_icd
from sam2edge.checks.gpu.report import format_report, record_in_bundle, tflite_files
from sam2edge.errors import UserError
from sam2edge.progress import Progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="a .tflite file or a folder of them (e.g. a LiteRT export bundle)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--clicks", type=int, default=DEFAULT_CLICKS, help="decoder clicks on real photos (>= 20)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds allowed per file and accelerator")
    p.add_argument("--record", action="store_true", help="store the result in the bundle's fidelity.json")


def run(args: argparse.Namespace) -> int:
    if args.clicks < 20:
        raise UserError(f"--clicks {args.clicks} is too few for a worst-case mask IoU; use 20 or more")
    files = tflite_files(args.target)
    if args.record and not (Path(args.target) / "card.json").is_file():
        raise UserError(f"--record needs an export bundle folder (with card.json); {args.target} is not one")
    vulkan_icd()  # fail early, with the install hint, before any work
    reports = []
    with Progress("GPU check (software Vulkan; GPU and CPU runs)", len(files), unit="file") as bar:
        for f in files:
            bar.bar.set_postfix_str(f.name)
            reports.append(check_file(f, clicks=args.clicks, timeout=args.timeout))
            bar.step()
    device = next((r.residency.device for r in reports if r.residency.device), "")
    env = environment(device)
    if args.json:
        print(json.dumps({"environment": env, "files": [r.to_dict() for r in reports]}, indent=2))
    else:
        print(f"environment: Vulkan device {env['vulkan_device'] or '?'}, ai-edge-litert {env['ai_edge_litert']}")
        for r in reports:
            print(format_report(r))
    if args.record:
        record_in_bundle(args.target, reports, f"sam2edge gpu-check {args.target} --record --clicks {args.clicks}")
        print(f"recorded in {Path(args.target) / 'fidelity.json'} (checks.gpu_delegate) and card.json")
    return 0 if all(r.verdict == "resident" for r in reports) else 1
