"""``sam2edge export --target T --precision P [--resolution R] [--checkpoint C] --out DIR``.

Targets come from the registry ``sam2edge.targets.TARGETS`` (a new runtime is one converter module and one
line there); every target runs the one pipeline ``sam2edge.export.pipeline.run_export``:

  --target        registry key (also card.json "target")
  --precision     "fp32" | "fp16" | "int8" (a target that lacks one: one-line error naming what it offers)
  --resolution    model input side in pixels (multiple of 32) or the config's own
  --config        name in sam2edge.config.CONFIGS (default: detected from the checkpoint's tensor shapes)
  --checkpoint    weights spec for ``load_weights`` (default: synthetic, with a warning)
  --out           bundle folder (new, empty, or an earlier bundle; written atomically)
  --allow-dirty   write a graph that fails the target's graph lint (recorded in the card)
  --force         write a bundle that fails an accuracy bar (card status "rejected")
  --int8          onnx int8: "static" (default) or "dynamic" activations of encoder_vnni.onnx (``export.onnx_static``)
  --video         also the video graphs (memory attention, memory encoder, video decoder; every precision, int8
                  quantising only the frame encoder), measured on a two-object clip;
                  ``Sam2VideoPredictor.from_export(DIR)`` tracks from the bundle
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError
from sam2edge.extras import TARGET_MODULES, require_all
from sam2edge.targets import TARGETS, resolve

PRECISIONS = ("fp32", "fp16", "int8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help=f"runtime to export for: {', '.join(TARGETS)}")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="weight precision (I/O stays fp32)")
    p.add_argument("--resolution", type=int, default=None, help="model input side in pixels, e.g. 1024 or 512")
    p.add_argument(
        "--config", default=None, choices=sorted(CONFIGS), help="model config (default: detected from the checkpoint)"
    )
    p.add_argument("--checkpoint", help="a SAM 2.1 .pt of any size, model.safetensors or a hub id (default: synthetic)")
    p.add_argument("--out", required=True, help="bundle folder to write")
    p.add_argument(
        "--allow-dirty", action="store_true", help="write a graph that fails the graph lint (status says so)"
    )
    p.add_argument("--force", action="store_true", help="write a bundle that fails an accuracy bar (status rejected)")
    p.add_argument("--video", action="store_true", help="also export the video graphs (tracking from the bundle)")
    p.add_argument(
        "--int8",
        choices=("static", "dynamic"),
        default=None,
        help="--target onnx --precision int8: activations of encoder_vnni.onnx with ranges calibrated on photos"
        " (static, the default: a QDQ graph; the dynamic file ships where it misses a bar) or measured per call"
        " (dynamic)",
    )
    p.add_argument(
        "--gpu-check",
        choices=("run", "skip"),
        default="run",
        help="litert: run LiteRT's GPU-delegate check (default; results reused for a graph already checked here,"
        " keyed by its SHA-256) or skip it (card.json and fidelity.json say it was not run)",
    )


def command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces this export (for card.json)."""
    parts = ["sam2edge", "export", "--target", args.target, "--precision", args.precision, "--config", args.config]
    if args.resolution is not None:
        parts += ["--resolution", str(args.resolution)]
    if args.checkpoint:
        parts += ["--checkpoint", args.checkpoint]
    parts += ["--out", str(args.out)]
    flags = (("--allow-dirty", args.allow_dirty), ("--force", args.force), ("--video", args.video))
    parts += [flag for flag, on in flags if on]
    parts += ["--gpu-check", "skip"] if getattr(args, "gpu_check", "run") == "skip" else []
    parts += ["--int8", args.int8] if getattr(args, "int8", None) else []
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    if args.resolution is not None and (args.resolution <= 0 or args.resolution % 32):
        raise UserError(f"--resolution {args.resolution} must be a positive multiple of 32, e.g. 1024 or 512")
    if args.int8 and (args.target, args.precision) != ("onnx", "int8"):
        raise UserError(f"--int8 {args.int8} applies to --target onnx --precision int8 only; drop it")
    require_all(TARGET_MODULES.get(args.target, ()), f"export --target {args.target}")
    from sam2edge.export.pipeline import check_request, guard_out, run_export

    target = check_request(args.target, args.precision)
    guard_out(args.out, (args.checkpoint,))  # before any import of a converter or weights
    if args.config is None:  # the size the checkpoint's tensor shapes hold (synthetic: Hiera-Tiny)
        from sam2edge.weights import checkpoint_config

        args.config = checkpoint_config(args.checkpoint)
    if not args.checkpoint:
        print("WARNING: no --checkpoint given; exporting the deterministic SYNTHETIC checkpoint", file=sys.stderr)
    card = run_export(
        args.target,
        args.config,
        args.precision,
        args.out,
        resolution=args.resolution,
        checkpoint=args.checkpoint,
        allow_dirty=args.allow_dirty,
        force=args.force,
        command=command_line(args),
        video=args.video,
        options={
            **({"gpu_check": args.gpu_check} if args.gpu_check != "run" else {}),
            **({"int8": args.int8} if args.int8 else {}),
        }
        or None,
    )
    print(resolve(target.converter).summary(card, Path(args.out)))
    return 0
