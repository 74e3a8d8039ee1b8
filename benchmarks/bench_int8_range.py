"""ONNX int8 weight formats (``export.onnx.INT8_WEIGHTS``: u8, s8, s8 7-bit): the int8 bar on this CPU, per seed.

    python benchmarks/bench_int8_range.py [--seeds 0 1] [--config test-small] [--weights u8 s8 s8-7bit]

Exports the ONNX int8 bundle once per weight format and seed (random weights; ``export.onnx.quantize_int8``
with each format) with ``--force``, so a bundle under the bar is still measured, and
prints the end-to-end click IoU (worst / median against eager fp32) beside the CPU's vector extensions:
u8 x s8 MatMulInteger saturates its int16 pair sums on x86 CPUs without VNNI, and only there.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from unittest import mock

from sam2edge.checks.bench.records import vector_extensions
from sam2edge.config import get_config
from sam2edge.export import onnx as eo
from sam2edge.weights import synthetic_state_dict

SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}


def click_ious(config: str, seed: int, weights: str) -> dict:
    """End-to-end fidelity of one forced int8 export (``card.json``'s ``fidelity.end_to_end``)."""
    cfg = get_config(config)
    quantize = functools.partial(eo.quantize_int8, weights=weights)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(eo, "quantize_int8", quantize):
        sd = synthetic_state_dict(cfg, seed=seed)
        card = eo.export_onnx(sd, SOURCE, cfg, config, "int8", Path(tmp) / "int8", "bench", force=True)
    return card["fidelity"]["end_to_end"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--config", default="test-small")
    ap.add_argument("--weights", nargs="+", choices=list(eo.INT8_WEIGHTS), default=list(eo.INT8_WEIGHTS))
    args = ap.parse_args()
    print("vector extensions:", " ".join(vector_extensions(Path("/proc/cpuinfo").read_text())))
    print("| weights | seed | worst IoU | median IoU |\n|---|---|---|---|")
    for weights in args.weights:
        for seed in args.seeds:
            e2e = click_ious(args.config, seed, weights)
            print(f"| {weights} | {seed} | {e2e['iou_worst']:.4f} | {e2e['iou_median']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
