"""ExecuTorch XNNPACK export: build -> (quantize) -> lower -> verify -> bundle (reference card 002).

Writes ``encoder.pte`` (``XnnEncoderGraph``) and ``decoder.pte`` (``XnnDecoderGraph``, prompt encoder
inside, ``MAX_POINTS`` prompt slots), ``fidelity.json``, ``card.json``, ``manifest.json``; I/O of both
programs in ``sam2edge.runtime.backends.executorch``.

Model: ``Rewrites(transposed_conv="matmul")`` (the 2x2 transposed convolutions as GEMMs, faster than XNNPACK's
deconvolution; the zero-stuff form would need zero-filled tensors it cannot make), rank-4 math attention,
overflow-safe LayerNorm; the graph legalization of ``executorch_lower`` puts LayerNorm, attention and (fp32)
GELU in the delegate.
Precisions (I/O fp32 for all):
  fp32  as is;
  fp16  the encoder in fp16 weights and arithmetic (``fp16_encoder``: XNNPACK's fp16 kernels, GELU in an exact
        erf-free form), the encoder parts a measured selection keeps fp32 (``export.mixed.fp16_keep``, on the
        eager emulation ``export.precision.fp16_arithmetic``; all-fp16 missed the median bar for an ordinary
        checkpoint); convolutions' weights stay fp32 as XNNPACK serializes them; the decoder stays fp32
        (``export.kept.FP32_KEPT``). Where no selection meets the fp16 bars in fp16 arithmetic (a checkpoint
        with outlier channels), fp16 storage with fp32 arithmetic instead, LiteRT's and ONNX's recipe: the
        Linear weights written fp16 (``executorch_storage.fp16_linear_storage``), the parts a second measured
        selection keeps (``export.precision.STORAGE_FALLBACK``) fp32;
  int8  dynamic int8 (per-channel symmetric weights, per-token activations) on every Linear of the
        encoder via the XNNPACK quantizer (torchao pt2e); the decoder stays fp32 (4.2 M parameters; its
        int8 lowering fails in XNNPACK's ChannelsLastTaggedReshapePass on the mask-input LayerNorm2d).
        Must pass the int8 bar or is refused.
Everything else (out-folder guard, weights, fidelity against eager fp32 with the ONE bar table of
``checks.fidelity.bars`` - fp16 now needs worst IoU >= 0.99 as `sam2edge verify` always did, not 0.95 -,
the atomic write) is ``sam2edge.export.pipeline``; the size check (file bytes vs parameter bytes) is this
target's check: a program over its limit fails the bundle like a bar.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sam2edge.checks.fidelity.bars import BARS
from sam2edge.checks.fidelity.measure import MIN_CLICKS
from sam2edge.config import Sam2Config
from sam2edge.export import batched as bat
from sam2edge.export import video as vid
from sam2edge.export.executorch_graphs import (
    XnnBatchedDecoderGraph,
    XnnDecoderGraph,
    XnnEncoderGraph,
    XnnGivenDecoderGraph,
    XnnImageProjectionsGraph,
    batched_decoder_inputs,
    decoder_inputs,
    encoder_inputs,
    fp16_encoder,
    given_decoder_inputs,
)
from sam2edge.export.executorch_lower import lower
from sam2edge.export.executorch_storage import (  # noqa: F401 (CONV_STORED_BYTES: the size rule's, re-exported)
    CONV_STORED_BYTES,
    fp16_linear_storage,
    linear_weights,
    parameter_bytes,
    program_tensor_bytes,
)
from sam2edge.export.mixed import fp16_keep, fp16_storage_only, int8_keep
from sam2edge.export.pipeline import TargetSpec, run_export
from sam2edge.model import Rewrites, Sam2ImageModel, build_sam2
from sam2edge.runtime.backends.executorch import (
    BATCHED_DECODER_FILE,
    DECODER_CPU_FILE,
    DECODER_FILE,
    DECODER_PREP_FILE,
    ENCODER_FILE,
    MAX_POINTS,
    ExecuTorchBackend,
)

# the 2x2 transposed convolutions as one GEMM per pixel (exact): XNNPACK's deconvolution made the full-size
# decoder 7 % slower (84.5 vs 78.5 ms p50 per click in an A/B of the decoder alone); the upscaling
# channels-last and the mask head as one matmul (exact): fewer layout transposes in XNNPACK (with the positional
# encoding kept as rows, decoder_cpu.pte 45.8 -> 41.0 ms per full-size click, `benchmarks/bench_executorch_forms.py
# --graph decoder`). LiteRT's CPU decoder stays NCHW: its converter places the transposes itself, and channels-last
# ran slower there (35.7 vs 37.1 ms, `benchmarks/bench_cpu_decoder.py upscale_layout=nhwc`).
# Hiera's pooling as elementwise maxima in place (exact): XNNPACK's max pool is NHWC, and the NCHW max_pool2d cost
# layout transposes around every pool; the encoder 1997 -> 1890 ms p50 (`--graph encoder`, same notes).
# Hiera's q / k / v as three products (exact): no slice copies of the fused output (fp32 1828 -> 1737 ms, int8
# 1168 -> 1109 ms p50, `--graph encoder [--int8]`).
REWRITES = Rewrites(
    transposed_conv="matmul",
    mask_head="matmul",
    upscale_layout="nhwc",
    q_pool="maxima",
    qkv="split",
    texture_limit=0,
)
# (no token_fold: 16 prompt slots make 22 tokens, and 8 heads x 22 > the inner width 128: folding would cost more)
FP32_COSINE = BARS["fp32"]["min_cosine"]
ACCURACY_BAR = BARS["int8"]["min_iou_worst"]  # int8's worst end-to-end mask IoU vs the fp32 pipeline
FIDELITY_CLICKS = MIN_CLICKS
SIZE_RATIO_MAX = 1.05  # file bytes / parameter bytes at that precision ...
GRAPH_BYTES_PER_OP = 256  # ... plus the serialized graph description (~170 B per operator measured at test-small)


def build_model(sd: dict, cfg: Sam2Config, precision: str) -> Sam2ImageModel:
    model = build_sam2(cfg, REWRITES)
    model.load_state_dict(sd)
    return model  # fp16: fp32 model, its encoder graph wrapped in fp16_encoder (fp16 arithmetic)


def _quantize_int8(module: torch.nn.Module, args: tuple, keep: tuple[str, ...] = ()) -> torch.nn.Module:
    """Dynamic int8 (XNNPACK quantizer) of the linear products (``aten.linear``): per-channel int8 weights,
    activations quantized per call; the layers of ``keep`` stay fp32. The convolutions stay fp32: a dynamically
    quantized one sent XNNPACK's layout pass down a path that failed shape propagation with the pooling maxima
    at run time (docs/design/precision.md)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        LINEAR_TARGETS,
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)

    def kept(node: torch.fx.Node) -> bool:  # inside a layer of ``keep`` (module names under the graph's model)
        stack = [fqn.removeprefix("model.") for fqn, _ in (node.meta.get("nn_module_stack") or {}).values()]
        return any(f == k or f.startswith(k + ".") for f in stack for k in keep)

    def is_linear(node: torch.fx.Node) -> bool:  # nn.Linear layers and Hiera's split q / k / v products
        return node.target in LINEAR_TARGETS and not kept(node)

    quantizer = XNNPACKQuantizer().set_global(config).set_filter_function(is_linear)
    with torch.no_grad():
        graph = torch.export.export(module, args, strict=False).module()
        prepared = prepare_pt2e(graph, quantizer)
        prepared(*args)
        return convert_pt2e(prepared)


def lower_program(
    module: torch.nn.Module,
    args: tuple,
    precision: str,
    role: str,
    keep: tuple[str, ...] = (),
    stored_fp16: frozenset[str] = frozenset(),
):
    """-> (ExecutorchProgramManager, Census) for one graph at one precision (int8: the encoder only, the
    Linear layers of ``keep`` left fp32; ``stored_fp16``: the Linear weights written fp16 beside fp32
    arithmetic, ``executorch_storage.fp16_linear_storage``)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if precision == "int8" and role == "encoder":
        module = _quantize_int8(module, args, keep)
    with fp16_linear_storage(stored_fp16):
        return lower(module, args, [XnnpackPartitioner()])


# operator left outside XNNPACK in a video program or the batched decoder -> why (card.json
# extra.outside_delegate_why); the batched decoder's entries were read off its lowered graph at test-small
OUTSIDE_WHY = {
    "eq": "comparison (slot index / label one-hot, label == -1 pad, candidate IoU == max): XNNPACK has no "
    "comparison operators",
    "ne": "comparison (label != -2: ignored prompt slot): XNNPACK has no comparison operators",
    "gt": "comparison (object present / binarise mask > 0 / stability counts logits > +-delta, union > 0): "
    "XNNPACK has no comparison operators",
    "ge": "comparison (stability >= threshold, SAM 2.1's single-mask choice): XNNPACK has no comparison operators",
    "bitwise_and": "boolean logic of the single-mask choice's first-max tie break: XNNPACK has no boolean operators",
    "bitwise_or": "boolean logic of the single-mask choice's first-max tie break: XNNPACK has no boolean operators",
    "bitwise_not": "boolean logic of the single-mask choice's first-max tie break: XNNPACK has no boolean operators",
    "where": "select on a comparison (pad-point token, stability of an empty union, stable single mask vs best "
    "candidate): XNNPACK has no select operator",
    "max": "max.dim (values and indices) over the candidates' IoU (B, 3) for the single-mask choice, not claimed "
    "by XnnpackPartitioner",
    "cat": "concatenations XNNPACK cannot take: the tie break's boolean one-hot columns (bool tensors) and the "
    "decoder's output tokens repeated to B rows (B inputs; its concatenate takes a few)",
    "dim_order_ops": "dtype cast of a comparison result (bool -> float), or of an fp16 program's fp32 inputs "
    "and outputs, a portable copy",
    "arange": "index range of a sine encoding / one-hot, computed by the portable runtime (not constant-folded)",
    "pow": "sine-encoding frequencies 10000^(2i/C) (not constant-folded), one small portable op",
    "div": "sine-encoding positions / frequencies (not constant-folded), one small portable op",
    "mm": "small matmuls the partitioner leaves out: outer products with ones (slot masks and pointer encodings "
    "repeated, contraction 1) and one-hot (K, T) @ temporal encodings (T, M)",
    "full": "the ones of those outer products, a portable fill",
    "expand_copy": "broadcast of a (1, 1, C) token or bias, or of the output tokens' valid flags, to its batch, "
    "a portable copy",
    "full_like": "constant tensor (no-mask / ignored-slot branch, output tokens' valid flags, tie-break start, "
    "stability of an empty union), a portable fill",
    "alias_copy": "view between delegate partitions (no arithmetic)",
    "squeeze_copy": "view between delegate partitions (no arithmetic)",
    "unsqueeze_copy": "view between delegate partitions (no arithmetic)",
    "slice_copy": "view between delegate partitions (no arithmetic)",
    "view_copy": "view between delegate partitions (no arithmetic)",
}


def outside_why(census: dict) -> dict[str, dict[str, str]]:
    """Program -> operator outside the delegate -> why, for the video programs and the batched decoder."""
    from sam2edge.runtime.video.bundle import VIDEO_BATCH, VIDEO_GRAPHS

    stems = {stem + b for stem, _, _ in VIDEO_GRAPHS.values() for b in ("", f"_b{VIDEO_BATCH}")}
    stems |= {BATCHED_DECODER_FILE.split(".")[0]}
    unknown = "not claimed by XnnpackPartitioner (reason not investigated)"
    return {
        f: {op: OUTSIDE_WHY.get(op, unknown) for op in c["outside_delegate"]}
        for f, c in census.items()
        if f.split(".")[0] in stems
    }


def decoder_model(job) -> Sam2ImageModel:
    """The model of decoder.pte: fp32 at every precision (fp16: rebuilt from the fp32 weights)."""
    return job.model


def _encoder_graph(job) -> torch.nn.Module:
    """The encoder graph; fp16: in fp16 arithmetic with the measured parts kept fp32, or, where no selection
    met the bars that way, in fp32 arithmetic (its Linear weights stored fp16 by ``_convert``)."""
    graph = XnnEncoderGraph(job.model)
    if job.precision != "fp16":
        return graph
    keep = fp16_keep(job, "executorch")
    return graph if fp16_storage_only(job) else fp16_encoder(graph, keep)


def _video_form(job):
    """How each video graph is built: fp16 arithmetic for an fp16 bundle, fp32 (Linear weights stored fp16)
    where the encoder's fp16 arithmetic could not meet the bars."""
    half = vid.half_if_fp16(job)
    return (lambda module, role: module) if fp16_storage_only(job) else half


def _graphs(job) -> dict:
    decoder = decoder_model(job)  # fp32 at every precision: every decoder (FP32_KEPT)
    click = decoder_inputs(job.cfg, MAX_POINTS)
    return {
        ENCODER_FILE: ("encoder", _encoder_graph(job), encoder_inputs(job.cfg)),
        DECODER_FILE: ("decoder", XnnDecoderGraph(decoder), click),
        # what the runtime runs: the image projections once per image, then a decoder given them
        DECODER_PREP_FILE: ("decoder-prep", XnnImageProjectionsGraph(decoder), (click[0], *click[5:])),
        DECODER_CPU_FILE: ("decoder-cpu", XnnGivenDecoderGraph(decoder), given_decoder_inputs(decoder, click)),
        BATCHED_DECODER_FILE: (
            "decoder-batched",
            XnnBatchedDecoderGraph(decoder),
            batched_decoder_inputs(job.cfg, bat.batch_size(job)),
        ),
    }


def _backend(job, decoder: str | None = None) -> ExecuTorchBackend:
    """The staged bundle's backend (``decoder`` None: the prep + decoder_cpu.pte pair, as the runtime runs
    it), with the batched decoder when the job wrote it."""
    batched = BATCHED_DECODER_FILE if BATCHED_DECODER_FILE in job.files else None
    return ExecuTorchBackend(job.folder, job.cfg, batched=batched, decoder=decoder)


def contract_decoder_fidelity(job) -> dict:
    """``decoder.pte`` (card 002's one-decoder contract, for apps that run it alone) measured like the
    bundle, whose runtime runs the prep + ``decoder_cpu.pte``: ``Job.measure_decoder``."""
    return job.measure_decoder(_backend(job, DECODER_FILE), DECODER_FILE, "the contract decoder")


def _convert(job, file: str, module: torch.nn.Module, args: tuple) -> None:
    """Lower one program and measure it against its size limit (kept in job.state for the size check)."""
    role = file.split(".")[0]
    keep = int8_keep(job, "executorch") if job.precision == "int8" and role == "encoder" else ()
    kept = tuple(job.state.get("mixed_precision", {}).get("kept_fp32", ()))
    storage = fp16_storage_only(job)
    stored = frozenset()  # fp16 storage: every program but the decoders (fp32, FP32_KEPT) writes Linear weights fp16
    if storage and not role.startswith("decoder"):
        stored = linear_weights(module, kept if role == "encoder" else ())
    prog, counts = lower_program(module, args, job.precision, role, keep, stored)
    (job.folder / file).write_bytes(prog.buffer)
    del prog
    params = job.state.setdefault("params", None) or parameter_bytes(job.model, job.precision, kept, storage)
    job.state["params"] = params
    if role not in params:  # a video graph: the tensors its exported program holds, at their dtype
        params[role] = program_tensor_bytes(module, args, stored)
    job.state.setdefault("census", {})[file] = counts.as_dict()
    size = (job.folder / file).stat().st_size
    limit = int(SIZE_RATIO_MAX * params[role] + GRAPH_BYTES_PER_OP * counts.total_ops)
    job.state.setdefault("sizes", {})[file] = {
        "bytes": size,
        "parameter_bytes": params[role],
        "ratio": round(size / params[role], 4),
        "limit_bytes": limit,
    }


def size_check(job) -> dict:
    """Each program's bytes vs SIZE_RATIO_MAX x its parameter bytes (+ the graph description)."""
    sizes = job.state["sizes"]
    return {
        "files": sizes,
        "failures": [
            f"{n} is {s['ratio']:.3f}x its parameter bytes ({s['bytes']} > limit {s['limit_bytes']})"
            for n, s in sizes.items()
            if s["bytes"] > s["limit_bytes"]
        ],
    }


def _extra(job) -> dict:
    return {
        "max_points": MAX_POINTS,
        "batch": bat.batch_size(job),  # prompts per call of decoder_batched.pte
        "delegation": job.state["census"],
        "outside_delegate_why": outside_why(job.state["census"]),
        "sizes": job.state["sizes"],
        "rewrites": REWRITES.__dict__,
        "decoders": {
            "runtime": f"{DECODER_PREP_FILE} once per image and mask input, then {DECODER_CPU_FILE} per click",
            "contract": f"{DECODER_FILE}: the same answers from one program (card 002's I/O)",
        },
        "prompt_layout": (
            f"points [1,1,{MAX_POINTS},2] / labels [1,1,{MAX_POINTS}] int64: box corners (2, 3), points (1, 0), "
            "one pad (-1), then ignored slots (-2); (X, Y) in model-input pixels"
        ),
        "preprocess": "resize to SxS bilinear, /255, mean (0.485,0.456,0.406), std (0.229,0.224,0.225), NCHW",
    }


def export_executorch(
    cfg: Sam2Config,
    config_name: str,
    checkpoint: str | None,
    precision: str,
    out: str | Path,
    *,
    force: bool = False,
    command: str = "",
    num_clicks: int = FIDELITY_CLICKS,
) -> dict:
    """``run_export`` for ExecuTorch XNNPACK at ``cfg``'s resolution; returns the card."""
    return run_export(
        "executorch",
        config_name,
        precision,
        out,
        resolution=cfg.image_size,
        checkpoint=checkpoint,
        force=force,
        command=command,
        clicks=num_clicks,
    )


def summary(card: dict, out: Path) -> str:
    fid, ex = card["fidelity"], card["extra"]
    lines = [f"bundle: {out.resolve()} ({card['precision']}, {card['resolution']}px, status {card['status']})"]
    width = max(map(len, ex["sizes"]))
    for name, s in ex["sizes"].items():
        d = ex["delegation"][name]
        lines.append(
            f"  {name:<{width}} {s['bytes'] / 1e6:8.2f} MB = {s['ratio']:.3f}x parameters; "
            f"{d['delegated_ops']}/{d['total_ops']} ops delegated in {d['delegates']} XNNPACK partition(s)"
        )
    worst = min(fid["outputs"].items(), key=lambda kv: kv[1]["cosine"])
    e2e = fid["end_to_end"]
    lines.append(
        f"  worst output cosine {worst[1]['cosine']:.7f} ({worst[0]}); mask IoU vs fp32 over {e2e['clicks']} "
        f"clicks: median {e2e['iou_median']:.4f}, worst {e2e['iou_worst']:.4f}"
    )
    if fid["failures"]:
        lines.append("  FAILED: " + "; ".join(fid["failures"]))
    return "\n".join(lines)


SPEC = TargetSpec(
    name="executorch",
    rewrites=REWRITES,
    graphs=_graphs,
    convert=_convert,
    open_backend=_backend,
    extra=_extra,
    summary=summary,
    model=lambda sd, cfg, precision, rewrites: build_model(sd, cfg, precision),
    checks={
        "size": size_check,
        "batched_decoder": lambda job: bat.check_batched(job, _backend(job)),
        "contract_decoder": contract_decoder_fidelity,
    },
    video=lambda job: vid.entries(job, _video_form(job), named=False),
)
