"""What a reduced-precision export computes in fp32, and why (card.json ``extra.fp32_kept``).

``FP32_KEPT[target][precision]`` = {part kept in fp32: why}. The export pipeline copies the entry of its
(target, precision) into card.json, so a bundle's card states what *its* export did (``sam2edge card
render`` prints it next to the measured worst / median mask IoU). Evidence: docs/design/precision.md.
"""

from __future__ import annotations

# the measured reason the fp16 decoders stay fp32 (sam2edge diagnose, test-small-wide-decoder, 40 clicks)
_DECODER_FP16 = (
    "in fp16 the two-way transformer loses ~1e-3 relative accuracy per stage (no overflow, no single op: "
    "sam2edge diagnose finds none over 1e-2), which flips mask pixels near the boundary: median mask IoU "
    "0.9985 < 0.999 at the full decoder width for checkpoint synthetic:3 (0.9996 with this decoder in fp32); "
    "keeping only the mask head in fp32 did not help (0.9986), the transformer alone did (0.9991)"
)
# the measured reason LiteRT's fp16 bundles keep the decoder graphs' weights fp32 (docs/design/precision.md)
_DECODER_FP16_WEIGHTS = (
    "with every weight rounded to fp16, sam2.1-hiera-large (synthetic weights) missed the fp16 bars: seed 0 median "
    "0.9990 < 0.999 at export (eager emulation 0.99881), seed 1 worst 0.98640 < 0.99 (emulation); with the "
    "decoder's weights fp32 the emulation holds: seed 0 median 0.99906, seed 1 worst 0.99258 and median 0.99943"
)
_IO = "fp32 inputs and outputs, cast at the graph edges"
# why the ONNX fp16 encoder computes in fp32 on fp16-stored weights (export.onnx_fp16.fp16_storage) instead of in fp16
_FP16_STORAGE = (
    "fp16 weights, fp32 arithmetic: the error is weight rounding only. Full-size Hiera-Tiny, 40 clicks vs eager fp32, "
    "robustness-set checkpoint upstream-s1-perturbed (scripts/robustness_set.py): fp16-rounded encoder weights with "
    "fp32 arithmetic gave worst 0.99842, median 0.99974 (eager emulation, export.precision.fp16_weights); the CPUs "
    "this runs on have no fp16 arithmetic, so fp16 compute would be emulated and slower, not faster"
)
_INT8_DECODER = (
    "dynamic int8 of the decoder's Linear layers costs the int8 bar: LiteRT's CPU decoder at int8 ran 1.5x "
    "faster (28.8 -> 19.6 ms p50 at 1024 px, benchmarks/bench_cpu_decoder.py precision=int8) but the end-to-end "
    "worst mask IoU fell to 0.9263 < 0.95 (full-size Hiera-Tiny, synthetic weights, measured "
    "2026-12-04); the other targets' int8 is the same scheme"
)

# the parts chosen per checkpoint (export.mixed), listed with their measurements in card.json extra.mixed_precision
_MEASURED_PARTS = "encoder parts listed in extra.mixed_precision (when any)"
_MEASURED_WHY = (
    "chosen for these weights by measurement at export: the fewest parts, most harmful first, whose fp32 copies "
    "make the emulated end-to-end mask IoU meet the bars (export.mixed)"
)
# LiteRT applies the same measured choice through its quantisation recipe
_LITERT_MEASURED_WHY = (
    _MEASURED_WHY + "; their ops are left out of the recipe (export.litert_mixed, weight dtypes in extra.quantization)"
)

FP32_KEPT: dict[str, dict[str, dict[str, str]]] = {
    "executorch": {
        "fp16": {
            "decoder.pte, decoder_cpu.pte + decoder_prep.pte and decoder_batched.pte (prompt encoder + mask decoder)": (
                _DECODER_FP16
            ),
            "encoder convolution weights": "XNNPACK serializes convolution weights as fp32 at every precision",
            "graph inputs and outputs": _IO,
            _MEASURED_PARTS: _MEASURED_WHY,
        },
        "int8": {
            _MEASURED_PARTS: _MEASURED_WHY,
            "decoder.pte, decoder_cpu.pte + decoder_prep.pte (prompt encoder + mask decoder)": _INT8_DECODER
            + "; its int8 lowering also fails in "
            "XNNPACK's ChannelsLastTaggedReshapePass",
            "encoder outside the Linear layers": "the XNNPACK quantizer is given the Linear layers only: dynamic "
            "int8 leaves the attention products in fp32, and a quantised convolution broke the program at run "
            "time (XNNPACK's channels-last pass)",
        },
    },
    "onnx": {
        "fp16": {
            "decoder.onnx and decoder_batched.onnx (prompt encoder + mask decoder)": _DECODER_FP16,
            "encoder arithmetic (fp16 initializers behind Casts to fp32)": _FP16_STORAGE,
            "float constants under 256 values (export.onnx.FP16_MIN_ELEMENTS)": "negligible size; scales and "
            "eps stay exact",
            "graph inputs and outputs": _IO,
            _MEASURED_PARTS: _MEASURED_WHY,
        },
        "int8": {
            _MEASURED_PARTS: _MEASURED_WHY,
            "decoder.onnx": _INT8_DECODER,
            "encoder outside MatMul": "onnxruntime dynamic quantisation of MatMul only",
        },
    },
    "litert": {
        "fp16": {
            "decoder.tflite, decoder_cpu.tflite, decoder_batched.tflite and mask_encoder.tflite (prompt encoder + "
            "mask decoder)": _DECODER_FP16_WEIGHTS,
            "all activations (fp16 weights only)": "full_fp16_recipe stores weights in fp16 and the CPU kernels "
            "compute in fp32",
            _MEASURED_PARTS: _LITERT_MEASURED_WHY,
        },
        "int8": {
            _MEASURED_PARTS: _LITERT_MEASURED_WHY,
            "decoder": _INT8_DECODER,
            "activations": "dynamic-range int8: int8 weights, activations quantised per call, fp32 elsewhere",
        },
    },
}


# ExecuTorch fp16 where no measured selection met the fp16 bars in fp16 arithmetic: fp16 storage, fp32 arithmetic
# (export.mixed.fp16_keep's fallback); replaces FP32_KEPT["executorch"]["fp16"]
EXECUTORCH_FP16_STORAGE: dict[str, str] = {
    "decoder.pte, decoder_cpu.pte + decoder_prep.pte and decoder_batched.pte (prompt encoder + mask decoder)": (
        _DECODER_FP16
    ),
    "all arithmetic (fp16 Linear weights only)": "fp16 arithmetic missed the fp16 bars for these weights with "
    "every measured choice of parts kept fp32 (extra.mixed_precision.fp16_arithmetic); XNNPACK's fully-connected "
    "operator converts fp16 weights to fp32 when it packs them (export.executorch_storage)",
    "encoder weights other than the Linears' (convolutions, norms, biases, position embeddings)": "XNNPACK takes an "
    "fp16 static weight beside fp32 activations in its fully-connected operator only",
    _MEASURED_PARTS: _MEASURED_WHY,
}


# int8 --video, every target (docs/design/precision.md)
_VIDEO_INT8 = (
    "the memory attention's time is in its activation x activation products (scores and P @ v over 28736 keys), "
    "which dynamic int8 leaves in fp32: int8 weights made the full-size LiteRT graph only 1.08x faster (2442 -> "
    "2251 ms) for an output error of 1.1 % of its scale (benchmarks/bench_memory_attention.py); the memory "
    "encoder and the video decoder are under 5 % of a frame"
)
VIDEO_FP32_KEPT: dict[str, dict[str, str]] = {
    "int8": {"video graphs (memory attention, memory encoder, video decoder)": _VIDEO_INT8},
}


def fp32_kept(target: str, precision: str, video: bool = False, storage: bool = False) -> dict[str, str]:
    """{part kept in fp32: why} for an export of ``target`` at ``precision`` (``video``: with ``--video``;
    ``storage``: ExecuTorch's fp16 fell back to fp16 storage with fp32 arithmetic; empty: none recorded)."""
    base = EXECUTORCH_FP16_STORAGE if storage else FP32_KEPT.get(target, {}).get(precision, {})
    return {**base, **(VIDEO_FP32_KEPT.get(precision, {}) if video else {})}
