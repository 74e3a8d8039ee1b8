"""fp16 arithmetic graphs with fp32 I/O, shared by every fp16 program that runs fp16 kernels (ExecuTorch's
encoder, ONNX's and ExecuTorch's video graphs): ``HalfGraph`` is a graph's fp16 copy whose floating inputs are
cast in and outputs cast out; ``half_except`` leaves named submodules in fp32 (``Fp32Island``), the parts the
measured fp16 selection keeps (``export.mixed``)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def cast_floats(x, dtype: torch.dtype):
    """``x`` (a tensor, or a tuple / list of them) with its floating tensors cast to ``dtype``."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(cast_floats(v, dtype) for v in x)
    return x


class Fp32Island(nn.Module):
    """``module`` computed in fp32 inside an fp16 graph: floating inputs cast to fp32, floating outputs cast
    back to fp16. XNNPACK converts no dtypes at this ExecuTorch version (its partitioner refuses a dtype-changing
    ``_to_dim_order_copy``), so the casts run on the portable kernels and each island is a delegate of its own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        kwargs = {k: cast_floats(v, torch.float32) for k, v in kwargs.items()}
        return cast_floats(self.module(*cast_floats(args, torch.float32), **kwargs), torch.float16)


def half_except(module: nn.Module, keep: tuple[str, ...] = ()) -> nn.Module:
    """A copy of ``module`` with fp16 weights and arithmetic, except the submodules named in ``keep`` (module
    names under ``module``), which keep their fp32 weights and run fp32 (``Fp32Island``). ``module`` is left
    as it is."""
    out = copy.deepcopy(module).half()
    fp32 = dict(module.named_modules())
    for name in keep:
        if name not in fp32:
            raise KeyError(f"{name!r} is not a submodule (fp16 arithmetic keeps whole modules fp32)")
        parent, _, leaf = name.rpartition(".")
        out.get_submodule(parent)._modules[leaf] = Fp32Island(copy.deepcopy(fp32[name]))
    return out


class HalfGraph(nn.Module):
    """``graph`` with fp16 weights and arithmetic, the submodules of ``keep`` (names under ``graph``) in fp32;
    floating inputs are cast to fp16 and the outputs, always a tuple, back to fp32. (The submodule is not called
    ``graph``: torch.export's unlifted ``GraphModule`` has its own ``graph`` attribute, and the lifted weights'
    paths under it then break ``ExportedProgram.module()``, which ExecuTorch's lowering calls.)"""

    def __init__(self, graph: nn.Module, keep: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.inner = half_except(graph, keep)

    def forward(self, *args) -> tuple[torch.Tensor, ...]:
        out = self.inner(*cast_floats(args, torch.float16))
        out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        return cast_floats(out, torch.float32)
