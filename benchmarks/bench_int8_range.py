"""ONNX int8 weight formats (``export.onnx_int8.INT8_WEIGHTS``: u8, s8, s8 7-bit): the int8 bar on this CPU, per seed.

    python benchmarks/bench_int8_range.py [--seeds 0 1] [--config test-small] [--weights u8 s8 s8-7bit] [--keep DIR]

Exports the ONNX int8 bundle once per weight format and seed (random weights; ``export.onnx_int8.quantize_int8``
with each format as ``encoder.onnx``, no ``encoder_vnni.onnx``) with ``--force``, so a bundle under the bar is
still measured, and prints the end-to-end click IoU (worst / median against eager fp32) beside the CPU's vector
extensions:
u8 x s8 MatMulInteger saturates its int16 pair sums on x86 CPUs without VNNI, and only there.
``--keep DIR`` keeps each bundle as ``DIR/<weights>-seed<seed>`` (a new folder) for
``benchmarks/bench_targets.py`` to time the formats against each other and the fp32 bundle.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from unittest import mock

from sam2edge.checks.bench.records import vector_extensions
from sam2edge.config import get_config
from sam2edge.export import onnx_int8 as eo
from sam2edge.export.onnx import export_onnx
from sam2edge.weights import synthetic_state_dict

SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}


def click_ious(config: str, seed: int, weights: str, keep: Path | None = None) -> dict:
    """End-to-end fidelity of one forced int8 export (``card.json``'s ``fidelity.end_to_end``), the bundle
    written under ``keep`` when given, else to a temporary folder."""
    cfg = get_config(config)
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(eo, "PORTABLE_WEIGHTS", weights),  # this format in encoder.onnx
        mock.patch.object(eo.ob, "has_vnni", lambda cpuinfo=None: False),  # no second encoder file
    ):
        out = (keep or Path(tmp)) / f"{weights}-seed{seed}"
        sd = synthetic_state_dict(cfg, seed=seed)
        card = export_onnx(sd, SOURCE, cfg, config, "int8", out, "bench", force=True)
    return card["fidelity"]["end_to_end"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--config", default="test-small")
    ap.add_argument("--weights", nargs="+", choices=list(eo.INT8_WEIGHTS), default=list(eo.INT8_WEIGHTS))
    ap.add_argument("--keep", type=Path, help="keep the bundles under this folder (must not exist)")
    args = ap.parse_args()
    if args.keep is not None:
        if args.keep.exists():
            raise SystemExit(f"error: {args.keep} exists; name a new folder for --keep")
        args.keep.mkdir(parents=True)
    print("vector extensions:", " ".join(vector_extensions(Path("/proc/cpuinfo").read_text())))
    print("| weights | seed | worst IoU | median IoU |\n|---|---|---|---|")
    for weights in args.weights:
        for seed in args.seeds:
            e2e = click_ious(args.config, seed, weights, args.keep)
            print(f"| {weights} | {seed} | {e2e['iou_worst']:.4f} | {e2e['iou_median']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
