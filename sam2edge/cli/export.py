"""``sam2edge export --target T --precision P [--resolution R] [--checkpoint C] --out DIR``.

Dispatch goes through ``TARGETS``: target name -> callable ``fn(args) -> int`` that builds, converts,
verifies and writes the bundle into ``args.out``. Every target reads the same arguments:

  args.target        registry key (also card.json "target")
  args.precision     "fp32" | "fp16" | "int8" (a target that lacks one raises UserError)
  args.resolution    model input side in pixels (multiple of 32) or None for the config's own
  args.config        name in sam2edge.config.CONFIGS (None on the command line: detected from the checkpoint)
  args.checkpoint    weights spec for ``load_weights`` (None = synthetic)
  args.out           bundle folder (written atomically)
  args.allow_dirty   write an artifact that fails the target's graph lint (card status says so)
  args.force         write a bundle that fails an accuracy bar (card status "rejected")
  args.command_line  the command line, for card.json

A target module is imported only when chosen (``_lazy``), so adding one is a single line here.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
from collections.abc import Callable

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError

PRECISIONS = ("fp32", "fp16", "int8")


def _lazy(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    """A callable that imports ``module`` on first use and calls ``module.func(args)``."""

    def call(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), func)(args)

    call.__name__ = f"{module}.{func}"
    return call


# target name -> fn(args) -> int; add a runtime with one line
TARGETS: dict[str, Callable[[argparse.Namespace], int]] = {
    "litert": _lazy("sam2edge.export.litert", "export_from_args"),
    "onnx": _lazy("sam2edge.export.onnx", "export_from_args"),
    "executorch": _lazy("sam2edge.export.executorch", "export_from_args"),
    "executorch-webgpu": _lazy("sam2edge.export.executorch_webgpu", "export_from_args"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help=f"runtime to export for: {', '.join(TARGETS)}")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="weight precision (I/O stays fp32)")
    p.add_argument("--resolution", type=int, default=None, help="model input side in pixels, e.g. 1024 or 512")
    p.add_argument(
        "--config", default=None, choices=sorted(CONFIGS), help="model config (default: detected from the checkpoint)"
    )
    p.add_argument("--checkpoint", help="a SAM 2.1 .pt of any size, model.safetensors or a hub id (default: synthetic)")
    p.add_argument("--out", required=True, help="bundle folder to write")
    p.add_argument("--allow-dirty", action="store_true", help="write a graph that fails the GPU lint (status says so)")
    p.add_argument("--force", action="store_true", help="write a bundle that fails an accuracy bar (status rejected)")


def command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces this export (for card.json)."""
    parts = ["sam2edge", "export", "--target", args.target, "--precision", args.precision, "--config", args.config]
    if args.resolution is not None:
        parts += ["--resolution", str(args.resolution)]
    if args.checkpoint:
        parts += ["--checkpoint", args.checkpoint]
    parts += ["--out", str(args.out)]
    parts += [flag for flag, on in (("--allow-dirty", args.allow_dirty), ("--force", args.force)) if on]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    if args.target not in TARGETS:
        raise UserError(f"unknown export target {args.target!r}; choose one of {', '.join(sorted(TARGETS))}")
    if args.resolution is not None and (args.resolution <= 0 or args.resolution % 32):
        raise UserError(f"--resolution {args.resolution} must be a positive multiple of 32, e.g. 1024 or 512")
    if args.config is None:  # the size the checkpoint's tensor shapes hold (synthetic: Hiera-Tiny)
        from sam2edge.weights import checkpoint_config

        args.config = checkpoint_config(args.checkpoint)
    args.command_line = command_line(args)
    return int(TARGETS[args.target](args) or 0)
