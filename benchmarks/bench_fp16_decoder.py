"""Speed cost of keeping the decoder in fp32 in fp16 bundles: one decoder call, fp16 vs fp32.

Usage: python benchmarks/bench_fp16_decoder.py [--config sam2.1-hiera-tiny] [--resolution 1024]
       [--targets onnx,executorch] [--repeats 30] [--threads 1]

For each target, the decoder graph (``XnnDecoderGraph``: prompt encoder + mask decoder, the prompt slots of
decoder.pte) is built with the target's rewrites from synthetic weights, converted once with all weights and
activations fp16 (what fp16 bundles shipped before) and once fp32 (what they ship now), and each is timed on the
same inputs (warm-up 3 calls, then the median of ``--repeats``), interleaved. ONNX: legacy exporter at
OPSET, onnxruntime CPU; ExecuTorch: XNNPACK lowering, ExecuTorch runtime. Prints ms per call and the ratio
fp32 / fp16 (> 1: keeping fp32 costs time). Timings on a loaded machine are meaningless; run it quiet.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from sam2edge.config import get_config
from sam2edge.export.executorch_graphs import XnnDecoderGraph, decoder_inputs
from sam2edge.model import build_sam2
from sam2edge.runtime.backends.executorch import MAX_POINTS
from sam2edge.weights import synthetic_state_dict


def _graph(cfg, rewrites, half: bool) -> torch.nn.Module:
    model = build_sam2(cfg, rewrites)
    model.load_state_dict(synthetic_state_dict(cfg, 0))
    return XnnDecoderGraph(model.half() if half else model).eval()


def _onnx(graph, args, folder: Path, threads: int):
    import onnxruntime as ort

    from sam2edge.export.onnx import OPSET

    path = folder / f"decoder_{id(graph)}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python ints in the graph
        torch.onnx.export(graph, args, str(path), dynamo=False, opset_version=OPSET, do_constant_folding=True)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return lambda: sess.run(None, feed)


def _executorch(graph, args, folder: Path, threads: int):
    from sam2edge.export.executorch import lower_program
    from sam2edge.runtime.backends.executorch import load_method

    prog, _ = lower_program(graph, args, "fp32", "decoder")
    path = folder / f"decoder_{id(graph)}.pte"
    path.write_bytes(prog.buffer)
    method = load_method(path, "benchmark")
    return lambda: method.execute(list(args))


TARGETS = {"onnx": _onnx, "executorch": _executorch}


def _rewrites(target: str):
    from sam2edge.export.executorch import REWRITES
    from sam2edge.export.onnx import ONNX_REWRITES

    return {"onnx": ONNX_REWRITES, "executorch": REWRITES}[target]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--resolution", type=int, default=1024)
    ap.add_argument("--targets", default="onnx,executorch")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = get_config(a.config).at_resolution(a.resolution)
    args = decoder_inputs(cfg, MAX_POINTS)
    with tempfile.TemporaryDirectory() as tmp:
        for target in a.targets.split(","):
            calls = {
                p: TARGETS[target](_graph(cfg, _rewrites(target), p == "fp16"), args, Path(tmp), a.threads)
                for p in ("fp16", "fp32")
            }
            times: dict[str, list[float]] = {p: [] for p in calls}
            for _ in range(3):
                for call in calls.values():
                    call()
            for _ in range(a.repeats):
                for p, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    times[p].append(1e3 * (time.perf_counter() - t0))
            med = {p: statistics.median(t) for p, t in times.items()}
            print(
                f"{target} decoder, {a.config} at {a.resolution}px, {a.threads} thread(s): fp16 {med['fp16']:.2f} ms, "
                f"fp32 {med['fp32']:.2f} ms per call (fp32 / fp16 = {med['fp32'] / med['fp16']:.2f}x; "
                f"spread fp16 {np.std(times['fp16']):.2f}, fp32 {np.std(times['fp32']):.2f} ms)",
                flush=True,
            )


if __name__ == "__main__":
    main()
