"""LayerNorm rewrites side by side: eager time of "scaled" / "safe" / "native" at fp32 and fp16, same run.

Usage: python benchmarks/bench_layer_norm.py [--repeats 50] [--threads 1]
Prints the median time per call for each (rewrite, dtype) on Hiera-Tiny-like shapes and the ratio to
"safe" (the previous default). Eager CPU timings are a proxy for the op-count cost in exported graphs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sam2edge.model import Rewrites
from sam2edge.model.layers import LayerNorm

SHAPES = {"hiera stage 1 (1x256x256x96)": (1, 256, 256, 96), "decoder keys (1x4096x256)": (1, 4096, 256)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for label, shape in SHAPES.items():
        x32 = torch.randn(*shape)
        for dtype in (torch.float32, torch.float16):
            times = {}
            for kind in ("safe", "scaled", "native"):
                ln = LayerNorm(shape[-1], 1e-6, Rewrites(layer_norm=kind)).to(dtype)
                x = x32.to(dtype)
                runs = []
                with torch.no_grad():
                    for _ in range(a.repeats * 3):  # median of 3 x repeats calls per kind (kinds run one after another)
                        t = time.perf_counter()
                        ln(x)
                        runs.append(time.perf_counter() - t)
                times[kind] = statistics.median(runs)
            ratios = ", ".join(f"{k} {v * 1e3:.2f} ms ({v / times['safe']:.2f}x)" for k, v in times.items())
            print(f"{label} {str(dtype).split('.')[-1]}: {ratios}")


if __name__ == "__main__":
    main()
