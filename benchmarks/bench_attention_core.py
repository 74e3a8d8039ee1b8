"""One full-size attention core, LiteRT with the queries in chunks vs whole, and onnxruntime.

    python benchmarks/bench_attention_core.py [--core memory|image] [--chunks 4096,1024,256,64] [--runs 5]
        [--threads 2]

``memory`` (default) is the memory attention's per-layer hot spot at 1024 px (Hiera-Tiny, 7 memory slots + 16
pointers): q (1, 4096, 256) @ kT (1, 256, 28736) -> softmax -> @ v (1, 28736, 64). ``image`` is one of Hiera-Tiny's
three global-attention blocks at 1024 px: 4 heads of q (4, 4096, 96) @ kT (4, 96, 4096) -> softmax -> @ v. A chunk of
n query rows is computed on its own (exact: rows are independent), which keeps its scores small enough for the cache
(``Rewrites.query_chunk`` / ``image_query_chunk``). Each form is converted with litert-torch, checked against eager,
and timed with ``invoke`` interleaved (inputs set once); the same core as one onnxruntime session is timed beside it.
Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from ai_edge_litert.interpreter import Interpreter
from torch import nn

from sam2edge.export.litert import convert_graph
from sam2edge.runtime.backends.onnx import make_session

CORES = {  # core -> input shapes
    "memory": {"q": (1, 4096, 256), "kt": (1, 256, 28736), "v": (1, 28736, 64)},
    "image": {"q": (4, 4096, 96), "kt": (4, 96, 4096), "v": (4, 4096, 96)},
}


class Core(nn.Module):
    """softmax(q @ kt) @ v, the queries in static chunks of ``chunk`` rows."""

    def __init__(self, chunk: int) -> None:
        super().__init__()
        self.chunk = chunk

    def forward(self, q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = [torch.softmax(q[:, i : i + self.chunk] @ kt, -1) @ v for i in range(0, q.shape[1], self.chunk)]
        return torch.cat(outs, 1) if len(outs) > 1 else outs[0]  # (B, 4096, dv)


def onnx_ms(inputs: dict[str, torch.Tensor], folder: Path, threads: int, runs: int) -> float:
    path = folder / "core.onnx"
    torch.onnx.export(Core(4096), tuple(inputs.values()), str(path), input_names=list(inputs), dynamo=False)
    sess, feed = make_session(path, threads=threads), {k: t.numpy() for k, t in inputs.items()}
    sess.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="4096,1024,256,64", help="query rows per chunk, comma list")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--core", choices=list(CORES), default="memory", help="which attention core (module doc)")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    inputs = {k: torch.randn(*s, generator=g) * (1.0 if k == "v" else 0.05) for k, s in CORES[args.core].items()}
    ref = Core(4096)(**inputs).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        interpreters = {}
        for chunk in (int(c) for c in args.chunks.split(",")):
            path = Path(tmp) / f"core_{chunk}.tflite"
            convert_graph(Core(chunk), inputs, path, "fp32")
            it = interpreters[chunk] = Interpreter(model_path=str(path), num_threads=args.threads)
            it.allocate_tensors()
            for d in it.get_input_details():  # set once: only invoke is timed
                it.set_tensor(d["index"], inputs[d["name"].removeprefix("serving_default_")].numpy())
            it.invoke()
            err = float(np.abs(it.get_tensor(it.get_output_details()[0]["index"]) - ref).max())
            print(f"chunk {chunk}: max |LiteRT - eager| {err:.3g}")
        times = {c: [] for c in interpreters}
        for _ in range(args.runs):  # interleaved rounds
            for c, it in interpreters.items():
                t0 = time.perf_counter()
                it.invoke()
                times[c].append((time.perf_counter() - t0) * 1e3)
        for c, t in times.items():
            p50, lo, hi = statistics.median(t), min(t), max(t)
            print(f"LiteRT, chunks of {c:5d} rows: p50 {p50:7.1f} ms  (min {lo:.1f}, max {hi:.1f})")
        print(f"onnxruntime, whole: p50 {onnx_ms(inputs, Path(tmp), args.threads, args.runs):7.1f} ms")


if __name__ == "__main__":
    main()
