"""Where does reduced precision lose the answer? Layer-by-layer fp16 vs fp32 localization.

Two views of one prompt (the worst of a click set), both on the eager model:

* **module view** (``module_errors``): the fp32 reference graph and the target's reduced-precision
  emulation (``EMULATIONS``) run side by side with a forward hook on every module of the
  ``Sam2ImageModel`` inside; each module call's output is compared (relative L2 error, max-abs,
  non-finite count, reference values beyond fp16's +-65504). The first call whose relative error
  jumps above ``JUMP_REL`` names the layer where the answer is lost.
* **op view** (``op_errors``): the fp32 reference runs under a dispatch mode that re-runs every aten op
  on its own inputs rounded to fp16, in fp16, and compares with the fp32 result. That is the *local*
  error of each op (no accumulated error), so it names the op and tensor that cannot be fp16: an
  output beyond +-65504 (inf in fp16), a NaN, or a large relative error (cancellation, softmax of
  large logits).

The emulations mirror what each exporter does (see ``EMULATIONS``); the exported runtimes are
measured separately by ``tests/test_fp16_robustness.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

FP16_MAX = 65504.0  # largest finite fp16 value
JUMP_REL = 1e-2  # module relative error that counts as "the answer is lost here"
FP16_TINY = 6.1e-5  # smallest normal fp16: a reference entirely below it is subnormal, its relative error moot
# ops whose output is a view / copy / cast of an input: no rounding of their own
PASSIVE_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "permute",
    "transpose",
    "t",
    "expand",
    "slice",
    "select",
    "unsqueeze",
    "squeeze",
    "clone",
    "alias",
    "detach",
    "_to_copy",
    "to",
    "lift_fresh",
    "contiguous",
    "split",
    "unbind",
    "copy_",
    "zeros_like",
    "empty_like",
    "full_like",
    "ones_like",
    "constant_pad_nd",
    "cat",
    "stack",
    "flip",
    "index",
}


@dataclass
class Stat:
    """One tensor compared with its fp32 reference."""

    where: str  # module path (module view) or "module path :: aten op #i" (op view)
    shape: tuple[int, ...]
    ref_max_abs: float  # max |reference|
    max_abs_err: float  # max |test - reference| over finite entries
    rel_err: float  # ||test - ref|| / ||ref|| over finite entries (inf when the test is all non-finite)
    nonfinite: int  # inf / NaN entries in the test tensor
    beyond_fp16: int  # reference entries with |x| > 65504 (not representable in fp16)


def compare_tensor(where: str, test: torch.Tensor, ref: torch.Tensor) -> Stat:
    """Stat of ``test`` against ``ref`` (same shape), computed in float64."""
    t, r = test.detach().double(), ref.detach().double()
    finite = torch.isfinite(t) & torch.isfinite(r)
    d = (t - r)[finite]
    rn = float(r[finite].norm()) if finite.any() else 0.0
    rel = float(d.norm()) / rn if rn else (0.0 if not d.numel() or not float(d.abs().max()) else math.inf)
    return Stat(
        where=where,
        shape=tuple(ref.shape),
        ref_max_abs=float(r[torch.isfinite(r)].abs().max()) if torch.isfinite(r).any() else math.inf,
        max_abs_err=float(d.abs().max()) if d.numel() else 0.0,
        rel_err=rel if finite.any() else math.inf,
        nonfinite=int((~torch.isfinite(t)).sum()),
        beyond_fp16=int((r.abs() > FP16_MAX).sum()),
    )


def _first_tensor(out) -> torch.Tensor | None:
    leaves, _ = tree_flatten(out)
    return next((x for x in leaves if isinstance(x, torch.Tensor) and x.is_floating_point()), None)


def _inner_model(graph: nn.Module) -> list[tuple[str, nn.Module]]:
    """Named modules of every ``Sam2ImageModel`` (or prompt encoder copy) inside ``graph``, relative names."""
    from sam2edge.model import Sam2ImageModel

    out = []
    for _, sub in graph.named_modules():
        if isinstance(sub, Sam2ImageModel):
            out += [(n, m) for n, m in sub.named_modules() if n]
            break
    return out


def record_modules(graph: nn.Module, inputs: tuple) -> dict[str, torch.Tensor]:
    """Run ``graph(*inputs)``; -> {"module.path#call": first float output} in call order."""
    seen: dict[str, int] = {}
    outputs: dict[str, torch.Tensor] = {}
    handles = []

    def hook(name):
        def fn(_module, _args, out):
            t = _first_tensor(out)
            if t is not None:
                k = seen.get(name, 0)
                seen[name] = k + 1
                outputs[f"{name}#{k}"] = t.detach().float().clone()

        return fn

    for name, module in _inner_model(graph):
        handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            graph(*inputs)
    finally:
        for h in handles:
            h.remove()
    return outputs


def module_errors(ref_graph: nn.Module, test_graph: nn.Module, inputs: tuple) -> list[Stat]:
    """Per module call (execution order), the test output vs the reference output."""
    ref = record_modules(ref_graph, inputs)
    test = record_modules(test_graph, inputs)
    return [compare_tensor(k, test[k], ref[k]) for k in ref if k in test and test[k].shape == ref[k].shape]


class _LocalFp16(TorchDispatchMode):
    """Re-runs each floating aten op on fp16-rounded inputs in fp16 and compares with its fp32 result."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack, self.stats, self.count = stack, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        ref = out if isinstance(out, torch.Tensor) else None
        if ref is None or ref.dtype != torch.float32 or name in PASSIVE_OPS or "dtype" in kwargs:
            return out

        def half(x):
            return x.half() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x

        try:
            test = func(*tree_map(half, args), **tree_map(half, kwargs))
        except (RuntimeError, NotImplementedError):  # no fp16 kernel on this host: nothing to learn
            return out
        self.count += 1
        where = f"{self.stack[-1] if self.stack else '<graph>'} :: aten.{name} #{self.count}"
        self.stats.append(compare_tensor(where, test, ref))
        return out


def op_errors(ref_graph: nn.Module, inputs: tuple) -> list[Stat]:
    """Local fp16 error of every floating aten op of the fp32 ``ref_graph`` (execution order)."""
    stack: list[str] = []
    handles = []

    def pop(_module, _args, _out) -> None:
        stack.pop()

    for name, module in _inner_model(ref_graph):
        handles.append(module.register_forward_pre_hook(lambda m, a, n=name: stack.append(n) and None))
        handles.append(module.register_forward_hook(pop))
    mode = _LocalFp16(stack)
    try:
        with torch.no_grad(), mode:
            ref_graph(*inputs)
    finally:
        for h in handles:
            h.remove()
    return mode.stats


def first_jump(stats: list[Stat], threshold: float = JUMP_REL) -> Stat | None:
    """The first stat that is non-finite, overflows fp16, or whose relative error exceeds ``threshold``."""
    for s in stats:
        if s.nonfinite or s.beyond_fp16 or _rel(s) > threshold:
            return s
    return None


def _rel(s: Stat) -> float:
    """Relative error, counted only where the reference is within fp16's normal range."""
    return s.rel_err if s.ref_max_abs >= FP16_TINY else 0.0


def worst(stats: list[Stat], n: int = 8) -> list[Stat]:
    """The ``n`` stats with the largest local damage (non-finite / overflow first, then relative error;
    tensors whose reference lies entirely below fp16's normal range rank last)."""
    return sorted(stats, key=lambda s: (s.nonfinite + s.beyond_fp16, _rel(s)), reverse=True)[:n]


def as_rows(stats: list[Stat]) -> list[dict]:
    return [asdict(s) for s in stats]


def format_stat(s: Stat) -> str:
    flags = []
    if s.nonfinite:
        flags.append(f"{s.nonfinite} inf/NaN")
    if s.beyond_fp16:
        flags.append(f"{s.beyond_fp16} ref values beyond +-65504")
    return (
        f"{s.where:<60} shape {list(s.shape)!s:<18} rel {s.rel_err:9.2e}  max-abs err {s.max_abs_err:9.2e}"
        f"  |ref| max {s.ref_max_abs:9.3g}" + (f"  [{', '.join(flags)}]" if flags else "")
    )


def worst_prompt(ious: list[float]) -> int:
    """Index of the prompt with the lowest mask IoU (first on ties)."""
    return int(np.argmin(np.asarray(ious)))


Progress = Callable[[int, int], None]
