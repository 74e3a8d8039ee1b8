"""ONNX fp16: the encoder's weights stored in fp16 and computed in fp32.

Every float initializer of >= ``FP16_MIN_ELEMENTS`` values becomes fp16 behind a Cast to fp32, after the offline
optimisation so that constant folding cannot undo it: the error is weight rounding only, as with LiteRT's fp16
recipe on a CPU. fp16 arithmetic (``model.half()``; onnxruntime's CPU provider has no fp16 GEMM speed-up on CPUs
without fp16 arithmetic) missed the fp16 median bar for ordinary random checkpoints (``export.kept``).

Parts kept fp32 (``keep``: module names chosen per checkpoint by ``export.precision.select_fp16``) are found by
``initializer_owners``: an initializer named after its parameter belongs to that parameter's module; one the
exporter renamed (a folded transpose of a Linear weight, ``onnx::MatMul_123``) to the scope of the node reading it
(``/image_encoder/trunk/blocks.5/attn/qkv/MatMul`` -> ``image_encoder.trunk.blocks.5.attn.qkv``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FP16_MIN_ELEMENTS = 256  # smaller float constants (scales, eps, biases of tiny layers) stay fp32
FP16_SUFFIX = "__fp16"  # an fp16-stored initializer's name: the fp32 name + this (its Cast outputs the fp32 name)
WRAPPER = "model"  # the graph wrappers' attribute holding the model (export.wrappers): dropped from names


def _dotted(name: str) -> str:
    parts = [p for p in name.replace("/", ".").split(".") if p]
    return ".".join(parts[1:] if parts[:1] == [WRAPPER] else parts)


def initializer_owners(graph) -> dict[str, str]:
    """initializer name -> dotted module path (``image_encoder.trunk.blocks.5.attn.qkv``) of what owns it:
    the parameter's module for a parameter-named initializer, else the scope of the first node that reads it
    (through a ``Cast``: an fp16-stored initializer, ``fp16_storage``'s ``NAME__fp16``); "" when neither names one."""
    inits = {i.name for i in graph.initializer}
    readers: dict[str, str] = {}  # value -> scope of its first reader with a scope name
    casts: dict[str, str] = {}  # initializer -> the value a Cast of it produces
    for node in graph.node:
        for x in node.input:
            if x not in readers and node.name.startswith("/"):
                readers[x] = _dotted(node.name.rsplit("/", 1)[0])
        if node.op_type == "Cast" and node.input and node.input[0] in inits:
            casts[node.input[0]] = node.output[0]
    out = {}
    for name in inits:
        param = name.removesuffix(FP16_SUFFIX)
        if not param.startswith(("onnx::", "/")) and "." in param:
            out[name] = _dotted(param).rsplit(".", 1)[0]  # model.image_encoder...qkv.weight -> ...qkv
        else:
            out[name] = readers.get(name) or readers.get(casts.get(name, ""), "")
    return out


def _in_parts(owner: str, keep: tuple[str, ...]) -> bool:
    return bool(owner) and any(owner == p or owner.startswith(p + ".") for p in keep)


def fp16_storage(src: Path, dst: Path, min_elements: int = FP16_MIN_ELEMENTS, keep: tuple[str, ...] = ()) -> dict:
    """``src`` with every float32 initializer of >= ``min_elements`` values stored as fp16 and cast back to
    fp32 by a ``Cast`` node at the top of the graph: fp16 on disk, fp32 arithmetic on weights rounded to fp16
    (onnxruntime folds the casts once when it opens the file); initializers owned by a module of ``keep`` stay
    fp32. Returns the census for card.json."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(src))
    owners = initializer_owners(m.graph) if keep else {}
    casts, kept, stored, kept_parts = [], 0, 0, 0
    for i, init in enumerate(m.graph.initializer):
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < min_elements:
            kept += int(init.data_type == TensorProto.FLOAT)
            continue
        if _in_parts(owners.get(init.name, ""), keep):
            kept, kept_parts = kept + 1, kept_parts + 1
            continue
        half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name + FP16_SUFFIX)
        casts.append(helper.make_node("Cast", [half.name], [init.name], to=TensorProto.FLOAT, name=f"{half.name}_cast"))
        m.graph.initializer[i].CopyFrom(half)
        stored += 1
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(casts + nodes)
    onnx.save(m, str(dst), save_as_external_data=False)
    census = {"method": "fp16 initializers + Cast to fp32 (fp16 storage, fp32 compute)", "fp16": stored, "fp32": kept}
    return census | ({"fp32_kept_parts": list(keep), "fp32_kept_initializers": kept_parts} if keep else {})
