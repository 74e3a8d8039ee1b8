"""ONNX static int8 (w8a8 QDQ): activation ranges calibrated on real photos, every MatMul quantised.

Dynamic int8 (``export.onnx_int8``) quantises only the MatMuls with constant weights and measures each
activation's range on every call (``DynamicQuantizeLinear``: one pass over the tensor for its min / max, one to
quantise it). Static int8 fixes every activation range once, from the encoder's fp32 run on calibration photos,
and writes them into the graph as QuantizeLinear / DequantizeLinear pairs (QDQ, the format NPUs and TensorRT /
OpenVINO read). So the attention products (q @ k^T, softmax @ v: two activations, no constant weight) are int8
too, and no range is measured at run time; onnxruntime's CPU provider fuses DQ -> MatMul -> Q into
``QLinearMatMul`` / ``MatMulIntegerToFloat`` with VNNI kernels.

Method (``quantize_static``): per-output-channel symmetric s8 weights, s8 symmetric activations
(``ActivationSymmetric``: zero point 0), ranges from ``CALIBRATION`` (skimage photos outside the fidelity
click set, so the bars are measured on images calibration never saw) with ``METHOD``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sam2edge.config import Sam2Config
from sam2edge.errors import UserError
from sam2edge.export import onnx_int8 as i8
from sam2edge.export.smooth import CALIBRATION_PHOTOS
from sam2edge.runtime.backends import onnx as ob

# real photos for the activation ranges: the smoothing's photos plus two more, none in the fidelity click set
CALIBRATION = (*CALIBRATION_PHOTOS, "coins.png", "camera.png")
METHOD = "MinMax"  # onnxruntime CalibrationMethod name
# products' outputs stay fp32 (their int32 sums dequantised in the kernel): a Q / DQ pair after fc1 keeps
# onnxruntime from fusing the GELU that follows it into one kernel
QUANTIZE_OUTPUTS = False
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
    quantize_outputs: bool = QUANTIZE_OUTPUTS,
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
            **({} if quantize_outputs else {"OpTypesToExcludeOutputQuantization": list(ops)}),
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


# how ``encoder_vnni.onnx`` quantises its activations (``sam2edge export --int8``): "static" ranges calibrated here
# (the default; the dynamic file ships in its place when the static one misses a bar), or "dynamic" (per call).
# Hiera-Tiny 1024, 2 threads, ``benchmarks/bench_int8_static.py``, quiet interleaved runs on two AVX-512 VNNI EPYCs:
# on one static took 720 / 694 / 685 ms against dynamic's 740 / 716 / 669 (fp32 1199 / 1177 / 1109); on the other
# (2026-12-06) 896 and 910 ms (unsmoothed, smoothed) against 1184 and 1157 (fp32 1998, the peer's export 2021): as
# fast, or 1.27x faster. With each product's output quantised too, 1275 / 1224 / 1183 and 1447 ms: no faster than fp32
MODES = ("dynamic", "static")
DEFAULT_MODE = "static"
FALLBACK = "int8_vnni_fallback"  # job.state key: the finished dynamic s8 file's bytes, kept until the check


def mode(job) -> str:
    """The job's int8 mode (``run_export(options={"int8": ...})``), one of ``MODES``."""
    got = job.state.get("int8", DEFAULT_MODE)
    if got not in MODES:
        raise UserError(f"int8 mode {got!r} is not one of {', '.join(MODES)}; pass --int8 static or --int8 dynamic")
    return got


def quantize_encoder(job, opt: Path, work: Path, finish) -> Path:
    """``export.onnx_int8.quantize_encoder`` with, in mode "static" on a VNNI CPU, ``encoder_vnni.onnx`` as the
    static QDQ int8 of ``opt`` (the dynamic s8 file finished and kept aside for ``vnni_check``'s fallback);
    returns the portable (dynamic u8) encoder for the caller to finish as encoder.onnx."""
    if mode(job) != "static" or not ob.has_vnni():
        return i8.quantize_encoder(job, opt, work, finish)
    portable = i8.quantize_encoder(job, opt, work, finish)  # encoder.onnx, and the dynamic s8 VNNI file
    vnni = job.folder / ob.VNNI_ENCODER_FILE
    census = job.state["census"]["encoder"]
    census["int8_vnni_dynamic"] = census.pop("int8_vnni")
    job.state[FALLBACK] = vnni.read_bytes()
    static = work / "int8_encoder_static.onnx"
    census["int8_vnni"] = quantize_static_int8(opt, static, job.cfg, input_name=ob.ENCODER_INPUTS[0])
    finish(static, vnni)
    return portable


def vnni_check(job, decoder: Path) -> dict | None:
    """``export.onnx_int8.vnni_check`` of ``encoder_vnni.onnx``; a static file that misses a bar is replaced by
    the dynamic s8 file, measured at the same bars. The result says which activations shipped ("int8")."""
    fallback = job.state.pop(FALLBACK, None)
    first = i8.vnni_check(job, decoder)
    if first is None or fallback is None:  # not int8, or dynamic only
        return first if first is None or not first["shipped"] else {**first, "int8": "dynamic"}
    if first["shipped"]:
        return {**first, "int8": "static"}
    (job.folder / ob.VNNI_ENCODER_FILE).write_bytes(fallback)
    job.files[ob.VNNI_ENCODER_FILE] = ob.VNNI_ENCODER_ROLE
    again = i8.vnni_check(job, decoder)
    return {**again, **({"int8": "dynamic"} if again["shipped"] else {}), "static": first}


def card_extra(job) -> dict:
    """card.json extra.int8_activations: how encoder_vnni.onnx quantises its activations (static: the
    calibration set and method; whether the static file or its dynamic fallback shipped)."""
    if job.precision != "int8":
        return {}
    census = job.state.get("census", {}).get("encoder", {})
    if "int8_vnni_dynamic" not in census:  # dynamic asked for, or no VNNI file made here
        return {"int8_activations": {"mode": "dynamic"}}
    shipped = (job.checks.get("int8_vnni") or {}).get("int8", "none")
    static = census["int8_vnni"]
    return {"int8_activations": {"mode": "static", "shipped": shipped, **static}}
