"""The other int8 ranking: each encoder layer quantised alone (every other layer fp32), then prefixes kept fp32.

    .venv/bin/python benchmarks/int8_rank_alone.py CHECKPOINT [--target onnx] [--out ranking.json]

The export's selection (``export.int8_sensitivity.select_int8``) ranks layers by how much keeping each one fp32
alone lifts the all-int8 encoder. This script measures the complementary ranking, the loss each layer causes on its
own in an otherwise fp32 encoder (``--rank-clicks`` clicks), then, like the selection, the all-int8 encoder with
the first 1, 2, 4, 8 and 16 ranked layers kept fp32, over the export's 40 clicks (worst / median mask IoU vs eager
fp32 with upstream's operations). ONNX's weights are smoothed first, as its export does. Full size, 2 cores: about
20 s a layer.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from sam2edge.checks.bench.script import at_least, first, missing_files, new_file, parsed
from sam2edge.config import CONFIGS


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    return first(
        new_file(args.out, "--out"),
        at_least("--rank-clicks", args.rank_clicks),
        missing_files([args.checkpoint], "give a SAM 2.1 checkpoint's path"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--target", default="onnx", choices=["onnx", "litert", "executorch"])
    p.add_argument("--config", default="sam2.1-hiera-tiny", choices=sorted(CONFIGS))
    p.add_argument("--rank-clicks", type=int, default=10)
    p.add_argument("--out", help="write the ranking and the prefixes' IoUs here (JSON)")
    args = parsed(p, argv, _problem)
    if args is None:
        return 2

    from sam2edge.errors import UserError

    try:
        return _rank(args)
    except UserError as e:  # e.g. a file that is not a checkpoint of --config
        print(f"error: {e}", file=sys.stderr)
        return 2


def _rank(args) -> int:
    from sam2edge.checks.fidelity import click_set
    from sam2edge.checks.fidelity.measure import CachedReference
    from sam2edge.config import get_config
    from sam2edge.export.int8_sensitivity import Int8Emulation
    from sam2edge.export.precision import EMULATIONS
    from sam2edge.export.smooth import smoothed
    from sam2edge.model import UPSTREAM
    from sam2edge.progress import Progress
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.weights import load_weights

    cfg = get_config(args.config)
    sd = load_weights(args.checkpoint, cfg)[0]
    ref = CachedReference(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
    if args.target == "onnx":
        sd = smoothed(sd, cfg, EMULATIONS["onnx"].rewrites)[0]
    emu = Int8Emulation(sd, cfg, args.target, ref)
    names, rank_prompts, prompts = list(emu.layers), click_set(args.rank_clicks), click_set(40)
    rows = []
    with Progress("int8: each layer quantised alone", len(names), "layer") as bar:
        for name in names:
            bar.step(note=name)
            ious = emu.ious(rank_prompts, tuple(n for n in names if n != name))
            rows.append({"layer": name, "iou_worst_alone": float(min(ious)), "iou_mean_alone": float(np.mean(ious))})
    rows.sort(key=lambda r: (r["iou_worst_alone"], r["iou_mean_alone"]))  # most harmful first
    prefixes = {}
    for k in (1, 2, 4, 8, 16):
        ious = emu.ious(prompts, tuple(r["layer"] for r in rows[:k]))
        prefixes[k] = {"iou_worst": float(min(ious)), "iou_median": float(np.median(ious))}
        print(f"{k:>2} kept fp32: worst {prefixes[k]['iou_worst']:.4f} median {prefixes[k]['iou_median']:.4f}")
    if args.out:
        with open(args.out, "x") as f:  # never over a file that is there
            json.dump({"checkpoint": args.checkpoint, "target": args.target, "ranking": rows, "prefixes": prefixes}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
