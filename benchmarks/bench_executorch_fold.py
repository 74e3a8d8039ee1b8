"""ExecuTorch lowering with and without ``FoldConstants``: bytes, operators outside XNNPACK, time, outputs.

    python benchmarks/bench_executorch_fold.py memory-encoder fp16 [--config test-small] [--runs 20]

Lowers one video graph (random weights; ``fp16``: its ``HalfGraph``) twice, the exporter's transform passes
without and with ``executorch_lower.FoldConstants``, runs both programs on the graph's tracing sample and
prints each program's size, its census and its mean ``execute`` time, then the largest output difference
between the two (0 when folding is exact). Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import time

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.exir.pass_manager import ExportedProgramPassManager
from executorch.runtime import Runtime

from sam2edge.config import get_config, get_video_config
from sam2edge.export import executorch_lower as lo
from sam2edge.export import video as vid
from sam2edge.export.executorch import REWRITES
from sam2edge.export.half import HalfGraph
from sam2edge.model.sam2_video import build_sam2_video


def lower_and_run(module: torch.nn.Module, args: tuple, fold: bool, runs: int) -> tuple[int, dict, float, list]:
    """(program bytes, census, mean ms per execute, outputs) of ``module`` lowered with or without folding."""
    ep = lo.drop_unused_inputs(lo.export_legalized(module, args))
    passes = [p() for p in lo.TRANSFORM_PASSES if fold or p is not lo.FoldConstants]
    edge = to_edge_transform_and_lower(
        ep,
        transform_passes=ExportedProgramPassManager(passes),
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    counts = lo.census(edge.exported_program()).as_dict()
    prog = edge.to_executorch()
    method = Runtime.get().load_program(prog.buffer).load_method("forward")
    outputs = method.execute(list(args))
    start = time.perf_counter()
    for _ in range(runs):
        method.execute(list(args))
    return len(prog.buffer), counts, (time.perf_counter() - start) / runs * 1e3, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=list(vid.MODULES))
    ap.add_argument("precision", choices=["fp32", "fp16"])
    ap.add_argument("--config", default="test-small")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    cfg, vcfg = get_config(args.config), get_video_config(args.config)
    model = build_sam2_video(cfg, vcfg, REWRITES).eval()
    module = vid.MODULES[args.role](model)
    module = HalfGraph(module) if args.precision == "fp16" else module
    sample = tuple(vid.samples(cfg, vcfg, 8)[args.role].values())
    outs = {}
    for fold in (False, True):
        size, counts, ms, outs[fold] = lower_and_run(module, sample, fold, args.runs)
        print(f"{'folded' if fold else 'unfolded':9s} {size} bytes, {ms:.2f} ms, {counts}")
    diff = max(float((a - b).abs().max()) for a, b in zip(outs[False], outs[True]))
    print(f"largest output difference: {diff}")


if __name__ == "__main__":
    main()
