"""ExecuTorch lowering: graph legalization for XNNPACK, lowering, op census.

XNNPACK's delegate takes a narrower op set than the model uses. ``legalize_for_xnnpack`` rewrites the
exported ATen graph (then exported again) so that each such operation becomes an identical one the
delegate accepts (no approximation), and LayerNorm, attention and GELU land inside the delegate:

  * ``mean.dim`` / ``sum.dim_IntList`` over one dim of any rank (LayerNorm, LayerNorm2d, stability
    counts) -> move that dim last, view as (M, C) and multiply by a constant (C, 1) column of 1/C (a sum:
    of ones), i.e. one GEMM with static weights. XNNPACK's only reduction, global average pooling, wants
    the reduced dims in an NHWC layout: on (M, 1, 1, C) it ran a transpose and a one-channel pool per
    mean (full size, ``benchmarks/bench_executorch_reduce.py``: the decoder 0.68-0.77x and the encoder 0.91x
    of the pooled form's time);
  * ``upsample_nearest2d`` by 2 (FPN top-down) -> interleaving concatenations of the input with
    ``input * 1.0`` (exact copies; XNNPACK has no nearest resize and needs two distinct cat inputs);
  * ``select`` (one index of a dim) -> a slice of length 1 and a squeeze;
  * fp16 ``gelu`` -> an erf-free form of the exact GELU (``_gelu_erf_free``: erf to 1.5e-7, far below fp16
    resolution) from operators XNNPACK runs in fp16, so GELU no longer splits the fp16 delegate;
  * no-op ``expand_copy`` (left by the 4-D matmul decomposition at batch 1) -> removed (edge pass);
  * casts of constants folded (edge pass, ``FoldConstants``): the edge dialect turns each Python scalar of an
    fp16 graph's mul / add / sub into a 0-dim fp32 tensor plus a cast to fp16 that ran on the portable
    runtime at every call (124 of the 131 operators left outside the test-small fp16 memory encoder);
    folded, they are fp16 constants inside the delegate (outputs bit-identical, measured).

``lower`` runs export -> to_edge_transform_and_lower(partitioner) -> to_executorch and returns the
program with its census (delegated vs total operators).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch
from executorch.backends.xnnpack._passes.remove_noop_expand_copy_pass import RemoveNoopExpandCopyPass
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.pass_manager import ExportedProgramPassManager
from executorch.exir.passes.constant_prop_pass import constant_prop_pass

from sam2edge.export.provenance import shared_provenance

aten = torch.ops.aten
_STRUCTURAL = ("getitem", "alloc", "executorch_call_delegate")


def _shape(node: torch.fx.Node) -> list[int]:
    return list(node.meta["val"].shape)


def _column(g: torch.fx.Graph, c: int, value: float, dtype: torch.dtype) -> torch.fx.Node:
    """A constant (1, C) weight row of ``value`` on the graph's module, one per (C, value, dtype)."""
    gm = g.owning_module
    name = f"_xnn_reduce_{c}_{'ones' if value == 1.0 else 'mean'}_{str(dtype).split('.')[-1]}"
    if not hasattr(gm, name):
        gm.register_buffer(name, torch.full((1, c), value, dtype=dtype))
    return g.get_attr(name)


def gemm_rows(g: torch.fx.Graph, rows: torch.fx.Node, c: int, dtype: torch.dtype, total: bool) -> torch.fx.Node:
    """(M, C) rows -> (M, 1) means (``total``: sums) as one GEMM with a constant 1/C (ones) column."""
    return g.call_function(aten.linear.default, (rows, _column(g, c, 1.0 if total else 1.0 / c, dtype)))


def _reduce_one_dim(g: torch.fx.Graph, node: torch.fx.Node, reduce_rows=gemm_rows) -> torch.fx.Node | None:
    """mean/sum over one dim d of any rank -> move d last, view as (M, C) rows, ``reduce_rows`` (default
    ``gemm_rows``; ``benchmarks/bench_executorch_reduce.py`` passes the former pooled form), back to the
    reduced shape."""
    x, dims = node.args[0], node.args[1]
    keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    shape = _shape(x)
    rank = len(shape)
    if node.kwargs.get("dtype") is not None or dims is None or len(dims) != 1 or rank < 1:
        return None
    d = dims[0] % rank
    perm = [i for i in range(rank) if i != d] + [d]
    y = x if d == rank - 1 else g.call_function(aten.permute.default, (x, perm))
    c = shape[d]
    y = g.call_function(aten.reshape.default, (y, [math.prod(shape) // c, c]))  # (M, C)
    y = reduce_rows(g, y, c, x.meta["val"].dtype, node.target == aten.sum.dim_IntList)  # (M, 1)
    y = g.call_function(aten.reshape.default, (y, [shape[i] for i in range(rank) if i != d] + [1]))
    if d != rank - 1:
        y = g.call_function(aten.permute.default, (y, [perm.index(i) for i in range(rank)]))
    if not keepdim:
        y = g.call_function(aten.squeeze.dims, (y, [d]))
    return y


def _nearest_2x(g: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """upsample_nearest2d by exactly 2 -> interleave copies with two concatenations (exact)."""
    x = node.args[0]
    b, c, h, w = _shape(x)
    if list(_shape(node)) != [b, c, 2 * h, 2 * w]:
        return None
    y = g.call_function(aten.reshape.default, (x, [b, c * h, w, 1]))  # (B, C*H, W, 1)
    y = g.call_function(aten.cat.default, ([y, g.call_function(aten.mul.Tensor, (y, 1.0))], 3))  # (B, C*H, W, 2)
    y = g.call_function(aten.reshape.default, (y, [b, c * h, 1, 2 * w]))  # (B, C*H, 1, 2W)
    y = g.call_function(aten.cat.default, ([y, g.call_function(aten.mul.Tensor, (y, 1.0))], 2))  # (B, C*H, 2, 2W)
    return g.call_function(aten.reshape.default, (y, [b, c, 2 * h, 2 * w]))  # (B, C, 2H, 2W)


def _select(g: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """select (one index of a dim) -> slice of length 1 + squeeze."""
    x, dim, index = node.args
    shape = _shape(x)
    d, i = dim % len(shape), index % shape[dim]
    y = g.call_function(aten.slice.Tensor, (x, d, i, i + 1))
    return g.call_function(aten.squeeze.dims, (y, [d]))


# erf(z) for z >= 0 as 1 - (a1 t + ... + a5 t^5) exp(-z^2), t = 1 / (1 + p z): Abramowitz & Stegun 7.1.26,
# absolute error <= 1.5e-7, i.e. thousands of times below fp16's resolution (~1e-3 relative)
ERF_P, ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu_erf_free(g: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node | None:
    """fp16 exact-form GELU -> 0.5 x + 0.5 |x| erf(|x| / sqrt 2) with erf from ``ERF_A`` (abs, mul, add,
    div, exp: operators XNNPACK runs in fp16; t = 1 / (1 + p z) is written 1 - p z / (1 + p z) because
    XNNPACK takes a tensor division but no reciprocal). XNNPACK's own fp16 GELU is an approximation the partitioner
    leaves out (measured up to 15 % off), so each fp16 GELU split the delegate and ran on the portable
    kernel; with this form it stays inside. x erf(x / sqrt 2) = |x| erf(|x| / sqrt 2): no sign needed."""
    x = node.args[0]
    if x.meta["val"].dtype != torch.float16 or node.kwargs.get("approximate", "none") != "none":
        return None
    f = g.call_function
    ax = f(aten.abs.default, (x,))
    z = f(aten.mul.Tensor, (ax, 1.0 / math.sqrt(2.0)))
    y = f(aten.add.Tensor, (f(aten.mul.Tensor, (z, ERF_P)), 1.0))  # 1 + p z
    t = f(aten.rsub.Scalar, (f(aten.mul.Tensor, (f(aten.div.Tensor, (z, y)), ERF_P)), 1.0))  # 1 - p z / (1 + p z)
    poly = f(aten.mul.Tensor, (t, ERF_A[-1]))
    for a in reversed(ERF_A[:-1]):  # Horner: ((a5 t + a4) t + a3) t ... then * t
        poly = f(aten.mul.Tensor, (f(aten.add.Tensor, (poly, a)), t))
    e = f(aten.exp.default, (f(aten.neg.default, (f(aten.mul.Tensor, (z, z)),)),))
    erf = f(aten.rsub.Scalar, (f(aten.mul.Tensor, (poly, e)), 1.0))  # 1 - poly * exp(-z^2)
    half_x = f(aten.mul.Tensor, (x, 0.5))
    return f(aten.add.Tensor, (half_x, f(aten.mul.Tensor, (f(aten.mul.Tensor, (ax, 0.5)), erf))))


REWRITES = {
    aten.gelu.default: _gelu_erf_free,
    aten.mean.dim: _reduce_one_dim,
    aten.sum.dim_IntList: _reduce_one_dim,
    aten.upsample_nearest2d.vec: _nearest_2x,
    aten.select.int: _select,
}


def legalize_for_xnnpack(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Apply ``REWRITES`` to an exported (ATen) graph module in place; the caller re-exports it."""
    g = gm.graph
    for node in list(g.nodes):
        rule = REWRITES.get(node.target) if node.op == "call_function" else None
        if rule is None:
            continue
        with g.inserting_before(node):
            new = rule(g, node)
        if new is not None:
            node.replace_all_uses_with(new)
            g.erase_node(node)
    g.lint()
    gm.recompile()
    return gm


class FoldConstants(ExportedProgramPassBase):
    """ExecuTorch's constant propagation on the edge program (before partitioning), restricted to dtype
    casts: a cast of a constant becomes the cast constant. (Unrestricted, it also folds the baked window
    position embedding's tiling into a full-size tensor: the test-small fp32 encoder.pte grew to 1.26x
    its parameter bytes.)"""

    def call(self, exported_program: torch.export.ExportedProgram) -> ExportedProgramPassResult:
        from executorch.exir.dialects._ops import ops as exir_ops

        cast = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
        targets = {n.target for n in exported_program.graph.nodes if n.op == "call_function"}
        skip = targets - {cast}  # every other operator stays as it is
        return ExportedProgramPassResult(constant_prop_pass(exported_program, custom_skip_targets=skip), True)


TRANSFORM_PASSES = (RemoveNoopExpandCopyPass, FoldConstants)


@dataclass
class Census:
    """Operators of one lowered program: inside delegates vs left to the portable runtime."""

    delegates: int = 0
    delegated_ops: int = 0
    portable_ops: Counter = field(default_factory=Counter)

    @property
    def total_ops(self) -> int:
        return self.delegated_ops + sum(self.portable_ops.values())

    def as_dict(self) -> dict:
        return {
            "delegates": self.delegates,
            "delegated_ops": self.delegated_ops,
            "total_ops": self.total_ops,
            "outside_delegate": dict(sorted(self.portable_ops.items())),
        }


def _is_op(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and not any(s in str(node.target) for s in _STRUCTURAL)


def _op_name(node: torch.fx.Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return name.replace("aten.", "").split(".")[0] if "." in name else name


def census(edge_program) -> Census:
    """Count operators in and out of delegates of a lowered ``ExportedProgram``."""
    c = Census()
    gm = edge_program.graph_module
    for node in gm.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            c.delegates += 1
            lowered = getattr(gm, node.args[0].target)
            c.delegated_ops += sum(1 for n in lowered.original_module.graph.nodes if _is_op(n))
        elif _is_op(node):
            c.portable_ops[_op_name(node)] += 1
    return c


def drop_unused_inputs(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Remove parameters, buffers and constants the graph never reads (in place).

    torch.export lifts every tensor of the module, used or not: the model's non-persistent derived buffers
    (baked window pos-embed, image PE, no-mask dense, flipped conv weights) and the parts of the model the
    other program uses would otherwise be serialized into the .pte as constants.
    """
    from torch.export.graph_signature import InputKind

    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    nodes = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    unused = [s for s in ep.graph_signature.input_specs if s.kind in kinds and not nodes[s.arg.name].users]
    for spec in unused:
        ep.graph_signature.input_specs.remove(spec)
        ep.state_dict.pop(spec.target, None)
        ep.constants.pop(spec.target, None)
        ep.graph_module.graph.erase_node(nodes[spec.arg.name])
    ep.graph_module.recompile()
    return ep


def export_legalized(module: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """torch.export, rewrite for XNNPACK (``legalize_for_xnnpack``), export the rewritten graph again."""
    with torch.no_grad():
        gm = torch.export.export(module, args, strict=False).module()
        return torch.export.export(legalize_for_xnnpack(gm), args, strict=False)


def lower(module: torch.nn.Module, args: tuple, partitioners: list, legalize: bool = True):
    """(legalize and) export -> lower with ``partitioners`` -> (ExecutorchProgramManager, Census)."""
    with shared_provenance():
        return _lower(module, args, partitioners, legalize)


def _lower(module: torch.nn.Module, args: tuple, partitioners: list, legalize: bool):
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    if legalize:
        ep = export_legalized(module, args)
    else:
        with torch.no_grad():
            ep = torch.export.export(module, args, strict=False)
    ep = drop_unused_inputs(ep)
    edge = to_edge_transform_and_lower(
        ep,
        transform_passes=ExportedProgramPassManager([p() for p in TRANSFORM_PASSES]),
        partitioner=partitioners,
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    counts = census(edge.exported_program())
    return edge.to_executorch(), counts
