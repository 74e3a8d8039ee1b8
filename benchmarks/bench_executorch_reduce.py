"""ExecuTorch XNNPACK: a mean over one dim as a GEMM with a constant 1/C column (shipped) or as XNNPACK's
global average pool over (M, 1, 1, C) (the earlier form), side by side on the full-size graphs.

    python benchmarks/bench_executorch_reduce.py [--graphs decoder encoder] [--runs 30] [--profile]

For each graph (Hiera-Tiny at 1024 px, random weights), both forms are lowered as the exporter lowers them
(``executorch_lower.lower``, XNNPACK partitioner), checked against the eager module (largest output error
relative to its scale, delegate count), then timed in interleaved rounds with the ExecuTorch runtime (its
default thread pool). ``--profile`` adds each form's ETDump time per XNNPACK operator type. Nothing else
should run meanwhile.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime

from sam2edge.checks.bench.profile import etdump_kinds, interleaved_ms
from sam2edge.config import get_config
from sam2edge.export import executorch_lower as lowering
from sam2edge.export.executorch import MAX_POINTS, REWRITES
from sam2edge.export.executorch_graphs import XnnDecoderGraph, XnnEncoderGraph, decoder_inputs, encoder_inputs
from sam2edge.model import build_sam2

aten = torch.ops.aten


def pooled_rows(g: torch.fx.Graph, rows: torch.fx.Node, c: int, dtype: torch.dtype, total: bool) -> torch.fx.Node:
    """The previous rule's reduction: (M, C) viewed as (M, 1, 1, C), XNNPACK's global average pool over the last
    two dims (x C for a sum). ``executorch_lower._reduce_one_dim`` does the moving and viewing around it."""
    y = g.call_function(aten.reshape.default, (rows, [-1, 1, 1, c]))  # (M, 1, 1, C)
    y = g.call_function(aten.mean.dim, (y, [2, 3], True))  # (M, 1, 1, 1)
    return g.call_function(aten.mul.Tensor, (y, float(c))) if total else y


FORMS = {"gemm (shipped)": lowering.gemm_rows, "global pool (before)": pooled_rows}


def lowered(graph: torch.nn.Module, args: tuple, reduce_rows, file: Path):
    """Lower ``graph`` with ``reduce_rows`` in every mean and sum; -> (loaded method, delegates, relative error)."""
    rule = functools.partial(lowering._reduce_one_dim, reduce_rows=reduce_rows)
    saved = dict(lowering.REWRITES)
    lowering.REWRITES.update({aten.mean.dim: rule, aten.sum.dim_IntList: rule})
    try:
        prog, census = lowering.lower(graph, args, [XnnpackPartitioner()])
    finally:
        lowering.REWRITES.update(saved)
    file.write_bytes(prog.buffer)
    method = Runtime.get().load_program(file).load_method("forward")
    with torch.no_grad():
        want = graph(*args)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = method.execute(list(args))
    err = max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want) if w.is_floating_point())
    return method, census.delegates, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", choices=("decoder", "encoder"), default=["decoder"])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cfg = get_config("sam2.1-hiera-tiny")
    torch.manual_seed(0)
    model = build_sam2(cfg, REWRITES).eval()
    model.load_state_dict({k: torch.randn_like(v) * 0.05 for k, v in model.state_dict().items()})
    samples = {
        "decoder": (XnnDecoderGraph(model).eval(), decoder_inputs(cfg, MAX_POINTS)),
        "encoder": (XnnEncoderGraph(model).eval(), encoder_inputs(cfg)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.graphs:
            graph, sample = samples[name]
            methods = {}
            for form, reduce_rows in FORMS.items():
                file = Path(tmp) / f"{name}-{form.split()[0]}.pte"
                methods[form], delegates, err = lowered(graph, sample, reduce_rows, file)
                print(f"{name} {form}: {delegates} delegate(s), largest output error {err:.1e} of the scale")
            calls = {form: functools.partial(method.execute, list(sample)) for form, method in methods.items()}
            times = interleaved_ms(calls, args.runs)
            print(f"\n{name}, {args.runs} interleaved runs | p50 ms | p10 - p90")
            for form, ts in times.items():
                q = statistics.quantiles(ts, n=10)
                print(f"  {form:22s} | {statistics.median(ts):7.1f} | {q[0]:.1f} - {q[-1]:.1f}")
            if args.profile:
                for form in methods:
                    kinds = etdump_kinds(Path(tmp) / f"{name}-{form.split()[0]}.pte", list(sample), 5)
                    print(f"  ETDump, {form}: " + ", ".join(f"{k} {ms:.1f}" for k, ms in list(kinds.items())[:6]))


if __name__ == "__main__":
    main()
