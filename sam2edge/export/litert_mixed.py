"""LiteRT reduced precision with measured parts kept fp32: convert fp32, then quantise with a recipe that skips them.

litert-torch's fp16 and int8 recipes (``full_fp16_recipe``: fp16 weights; ``full_dynamic_recipe``: int8 weights per
output channel, activations quantised per call) are ai-edge-quantizer recipes applied to the converted fp32
flatbuffer. This module does the same two steps itself: the fp32 conversion, then ``ai_edge_quantizer`` with
litert-torch's own recipe translated (``translate_recipe``) plus one ``NO_QUANTIZE`` entry per op whose weights
belong to a part the measured selection keeps fp32 (``export.mixed``: ``fp16_keep`` / ``int8_keep``, the same
choice ONNX and ExecuTorch apply). With nothing kept the result is litert-torch's own quantised model.

Which part an op belongs to is read from the converted graph: a constant input's tensor name is the
``nn_module_stack`` path of the module that owns it, one ``<module class>_<attribute>`` segment per *called*
module (``.../sam2edge.model.image_encoder.MultiScaleBlock_0/.../torch.nn.modules.linear.Linear_qkv;1``;
containers and modules whose submodules are called directly are absent), so ``owners`` walks the converted
module down segment by segment (the shallowest descendant with that class and attribute) to the dotted
module name (``image_encoder.trunk.blocks.0.attn.qkv``). An op's recipe entry matches its scope (the names of
its outputs, as ai-edge-quantizer computes it) exactly. ``weight_census`` reads the quantised file back: the
dtype of every weighted op's weights, per owner, so a kept layer that was quantised anyway is an error.
"""

from __future__ import annotations

import re
from collections import Counter

from torch import nn

# ops whose constant weights the recipes quantise (ai-edge-quantizer's FLOAT_CASTING and dynamic MIN_MAX ops)
WEIGHTED_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "BATCH_MATMUL", "EMBEDDING_LOOKUP")


def _segment(module: nn.Module, attr: str) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}_{attr}"


class Owners:
    """tflite tensor name -> dotted module name under ``prefix`` of ``root`` (the converted module)."""

    def __init__(self, root: nn.Module, prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.cache: dict[str, str] = {}

    def __call__(self, tensor_name: str) -> str:
        path = tensor_name.split(";")[0]
        if path not in self.cache:
            self.cache[path] = _owner(self, path)
        return self.cache[path]


def _owner(owners: Owners, path: str) -> str:
    segments = path.split("/")
    current, dotted = owners.root, ""
    for seg in segments[1:]:  # the first segment is the converted module itself
        found = _child(current, seg)
        if found is None:
            break
        name, current = found
        dotted = f"{dotted}.{name}" if dotted else name
    if not (dotted == owners.prefix or dotted.startswith(owners.prefix + ".")):
        return ""
    return dotted[len(owners.prefix) + 1 :] if owners.prefix else dotted


def _child(module: nn.Module, segment: str) -> tuple[str, nn.Module] | None:
    """The shallowest descendant of ``module`` whose ``_segment`` is ``segment`` (name relative to ``module``)."""
    best = None
    for name, sub in module.named_modules():
        if name and _segment(sub, name.rsplit(".", 1)[-1]) == segment:
            if best is None or name.count(".") < best[0].count("."):
                best = (name, sub)
    return best


def model_prefix(root: nn.Module, model: nn.Module) -> str:
    """The dotted name of ``model`` inside ``root`` (the graph wrappers hold it as ``inner.model``)."""
    return next(name for name, m in root.named_modules() if m is model)


def in_parts(owner: str, keep: tuple[str, ...]) -> bool:
    return bool(owner) and any(owner == p or owner.startswith(p + ".") for p in keep)


def _op_name(model, op) -> str:
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfu

    return tfu.TFL_OP_CODE_TO_NAME.get(model.operatorCodes[op.opcodeIndex].builtinCode, "")


def _weight_tensor(model, sg, op):
    """The constant weight of a weighted op (through an fp16 ``DEQUANTIZE``), or None."""
    from ai_edge_litert import schema_py_generated as schema

    producers = {o: p for p in sg.operators for o in p.outputs}
    for idx in op.inputs[1:2]:
        if idx < 0:
            continue
        t = sg.tensors[idx]
        prod = producers.get(idx)
        if prod is not None and model.operatorCodes[prod.opcodeIndex].builtinCode == schema.BuiltinOperator.DEQUANTIZE:
            t = sg.tensors[prod.inputs[0]]
        buf = model.buffers[t.buffer] if 0 < t.buffer < len(model.buffers) else None
        if buf is not None and ((buf.data is not None and len(buf.data) > 0) or getattr(buf, "offset", 0)):
            return t
    return None


def weighted_ops(tflite: bytes, owners: Owners) -> list[dict]:
    """Every weighted op of the (fp32 or quantised) graph: op type, scope (ai-edge-quantizer's), owner module,
    weight dtype."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfu

    dtypes = {v: k for k, v in vars(schema.TensorType).items() if isinstance(v, int)}
    model = tfu.read_model(bytearray(tflite))
    rows = []
    for sg in model.subgraphs:
        for op in sg.operators:
            kind = _op_name(model, op)
            if kind not in WEIGHTED_OPS:
                continue
            w = _weight_tensor(model, sg, op)
            if w is None:
                continue
            rows.append(
                {
                    "op": kind,
                    "scope": tfu.get_op_scope(op, sg.tensors),
                    "owner": owners(tfu.get_tensor_name(w)),
                    "dtype": dtypes.get(w.type, str(w.type)),
                }
            )
    return rows


def recipe(precision: str, keep_scopes: list[str]):
    """litert-torch's recipe for ``precision`` ("fp16" / "int8") with ops of ``keep_scopes`` not quantised."""
    from ai_edge_quantizer import recipe_manager
    from ai_edge_quantizer.algorithm_manager import AlgorithmName
    from ai_edge_quantizer.qtyping import TFLOperationName
    from litert_torch.generative.quantize import quant_recipes
    from litert_torch.quantize import translate_recipe

    make = {"fp16": quant_recipes.full_fp16_recipe, "int8": quant_recipes.full_dynamic_recipe}[precision]
    rm = recipe_manager.RecipeManager()
    rm.load_quantization_recipe(translate_recipe.translate_to_ai_edge_recipe(make().generative_recipe))
    for scope in keep_scopes:  # later entries win over the default ".*"
        rm.add_quantization_config(
            "^" + re.escape(scope) + "$", TFLOperationName.ALL_SUPPORTED, algorithm_key=AlgorithmName.NO_QUANTIZE
        )
    return rm.get_quantization_recipe()


def quantize(fp32: bytes, precision: str, owners: Owners, keep: tuple[str, ...]) -> tuple[bytes, dict]:
    """``fp32`` (a converted flatbuffer) quantised by litert-torch's ``precision`` recipe, the weighted ops owned
    by a part of ``keep`` left fp32; returns the bytes and the census for card.json (raises if a kept op was
    quantised or a kept part owns no op)."""
    from litert_torch.quantize import translate_recipe

    ops = weighted_ops(fp32, owners)
    kept_scopes = [r["scope"] for r in ops if in_parts(r["owner"], keep)]
    missing = [p for p in keep if not any(in_parts(r["owner"], (p,)) for r in ops)]
    if missing:
        raise RuntimeError(f"litert {precision}: parts to keep fp32 own no weighted op in the graph: {missing}")
    out = bytes(translate_recipe.quantize_model(fp32, recipe(precision, kept_scopes)))
    census = weight_census(out, owners, keep)
    if census["leaked"]:
        raise RuntimeError(f"litert {precision}: ops kept fp32 were quantised anyway: {census['leaked'][:3]}")
    return out, census


def weight_census(tflite: bytes, owners: Owners, keep: tuple[str, ...]) -> dict:
    """Weight dtypes of the weighted ops, kept (owned by a part of ``keep``) and the rest; ``leaked``: kept ops
    whose weights are not float32."""
    ops = weighted_ops(tflite, owners)
    kept = [r for r in ops if in_parts(r["owner"], keep)]
    rest = [r for r in ops if not in_parts(r["owner"], keep)]
    return {
        "method": "ai-edge-quantizer with litert-torch's recipe; NO_QUANTIZE for the ops of the parts kept fp32",
        "weight_dtypes": dict(Counter(r["dtype"] for r in rest)),
        **(
            {
                "fp32_kept_parts": list(keep),
                "fp32_kept_ops": len(kept),
                "kept_weight_dtypes": dict(Counter(r["dtype"] for r in kept)),
            }
            if keep
            else {}
        ),
        "leaked": [r["owner"] for r in kept if r["dtype"] != "FLOAT32"],
    }
