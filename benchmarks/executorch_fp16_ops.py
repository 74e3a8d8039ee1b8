"""Which operations XNNPACK's fp16 kernels compute less exactly than eager fp16 (ExecuTorch's fp16 encoder).

    .venv/bin/python benchmarks/executorch_fp16_ops.py

Each row lowers one small graph the way the export lowers the fp16 encoder (``half.HalfGraph``: fp16 weights and
arithmetic, fp32 I/O; ``executorch.lower_program``) and prints its relative L2 error (``|a - b| / |b|``) against
fp32 eager, beside eager fp16 on the CPU (what ``export.precision.fp16_arithmetic``, the fp16 selection's emulation,
computes). The shapes are the full-size Hiera-Tiny encoder's: LayerNorm and mean over 96 (stage 1) and 768
(stage 4) channels of a 4096-token map, softmax over 256 (a windowed block's keys) and 4096 tokens (a global block
at stage 3; also in the shifted form, ``Rewrites.softmax``), products with 96 to 3072 terms, GELU. Where the
program's error is well above eager fp16's, the eager emulation underestimates XNNPACK and the export's own check on
the real program refuses what the emulation passed (docs/design/precision.md). XNNPACK's fp16 kernels differ by CPU
(fp16 arithmetic native, or through fp32): the first line printed names this one's. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch
from torch import nn


class Mean(nn.Module):
    def forward(self, x):
        return x.mean(-1, keepdim=True)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class ShiftedSoftmax(nn.Module):
    def forward(self, x):
        from sam2edge.model.layers import Rewrites, softmax_keys

        return softmax_keys(x, Rewrites(softmax="shifted"))


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v)


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


class Gelu(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x)


def cases() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """name -> (graph, inputs): activations of the encoder's magnitudes (fixed seed)."""
    from sam2edge.export.executorch import REWRITES
    from sam2edge.model.layers import LayerNorm

    g = torch.Generator().manual_seed(0)
    out = {}
    for c in (96, 768):
        x = torch.randn(1, 4096, c, generator=g) * 3 + 1.5  # (1, tokens, channels)
        for form in ("scaled", "native"):  # scaled: the export's form; native: aten.layer_norm
            norm = LayerNorm(c, 1e-6, dataclasses.replace(REWRITES, layer_norm=form))
            with torch.no_grad():
                norm.weight.copy_(torch.rand(c, generator=g) + 0.5)
                norm.bias.copy_(torch.randn(c, generator=g) * 0.1)
            out[f"LayerNorm ({form}), {c} channels"] = (norm, (x,))
        out[f"mean over {c} channels"] = (Mean(), (x,))
    for t in (256, 4096):
        scores = torch.randn(1, 1, 64, t, generator=g) * 4
        out[f"softmax over {t} tokens"] = (Softmax(), (scores,))
        out[f"softmax over {t} tokens, shifted (``Rewrites.softmax``)"] = (ShiftedSoftmax(), (scores,))
        q, k, v = (torch.randn(1, 1, t, 64, generator=g) for _ in range(3))  # (B, heads, tokens, head dim)
        out[f"SDPA over {t} tokens"] = (Sdpa(), (q, k, v))
    for k in (96, 768, 3072):
        w = torch.randn(k, 256, generator=g) / math.sqrt(k)
        out[f"matmul, {k} terms"] = (MatMul(), (torch.randn(1, 1024, k, generator=g), w))
    out["GELU"] = (Gelu(), (torch.randn(1, 4096, 384, generator=g) * 3,))
    return out


def lowered(graph: nn.Module, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``graph``'s fp16 program (XNNPACK), run once on ``args``: its first output."""
    from executorch.runtime import Runtime

    from sam2edge.export.executorch import lower_program
    from sam2edge.export.half import HalfGraph

    program, _ = lower_program(HalfGraph(graph).eval(), args, "fp16", "encoder")
    data = program.buffer  # read in place by the loaded program: held until it has run
    return Runtime.get().load_program(data).load_method("forward").execute(list(args))[0]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from sam2edge.checks.bench.records import machine
    from sam2edge.export.half import HalfGraph

    torch.set_num_threads(1)
    m = machine()  # XNNPACK's fp16 kernels differ by the CPU's fp16 arithmetic
    print(f"{m['cpu']}, fp16 arithmetic {m['fp16_arithmetic']}\n")
    print("| graph | eager fp16 | XNNPACK fp16 | ratio |\n|---|---|---|---|")
    for name, (graph, args) in cases().items():
        with torch.no_grad():
            ref, eager = graph(*args), HalfGraph(graph)(*args)[0]
        program = lowered(graph, args)
        e, p = rel(eager, ref), rel(program, ref)
        print(f"| {name} | {e:.2e} | {p:.2e} | {p / e:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
