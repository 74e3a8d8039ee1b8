"""``sam2edge`` command line: one sub-command per job, registered in ``COMMANDS``.

Each command module provides ``add_arguments(parser)`` and ``run(args) -> int``. A
``UserError`` (bad input) is printed as one line and exits 2; nothing else is caught.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sam2edge import __version__
from sam2edge.errors import UserError
from sam2edge.io import Terminated

# command name -> (module under sam2edge.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "segment": ("segment", "segment a photo from points / a box; write mask and overlay PNGs"),
    "track": ("track", "track objects through a video from points / boxes; write mask PNGs and an overlay video"),
    "everything": ("everything", "segment everything in a photo (grid of prompts): masks JSON + overlay PNG"),
    "verify-official": ("verify_official", "check that a Meta .pt and an HF .safetensors hold identical tensors"),
    "export": ("export", "export encoder + decoder for an edge runtime, verified before it is written"),
    "lint": ("lint", "op census and GPU-readiness verdict of a .tflite file (no TensorFlow)"),
    "gpu-check": ("gpu_check", "run .tflite files on LiteRT's GPU delegate (software Vulkan): residency, GPU vs CPU"),
    "verify": ("verify", "check a bundle against eager fp32 (per output, end to end); writes fidelity.json"),
    "bench": ("bench", "time a bundle / upstream eager (load, encoder, per-click decoder); writes JSON records"),
    "card": ("card", "render a bundle's README.md model card from card.json, fidelity.json and records"),
    "manifest": ("manifest", "check (or rewrite) a bundle's manifest.json: SHA-256 and size of every file"),
    "serve": ("serve", "tap-to-segment web app: encoder on the server, decoder in the browser (LiteRT.js)"),
    "web": ("web", "write a static site (page, LiteRT.js, model files) where every model stage runs in the browser"),
    "embed": ("embed", "encode a dataset once (locally or on Ray Data) into a store of embeddings"),
    "diagnose": ("diagnose", "fp16 vs fp32 layer by layer for a target or bundle: where precision is lost"),
    "report": ("report", "measured tables (Markdown) and charts (PNG) from benchmark records: docs/benchmarks.md"),
    "sweep": ("sweep", "run every .tflite of a bundle in headless Chromium (LiteRT.js wasm/WebGPU) vs Python CPU"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sam2edge", description="The SAM 2 family (SAM 2.1, EdgeTAM) on the edge, with proof."
    )
    parser.add_argument("--version", action="version", version=f"sam2edge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(f"sam2edge.cli.{module}")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("error: terminated (SIGTERM); nothing was left half-written", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
