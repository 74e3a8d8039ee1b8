"""ONNX static int8 (w8a8 QDQ): activation ranges calibrated on real photos, every MatMul quantised.

Dynamic int8 (``export.onnx_int8``) quantises only the MatMuls with constant weights and measures each
activation's range on every call (``DynamicQuantizeLinear``: one pass over the tensor for its min / max, one to
quantise it). Static int8 fixes every activation range once, from the encoder's fp32 run on calibration photos,
and writes them into the graph as QuantizeLinear / DequantizeLinear pairs (QDQ, the format NPUs and TensorRT /
OpenVINO read). So the attention products (q @ k^T, softmax @ v: two activations, no constant weight) are int8
too, and no range is measured at run time; onnxruntime's CPU provider fuses DQ -> MatMul -> Q into
``QLinearMatMul`` / ``MatMulIntegerToFloat`` with VNNI kernels.

Method (``quantize_static``): per-output-channel symmetric s8 weights, s8 symmetric activations
(``ActivationSymmetric``: zero point 0, the form onnxruntime's VNNI s8 kernels run without a zero-point
correction), ranges from ``CALIBRATION`` (skimage photos outside the fidelity click set, so the bars are
measured on images calibration never saw) with ``METHOD``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sam2edge.config import Sam2Config
from sam2edge.export.smooth import CALIBRATION_PHOTOS

# real photos for the activation ranges: the smoothing's photos plus two more, none in the fidelity click set
CALIBRATION = (*CALIBRATION_PHOTOS, "coins.png", "camera.png")
METHOD = "MinMax"  # onnxruntime CalibrationMethod name
OPS = ("MatMul", "Gemm")  # every product: the Linear layers (Gemm after optimisation) and the attention products


def calibration_inputs(cfg: Sam2Config, photos: tuple[str, ...], input_name: str) -> Iterator[dict[str, np.ndarray]]:
    """One encoder feed per photo: ``{input_name: 1x3xSxS float32}``, preprocessed as every runtime does."""
    from sam2edge.checks.photos import photo
    from sam2edge.runtime.preprocess import preprocess

    for name in photos:
        yield {input_name: preprocess(photo(name), cfg.image_size).numpy()}


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over ``calibration_inputs``."""

    def __init__(self, feeds: Iterator[dict[str, np.ndarray]]) -> None:
        self.feeds = feeds

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)

    def rewind(self) -> None:  # pragma: no cover - single pass: MinMax reads each photo once
        raise RuntimeError("the calibration reader is single-pass")


def quantize_static_int8(
    src: Path,
    dst: Path,
    cfg: Sam2Config,
    *,
    photos: tuple[str, ...] = CALIBRATION,
    method: str = METHOD,
    activation: str = "s8",
    ops: tuple[str, ...] = OPS,
    input_name: str = "image",
) -> dict:
    """Static w8a8 QDQ int8 of ``src``'s ``ops`` into ``dst``, activation ranges from ``photos`` by ``method``;
    returns the census for the card (method, calibration set, quantised op counts)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    symmetric = activation == "s8"
    quantize_static(
        str(src),
        str(dst),
        _Reader(calibration_inputs(cfg, photos, input_name)),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(ops),
        per_channel=True,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, method),
        extra_options={
            "ActivationSymmetric": symmetric,
            "WeightSymmetric": True,
        },
    )
    graph = onnx.load(str(dst), load_external_data=False).graph
    kinds = [n.op_type for n in graph.node]
    return {
        "method": f"onnxruntime quantize_static QDQ, {', '.join(ops)}: s8 per-channel symmetric weights, "
        f"{activation} {'symmetric' if symmetric else 'asymmetric'} activations, {method} ranges",
        "calibration": list(photos),
        "QuantizeLinear": kinds.count("QuantizeLinear"),
        "DequantizeLinear": kinds.count("DequantizeLinear"),
        "quantized_matmuls": quantized_matmuls(graph),
    }


def quantized_matmuls(graph) -> dict[str, int]:
    """MatMul / Gemm nodes whose inputs A and B both come from DequantizeLinear, split by whether B is a
    constant weight ("weight": the Linear layers) or an activation ("activation": the attention products);
    and the products left in fp32 ("float")."""
    made_by = {o: n for n in graph.node for o in n.output}
    consts = {i.name for i in graph.initializer}
    out = {"weight": 0, "activation": 0, "float": 0}
    for n in graph.node:
        if n.op_type not in ("MatMul", "Gemm"):
            continue
        src = [made_by.get(i) for i in n.input[:2]]
        if not all(s is not None and s.op_type == "DequantizeLinear" for s in src):
            out["float"] += 1
            continue
        out["weight" if src[1].input[0] in consts else "activation"] += 1
    return out
