"""What an ExecuTorch XNNPACK program stores, and fp16 storage with fp32 arithmetic.

``parameter_bytes`` / ``program_tensor_bytes``: the bytes a program's tensors take as XNNPACK serializes them,
the base of the export's size check.

``fp16_linear_storage``: the fp16 recipe for weights whose fp16 arithmetic cannot meet the fp16 bars (a
checkpoint with outlier channels: rounding the encoder's activations to fp16 between operators already costs
the worst mask IoU, ``benchmarks/fp16_floor.py``). The program computes in fp32, as LiteRT's and ONNX's fp16
bundles do, and stores each Linear weight as fp16: XNNPACK's fully-connected operator takes a static fp16
filter beside fp32 activations (``xnn_datatype_fp16`` filter, fp32 input) and converts it once, when it packs
the weights, so a call runs the fp32 kernels on fp16-rounded weights (measured at test-small: the encoder's
outputs match eager fp32 on the same rounded weights to 1e-5, ``tests/test_executorch_storage.py``).

ExecuTorch 1.5.1 has no option for this: its serializer writes a static tensor at the dtype of the graph
node, and a Linear whose weight is fp16 beside an fp32 input fails the edge dialect's dtype check before
lowering. ``fp16_linear_storage`` therefore decides the dtype where the serializer does: while it is active,
``NodeVisitor.get_serialized_dtype`` says fp16 and ``get_param_tensor`` hands over the fp16 copy for exactly the
named weights that a delegated ``aten.linear`` multiplies by (its input 1); every other tensor is written as
before. Both names are checked on entry, so an ExecuTorch that moves them fails loudly instead of writing
fp32 weights; the test checks the bytes and the outputs of the program it lowers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from sam2edge.model import Sam2ImageModel
from sam2edge.model.image_encoder import QKV

# parameter name prefixes of decoder.pte (the rest of the image model is the encoder program's)
DECODER_PARTS = ("sam_prompt_encoder.", "sam_mask_decoder.")
ENCODER_ONLY = ("sam_mask_decoder.conv_s0.", "sam_mask_decoder.conv_s1.")  # folded into the encoder graph

# ExecuTorch's XNNPACK backend serializes every convolution's weight and bias as fp32, in fp16 programs too
# (backends/xnnpack/operators/op_conv2d.py: define_tensor(..., force_fp32=True)); XNNPACK converts them when
# it packs the fp16 operator. Measured in the test-small fp16 memory encoder: each of its 13 conv tensors is
# stored fp32 beside fp16 Linears (the 256x64x3x3 downsampler weight alone is 589,824 bytes).
CONV_STORED_BYTES = 4  # per element of a convolution's weight or bias, at every precision but int8's


def _in(name: str, parts: tuple[str, ...]) -> bool:
    """Whether ``name`` lies under one of ``parts`` (module names, matched whole, at any depth of ``name``)."""
    dotted = "." + name + "."
    return any("." + p + "." in dotted for p in parts)


def parameter_bytes(
    model: Sam2ImageModel, precision: str, kept: tuple[str, ...] = (), storage: bool = False
) -> dict[str, int]:
    """Bytes of the parameters each program holds, at ``precision``.

    int8: encoder Linear weights 1 byte each + one fp32 scale per output channel; everything else fp32.
    fp16: encoder parameters 2 bytes each, decoder parameters 4 (the decoder program is fp32), except
    convolution weights and biases: ``CONV_STORED_BYTES``; ``storage`` (fp16 storage, fp32 arithmetic): the
    encoder's Linear weights 2 bytes, everything else 4. ``kept``: parts kept fp32 (``export.mixed``), 4 bytes.
    """
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    conv = {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, nn.Conv2d) for k in ("weight", "bias")}
    out = {"encoder": 0, "decoder": 0}
    for name, p in model.named_parameters():
        part = "decoder" if name.startswith(DECODER_PARTS) and not name.startswith(ENCODER_ONLY) else "encoder"
        fp32_part = any(name == k or name.startswith(k + ".") for k in kept)
        if precision == "int8" and name in linear and not name.startswith(DECODER_PARTS) and not fp32_part:
            size = p.numel() + 4 * p.shape[0]
        else:  # fp16: the encoder's parameters only (decoder.pte is fp32), convolutions' kept fp32
            half = precision == "fp16" and part == "encoder" and not fp32_part
            half = half and (name in linear if storage else name not in conv)
            size = p.numel() * (2 if half else CONV_STORED_BYTES if name in conv else 4)
        out[part] += size
    return out


def program_tensor_bytes(module: nn.Module, args: tuple, stored_fp16: frozenset[str] = frozenset()) -> int:
    """Bytes of the parameters, buffers and constants the graph of ``module`` on ``args`` uses (``torch.export``
    lifts every tensor of the module; only placeholders with users reach the program), as XNNPACK stores
    them: at their dtype, a convolution's weight and bias at fp32 (``CONV_STORED_BYTES``), the tensors named in
    ``stored_fp16`` (``linear_weights``) at 2 bytes."""
    with torch.no_grad():
        ep = torch.export.export(module, args, strict=False)
    sig, stored = ep.graph_signature, {**ep.state_dict, **ep.constants}
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    convs = [
        n for n in ep.graph.nodes if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.convolution.default)
    ]
    conv_in = {a.name for n in convs for a in n.args[1:3] if isinstance(a, torch.fx.Node)}
    used = {n.name for n in ep.graph.nodes if n.op == "placeholder" and n.users}
    total = 0
    for p, t in lifted.items():
        tensor = stored.get(t)
        if p in used and isinstance(tensor, torch.Tensor):
            conv = p in conv_in and tensor.is_floating_point()
            size = 2 if t in stored_fp16 else CONV_STORED_BYTES if conv else tensor.element_size()
            total += tensor.numel() * size
    return total


def linear_weights(module: nn.Module, keep: tuple[str, ...] = ()) -> frozenset[str]:
    """The Linear weights of ``module`` (names as its exported program lifts them) that fp16 storage rounds:
    every ``nn.Linear``'s weight, Hiera's split q / k / v row blocks (``QKV``'s buffers, what the split form
    multiplies by), except under the model parts of ``keep`` (module names, matched at any depth)."""
    names = set()
    for n, m in module.named_modules():
        if isinstance(m, nn.Linear) and not _in(n, keep):
            names.add(f"{n}.weight")
            if isinstance(m, QKV) and m.split:
                names.update(f"{n}.{part}_weight" for part in "qkv")
    return frozenset(names)


@contextmanager
def fp16_linear_storage(names: frozenset[str]) -> Iterator[None]:
    """While active, XNNPACK serializes the static weights named in ``names`` (lifted names, as
    ``linear_weights`` gives them) as fp16 where a delegated ``aten.linear`` multiplies by them; the program's
    arithmetic stays fp32. Restores ExecuTorch's serializer on exit; with no names it changes nothing."""
    if not names:
        yield
        return
    import executorch.backends.xnnpack.operators.node_visitor as nv
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import XNNDatatype

    visitor = getattr(nv, "NodeVisitor", None)
    if not callable(getattr(nv, "get_param_tensor", None)) or not callable(
        getattr(visitor, "get_serialized_dtype", None)
    ):
        raise RuntimeError(
            "this ExecuTorch's XNNPACK serializer has no NodeVisitor.get_serialized_dtype / get_param_tensor: "
            "fp16 storage needs executorch 1.5 (pip install -e '.[executorch]')"
        )
    get_tensor, get_dtype = nv.get_param_tensor, visitor.get_serialized_dtype

    def stored_half(ep, node: torch.fx.Node) -> bool:
        sig = ep.graph_signature
        name = sig.inputs_to_parameters.get(node.name) or sig.inputs_to_buffers.get(node.name)
        linear = any("aten.linear" in str(u.target) and len(u.args) > 1 and u.args[1] is node for u in node.users)
        return name in names and linear

    def param_tensor(ep, node):
        t = get_tensor(ep, node)
        return t.half() if t is not None and t.dtype == torch.float32 and stored_half(ep, node) else t

    def serialized_dtype(self, quant_params, node, force_fp32=False):
        if quant_params is None and not force_fp32 and node.op == "placeholder":
            if stored_half(self.exported_program, node):
                return XNNDatatype.xnn_datatype_fp16
        return get_dtype(self, quant_params, node, force_fp32)

    nv.get_param_tensor, visitor.get_serialized_dtype = param_tensor, serialized_dtype
    try:
        yield
    finally:
        nv.get_param_tensor, visitor.get_serialized_dtype = get_tensor, get_dtype
