"""ONNX int8: onnxruntime dynamic quantisation of the encoder, one portable file and one for VNNI CPUs.

int8 = the encoder's MatMuls with constant weights quantised per output channel; activations are quantised
per call (MatMulInteger / DynamicQuantizeLinear). The decoder stays fp32 like ExecuTorch's int8 (at int8 it
misses the int8 bar: ``export.kept._INT8_DECODER``).

Why two encoder files. onnxruntime multiplies u8 activations by the weights with kernels chosen per CPU:
  - u8 x s8 (signed weights) runs VNNI's VPDPBUSD on CPUs that have it (exact int32 sums), but on x86 CPUs
    without VNNI (AVX2 only: many AMD EPYC, older Intel) VPMADDUBSW, whose int16 pair sums saturate with
    8-bit weights: worst click IoU 0.78-0.80 at test-small on an AVX2-only EPYC.
  - u8 x u8 never saturates, but has no VNNI fast path.
So ``encoder.onnx`` (every CPU) holds u8 weights, and ``encoder_vnni.onnx`` (role ``encoder-vnni``) s8 weights.
Full-size Hiera-Tiny, one interleaved run on a 2-core Xeon with AVX-512 VNNI
(``benchmarks/bench_targets.py``, 2026-12-03): encoder 1598 ms (u8) and 1197 ms (s8)
against fp32's 1750 ms at 2 threads. The VNNI file is written only when the exporting CPU has VNNI, so that
its fidelity is measured on the kernels that will run it (``vnni_check``, the same bars as the bundle); one
that misses a bar is left out and ``fidelity.json`` ``checks.int8_vnni`` says why. The ONNX backend opens it
on CPUs with VNNI (``runtime.backends.onnx.pick_encoder``).
"""

from __future__ import annotations

from pathlib import Path

from sam2edge.checks.fidelity.bars import bars_for
from sam2edge.checks.fidelity.measure import measure_backend
from sam2edge.errors import UserError
from sam2edge.export import video as vid
from sam2edge.export.mixed import int8_keep
from sam2edge.runtime.backends import onnx as ob

INT8_OPS = ("MatMul",)
# weight formats: name -> (onnxruntime weight type, reduce_range, stored as u8 codes q + 128). "u8" is the
# symmetric s8 grid every other target uses (so ``export.gptq``'s rounding reaches the file unchanged) stored as
# u8 with zero point 128: u8 x u8, no saturation. "u8-asymmetric" (onnxruntime's QUInt8: each row's own min/max
# grid) rounds GPTQ's weights a second time. 7-bit signed weights avoid the saturation but lose precision:
# full-size worst click IoU 0.8987, refused (benchmarks/bench_int8_range.py)
INT8_WEIGHTS = {
    "u8": ("QInt8", False, True),
    "u8-asymmetric": ("QUInt8", False, False),
    "s8": ("QInt8", False, False),
    "s8-7bit": ("QInt8", True, False),
}
PORTABLE_WEIGHTS, VNNI_WEIGHTS = "u8", "s8"


def nodes_of(src: Path, layers: tuple[str, ...]) -> list[str]:
    """Names of ``src``'s quantisable nodes (``INT8_OPS``, and the Gemm the optimiser fuses a Linear into)
    inside the modules ``layers`` (dotted names, e.g. ``image_encoder.trunk.blocks.5.attn.qkv``; the exporter
    names a node by its module scope)."""
    import onnx

    from sam2edge.export.onnx_fp16 import _dotted

    graph = onnx.load(str(src), load_external_data=False).graph
    out = []
    for n in graph.node:
        scope = _dotted(n.name.rsplit("/", 1)[0])
        if n.op_type in (*INT8_OPS, "Gemm") and any(scope == x or scope.startswith(x + ".") for x in layers):
            # quantize_dynamic first splits a Gemm into MatMul + Add and names the MatMul NAME_MatMul
            out.append(n.name + "_MatMul" if n.op_type == "Gemm" else n.name)
    return out


def quantize_int8(src: Path, dst: Path, weights: str = PORTABLE_WEIGHTS, keep: tuple[str, ...] = ()) -> dict:
    """Dynamic int8 of ``src``'s MatMuls with constant weights (per output channel, format ``weights`` of
    ``INT8_WEIGHTS``) into ``dst``; the MatMuls of the modules ``keep`` stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type, reduce_range, shifted = INT8_WEIGHTS[weights]
    excluded = nodes_of(src, keep) if keep else []
    missing = [x for x in keep if not nodes_of(src, (x,))]
    if missing:
        raise RuntimeError(f"int8: no MatMul node of {src.name} belongs to the layers kept fp32 {missing}")
    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=getattr(QuantType, weight_type),
        per_channel=True,
        reduce_range=reduce_range,
        op_types_to_quantize=INT8_OPS,
        nodes_to_exclude=excluded,
    )
    if shifted:
        _to_u8(dst)
    nodes = onnx.load(str(dst), load_external_data=False).graph.node
    ops = [n.op_type for n in nodes]
    leaked = [n.name for n in nodes if n.op_type == "MatMulInteger" and n.name.startswith(tuple(excluded))]
    if leaked:
        raise RuntimeError(f"int8: layers kept fp32 were quantised anyway: {leaked}")
    return {
        "method": f"onnxruntime quantize_dynamic, {weight_type} per-channel {7 if reduce_range else 8}-bit weights"
        + (", stored as u8 (q + 128, zero point 128)" if shifted else ""),
        "MatMulInteger": ops.count("MatMulInteger"),
        **({"fp32_kept_layers": list(keep), "fp32_kept_nodes": excluded} if keep else {}),
    }


def _to_u8(path: Path) -> None:
    """Rewrite ``path``'s s8 MatMulInteger weights and their zero points as u8 (+128), in place: the same
    products, read by onnxruntime's u8 x u8 kernels."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    names = {n.input[i] for n in model.graph.node if n.op_type == "MatMulInteger" for i in (1, 3) if len(n.input) > i}
    for name in names:
        arr = numpy_helper.to_array(inits[name])
        if arr.dtype != np.int8:
            raise RuntimeError(f"int8: {name} of {path.name} is {arr.dtype}, not the s8 the u8 form shifts")
        inits[name].CopyFrom(numpy_helper.from_array((arr.astype(np.int16) + 128).astype(np.uint8), name))
    onnx.save(model, str(path))


def quantize_encoder(job, opt: Path, work: Path, finish) -> Path:
    """The portable int8 encoder of ``opt`` (returned, for the caller to finish as encoder.onnx) and, on a
    VNNI CPU, ``encoder_vnni.onnx`` finished by ``finish(src, dst)`` into the bundle."""
    portable = work / "int8_encoder.onnx"
    census = job.state["census"]["encoder"]
    keep = int8_keep(job, "onnx")
    census["int8"] = quantize_int8(opt, portable, PORTABLE_WEIGHTS, keep)
    if ob.has_vnni():
        vnni = work / "int8_encoder_vnni.onnx"
        census["int8_vnni"] = quantize_int8(opt, vnni, VNNI_WEIGHTS, keep)
        finish(vnni, job.folder / ob.VNNI_ENCODER_FILE)
        job.files[ob.VNNI_ENCODER_FILE] = ob.VNNI_ENCODER_ROLE
    return portable


def vnni_check(job, decoder: Path) -> dict | None:
    """The VNNI encoder with ``decoder`` against the job's eager reference, at the int8 bars (with the job's
    overrides; with ``--video`` the clip too, this file the frame encoder); a file that misses one is removed
    from the bundle. None where the bundle is not int8."""
    if job.precision != "int8":
        return None
    path = job.folder / ob.VNNI_ENCODER_FILE
    if ob.VNNI_ENCODER_FILE not in job.files:
        return {"shipped": False, "why": "the exporting CPU has no VNNI, so u8 x s8 could not be measured here"}
    try:
        backend = ob.OnnxBackend.from_files(path, decoder, job.cfg)
    except UserError as e:
        raise RuntimeError(f"{path.name} does not load: {e}") from None
    res = measure_backend(job.reference(), backend, "int8", clicks=job.clicks, bars=job.bars)
    out = {"end_to_end": res["end_to_end"], "bars": bars_for("int8", job.bars)}
    failures = list(res["failures"])
    if job.vcfg is not None:  # --video: the clip, tracked with this file as the frame encoder
        clip = vid.measure(job, backend, job.bars)
        out["video"] = {k: clip[k] for k in ("per_frame_iou", "iou_worst", "iou_median")}
        failures += clip["failures"]
    if failures:
        path.unlink()
        del job.files[ob.VNNI_ENCODER_FILE]
        return {"shipped": False, "why": f"missed the int8 bars: {failures[0]}", **out}
    return {"shipped": True, "file": ob.VNNI_ENCODER_FILE, **out}
