"""LiteRT export: build -> convert (litert-torch) -> lint -> verify -> bundle.

Writes (see ``sam2edge.runtime.backends.litert`` for every file's inputs / outputs and the host tables):
``encoder.tflite`` (EncoderGraph), ``decoder.tflite`` (TokenDecoderGraph, K host-encoded token slots),
``mask_encoder.tflite`` (MaskEncoderGraph: mask-input prompts run on the accelerator too, so the host
never needs convolution code), ``decoder_batched.tflite`` (``export.batched.BatchedTokenDecoderGraph``:
B token prompts per call, B = ``options={"batch": B}``, default 64; linted and GPU-checked like the
other GPU graphs, measured against single decodes: check ``batched_decoder``), the raw float32 host tables,
``fidelity.json``, ``card.json``, ``manifest.json``.

Graphs are built with the default ``Rewrites()`` (rank-4 math attention, zero-stuff transposed conv,
overflow-safe LayerNorm); inputs and outputs are named through signature kwargs / dict outputs.
fp16 = litert-torch's ``full_fp16_recipe`` (fp16 weights, fp32 I/O) for the encoder and the video graphs, int8 =
its ``full_dynamic_recipe`` for the encoder; the encoder's recipe leaves fp32 the parts the measured selection
keeps (``export.mixed``, applied by ``export.litert_mixed``). The image decoder graphs stay fp32 at every
precision, as ONNX's and ExecuTorch's (``IMAGE_DECODER_FILES``).

Everything else (out-folder guard, weights, fidelity against eager fp32 with the bars of
``checks.fidelity.bars``, the atomic write) is ``sam2edge.export.pipeline``; this module is the LiteRT
``TargetSpec``: graphs, litert-torch conversion, host tables, the graph lint (``checks.tflite.lint``: a
banned op or a >4-D tensor refuses the export unless ``--allow-dirty``), and the target checks
(``POST_EXPORT_CHECKS``: GPU delegate residency; the eager rewrite vs upstream's operations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from sam2edge.checks.fidelity import click_set
from sam2edge.checks.fidelity.measure import MIN_CLICKS
from sam2edge.checks.gpu.report import export_check as gpu_delegate_check
from sam2edge.checks.tflite.lint import LintReport, lint_file
from sam2edge.config import Sam2Config
from sam2edge.errors import UserError
from sam2edge.export import batched as bat
from sam2edge.export import video as vid
from sam2edge.export.litert_convert import convert_graph, convert_kept
from sam2edge.export.mixed import fp16_keep, int8_keep
from sam2edge.export.pipeline import TargetSpec, run_export
from sam2edge.export.wrappers import (
    DECODER_OUTPUTS,
    ENCODER_OUTPUTS,
    IMAGE_PROJECTIONS,
    EncoderGraph,
    GivenTokenDecoderGraph,
    ImageProjectionsGraph,
    MaskEncoderGraph,
    TokenDecoderGraph,
)
from sam2edge.model import Rewrites, Sam2ImageModel, build_sam2
from sam2edge.progress import stage
from sam2edge.runtime.backends import EagerBackend
from sam2edge.runtime.backends.litert import (
    BATCHED_DECODER_FILE,
    CARD_CONST_FILE,
    CPU_ONLY_FILES,
    DECODER_CPU_FILE,
    DECODER_FILE,
    DECODER_PREP_FILE,
    DEFAULT_NUM_TOKENS,
    ENCODER_FILE,
    MASK_ENCODER_FILE,
    SIGNATURE,
    TABLE_FILES,
    LiteRTBackend,
    write_tables,
)
from sam2edge.runtime.prompts import prompt_tables
from sam2edge.runtime.video.bundle import outputs

FIDELITY_CLICKS = MIN_CLICKS
REWRITE_CLICKS = 8  # prompts of the eager-rewrite-vs-upstream comparison (a record, not a bar)
ROLES = {
    ENCODER_FILE: "encoder",
    DECODER_FILE: "decoder",
    MASK_ENCODER_FILE: "mask-encoder",
    DECODER_CPU_FILE: "decoder-cpu",
    DECODER_PREP_FILE: "decoder-prep",
    BATCHED_DECODER_FILE: "decoder-batched",
}
# The prompt-side graphs, fp32 in every bundle (4.2 M parameters at every size; fp16 weights here cost the
# large model's end-to-end median its bar: docs/design/precision.md).
IMAGE_DECODER_FILES = frozenset(
    {DECODER_FILE, DECODER_CPU_FILE, DECODER_PREP_FILE, MASK_ENCODER_FILE, BATCHED_DECODER_FILE}
)
# The CPU decoder: the 2x2 transposed convolutions as one GEMM per pixel (``transposed_conv="matmul"``; XNNPACK's
# TRANSPOSE_CONV ran at half the GEMM rate and the GPU-clean zero-stuffed form does 4x the multiply-adds) and the
# matmul mask head (one BATCH_MATMUL instead of per-token weighted channel sums); both exact.
# Full-size Hiera-Tiny decoder, torch FlopCounter: 6.04 GFLOP with Rewrites() vs 3.64 with these.
# Not ``token_fold``: with the 8 prompt slots (14 tokens) it saves 9 % of the FLOPs, and the converted graph
# ran 2x slower (XNNPACK FULLY_CONNECTED with the 4096x256 image as its weights, re-packed every call:
# 36.3 -> 75.0 ms per click at 1024 px).
# It is given its prompt-independent work (the first layer's three image projections, 0.8 GFLOP at 1024 px)
# by ``decoder_prep.tflite``, run once per image: a click computes 2.8 of the 3.6 GFLOP.
CPU_DECODER_REWRITES = Rewrites(transposed_conv="matmul", mask_head="matmul")


def is_gpu_file(file: str) -> bool:
    """Every .tflite of a bundle (image, batched and video graphs) is linted and GPU-checked, except the CPU
    decoder and its prep graph, which only the CPU runtime loads."""
    return file.endswith(".tflite") and file not in CPU_ONLY_FILES


@dataclass
class ExportContext:
    """What a post-export check sees: the staged folder (all .tflite files and tables written)."""

    folder: Path
    cfg: Sam2Config
    precision: str
    lint: dict[str, LintReport]
    files: dict[str, str] = field(default_factory=dict)  # file -> role
    allow_dirty: bool = False  # --allow-dirty: a check records a failure instead of refusing the export


class NamedOutputs(nn.Module):
    """Wrap a graph returning a tensor or a tuple so that the converted signature names its outputs."""

    def __init__(self, graph: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.inner, self.names = graph, names

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.inner(**inputs)
        out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        return dict(zip(self.names, out, strict=True))


def graphs(model: Sam2ImageModel, num_tokens: int) -> dict[str, tuple[nn.Module, dict[str, torch.Tensor]]]:
    """file -> (named-output module, named sample inputs) for the three LiteRT graphs."""
    cfg = model.cfg
    s, e, c, k = cfg.image_size, cfg.image_embedding_size, cfg.d_model, num_tokens
    g = torch.Generator().manual_seed(0)
    feats = {
        "image_embeddings": torch.randn(1, c, e, e, generator=g),
        "feat_s0": torch.randn(1, c // 8, 4 * e, 4 * e, generator=g),
        "feat_s1": torch.randn(1, c // 4, 2 * e, 2 * e, generator=g),
    }
    prompt = {
        "sparse_prompt": torch.randn(1, k, c, generator=g),
        "sparse_valid": torch.ones(1, k),
        "dense_prompt": torch.randn(1, c, e, e, generator=g),
    }
    return {
        ENCODER_FILE: (
            NamedOutputs(EncoderGraph(model), ENCODER_OUTPUTS),
            {"image": torch.randn(1, 3, s, s, generator=g)},
        ),
        DECODER_FILE: (NamedOutputs(TokenDecoderGraph(model), DECODER_OUTPUTS), {**feats, **prompt}),
        MASK_ENCODER_FILE: (
            NamedOutputs(MaskEncoderGraph(model), ("dense_prompt",)),
            {"mask_input": torch.randn(1, 1, 4 * e, 4 * e, generator=g)},
        ),
    }


def _convert(job, file: str, module: nn.Module, sample: dict[str, torch.Tensor]) -> None:
    precision = _precision(job, file)
    if file == ENCODER_FILE and precision in ("fp16", "int8"):
        keep = fp16_keep(job, "litert") if precision == "fp16" else int8_keep(job, "litert")
        job.state["quantization"] = convert_kept(module, sample, job.folder / file, precision, keep, job.model)
    else:
        convert_graph(module, sample, job.folder / file, precision)


def lint_graphs(folder: Path, files: list[str], allow_dirty: bool) -> dict[str, LintReport]:
    """Lint every file; a GPU-dirty graph raises UserError naming the op and why, unless allow_dirty."""
    reports = {f: lint_file(folder / f) for f in files}
    for f, r in reports.items():
        stage(f"lint {f}: {r.nodes} nodes, highest rank {r.max_rank}; {r.verdict}")
        if not r.clean and not allow_dirty:
            raise UserError(f"{f} is not GPU-clean: {r.problems()[0]}; fix the model rewrite or pass --allow-dirty")
    return reports


def rewrite_vs_upstream(ctx) -> dict:
    """The graphs' own model (``Rewrites()``, eager) vs upstream's operations: per output, on real photos."""
    from sam2edge.checks.fidelity.measure import CachedEncoder, compare_outputs

    prompts = sorted(click_set(REWRITE_CLICKS), key=lambda p: p.photo)
    return compare_outputs(ctx.reference(), CachedEncoder(EagerBackend(ctx.model)), prompts)


def _io_extra(reports: dict[str, LintReport]) -> dict:
    io = {}
    for f, r in reports.items():
        sig = r.signatures.get(SIGNATURE, {"inputs": [], "outputs": []})
        io[f] = {
            "signature": SIGNATURE,
            **{
                kind: [{"name": t.name, "shape": t.shape, "dtype": t.dtype, "position": t.position} for t in sig[kind]]
                for kind in ("inputs", "outputs")
            },
        }
    return io


def _tables_extra(cfg: Sam2Config) -> dict:
    c = cfg.d_model
    tables = {
        name: {"key": key, "shape": list(shape_of(c)), "dtype": "float32 little-endian"}
        for name, (key, shape_of) in TABLE_FILES.items()
    }
    tables[CARD_CONST_FILE] = {
        "layout": f"gaussian [2,{c // 2}] | point_embed[1] [{c}] | not_a_point [{c}] (reference card 001)",
        "floats": c + 2 * c,
        "dtype": "float32 little-endian",
    }
    return tables


def _graphs(job) -> dict:
    out = {name: (ROLES[name], module, kwargs) for name, (module, kwargs) in graphs(job.model, _tokens(job)).items()}
    out.update(_cpu_graphs(job))
    batched = NamedOutputs(bat.BatchedTokenDecoderGraph(job.model, bat.batch_size(job)), DECODER_OUTPUTS)
    out[BATCHED_DECODER_FILE] = (
        ROLES[BATCHED_DECODER_FILE],
        batched,
        bat.sample_inputs(job.model, bat.batch_size(job)),
    )
    return out


def _cpu_graphs(job) -> dict:
    """The CPU runtime's decoder (``CPU_DECODER_REWRITES``), given its image projections by the prep graph."""
    cpu = build_sam2(job.cfg, CPU_DECODER_REWRITES)
    cpu.load_state_dict(job.sd, strict=True)
    _, kwargs = graphs(cpu, _tokens(job))[DECODER_FILE]
    feats = {k: kwargs[k] for k in ("image_embeddings", "dense_prompt")}
    prep = NamedOutputs(ImageProjectionsGraph(cpu), IMAGE_PROJECTIONS)
    with torch.no_grad():
        given = prep(**feats)  # the CPU decoder's sample projections: 3 x (1, HW, Ci), by name
    decoder = NamedOutputs(GivenTokenDecoderGraph(cpu), DECODER_OUTPUTS)
    return {
        DECODER_CPU_FILE: (ROLES[DECODER_CPU_FILE], decoder, {**kwargs, **given}),
        DECODER_PREP_FILE: (ROLES[DECODER_PREP_FILE], prep, feats),
    }


def _backend(job) -> LiteRTBackend:
    """The staged bundle's backend, with the batched decoder when the job wrote it."""
    batched = BATCHED_DECODER_FILE if BATCHED_DECODER_FILE in job.files else None
    return LiteRTBackend(job.folder, job.cfg, _tokens(job), batched=batched)


def gpu_decoder_fidelity(job) -> dict:
    """The GPU decoder (``decoder.tflite``) measured like the bundle (which runs ``decoder_cpu.tflite`` on
    this CPU runtime): ``Job.measure_decoder``."""
    backend = LiteRTBackend(job.folder, job.cfg, _tokens(job), decoder=DECODER_FILE)
    return job.measure_decoder(backend, DECODER_FILE, "GPU decoder, run on the CPU")


def _precision(job, file: str) -> str:
    """int8 quantises the encoder only (as ExecuTorch and ONNX int8; the decoder at int8 misses the int8 bar,
    ``export.kept._INT8_DECODER``). fp16 rounds the weights of every graph but the image decoders
    (``IMAGE_DECODER_FILES``, ``export.kept.FP32_KEPT``)."""
    if job.precision == "int8":
        return "int8" if file == ENCODER_FILE else "fp32"
    return "fp32" if file in IMAGE_DECODER_FILES else job.precision


def _tokens(job) -> int:
    return int(job.state.get("num_tokens", DEFAULT_NUM_TOKENS))


def _lint(job) -> dict[str, LintReport]:
    """GPU graphs: lint, refusing a dirty one; the CPU decoder and its prep graph: linted for the record
    only (the GPU never loads them)."""
    reports = lint_graphs(job.folder, [f for f in job.files if is_gpu_file(f)], job.allow_dirty)
    return reports | {f: lint_file(job.folder / f) for f in job.files if f in CPU_ONLY_FILES}


def _extra(job) -> dict:
    reports = job.lint
    lint = {
        f: {
            "verdict": r.verdict,
            "nodes": r.nodes,
            "max_rank": r.max_rank,
            "ops": r.ops,
            "weight_dtypes": r.weight_dtypes,
        }
        for f, r in reports.items()
    }
    return {
        "num_tokens": _tokens(job),
        "io": _io_extra(reports),
        "tables": _tables_extra(job.cfg),
        "prompt_layout": (
            "sparse_prompt slots in order: box corners (labels 2 = top-left, 3 = bottom-right), then points "
            "(1 = object, 0 = background), then ONE not_a_point pad (label -1); the remaining slots are zero "
            "tokens with sparse_valid 0. Coordinates (X, Y) in model-input pixels of the SxS resized image."
        ),
        "dense_prompt": "no mask input: no_mask.bin broadcast to [1,C,e,e]; mask input: mask_encoder.tflite",
        "preprocess": "resize to SxS bilinear, /255, mean (0.485,0.456,0.406), std (0.229,0.224,0.225), NCHW",
        "lint": lint,
        "gpu_clean": all(r.clean for f, r in reports.items() if is_gpu_file(f)),
        "decoders": {
            "cpu": (
                f"{DECODER_CPU_FILE} (Rewrites {vars(CPU_DECODER_REWRITES)}), run by the CPU runtime, given "
                f"{', '.join(IMAGE_PROJECTIONS)} by {DECODER_PREP_FILE} (once per image and mask input)"
            ),
            "gpu": f"{DECODER_FILE} (GPU-clean), for the GPU delegate and the browser",
        },
        "checks": job.checks,
        **({"quantization": job.state["quantization"]} if "quantization" in job.state else {}),
    }


def export_litert(
    cfg: Sam2Config,
    config_name: str,
    checkpoint: str | None,
    precision: str,
    out: str | Path,
    *,
    allow_dirty: bool = False,
    force: bool = False,
    command: str = "",
    num_tokens: int = DEFAULT_NUM_TOKENS,
    num_clicks: int = FIDELITY_CLICKS,
) -> dict:
    """``run_export`` for LiteRT with ``cfg``'s resolution and ``num_tokens`` prompt slots; returns the card."""
    return run_export(
        "litert",
        config_name,
        precision,
        out,
        resolution=cfg.image_size,
        checkpoint=checkpoint,
        allow_dirty=allow_dirty,
        force=force,
        command=command,
        clicks=num_clicks,
        options={"num_tokens": num_tokens},
    )


def summary(card: dict, out: Path) -> str:
    fid = card["fidelity"]
    lines = [f"bundle: {out.resolve()} ({card['precision']}, {card['resolution']}px, status {card['status']})"]
    for a in card["artifacts"]:
        if a["file"].endswith(".tflite"):
            verdict = card["extra"]["lint"][a["file"]]["verdict"] if is_gpu_file(a["file"]) else "CPU only"
            lines.append(f"  {a['file']:<20} {a['bytes'] / 1e6:8.2f} MB  {verdict}")
    worst = min(fid["outputs"].items(), key=lambda kv: kv[1]["cosine"])
    e2e = fid["end_to_end"]
    lines.append(
        f"  worst output cosine {worst[1]['cosine']:.7f} ({worst[0]}); end-to-end IoU over {e2e['clicks']} "
        f"clicks: median {e2e['iou_median']:.5f}, worst {e2e['iou_worst']:.5f}"
    )
    if fid["failures"]:
        lines.append("  FAILED: " + "; ".join(fid["failures"]))
    return "\n".join(lines)


# check name -> fn(ctx) -> dict recorded in card.json extra["checks"][name]; raise UserError to refuse.
# (The LiteRT GPU-delegate residency check registers here.)
POST_EXPORT_CHECKS: dict[str, Callable[[ExportContext], dict]] = {
    "gpu_delegate": gpu_delegate_check,
    "eager_rewrite_vs_upstream": rewrite_vs_upstream,
    "gpu_decoder_fidelity": gpu_decoder_fidelity,
    "batched_decoder": lambda job: bat.check_batched(job, _backend(job)),
}

SPEC = TargetSpec(
    name="litert",
    rewrites=Rewrites(),
    graphs=_graphs,
    convert=_convert,
    open_backend=_backend,
    extra=_extra,
    summary=summary,
    tables=lambda job: write_tables(prompt_tables(job.model), job.folder),
    lint=_lint,
    checks=POST_EXPORT_CHECKS,
    video=lambda job: vid.entries(job, lambda m, role: NamedOutputs(m, outputs(role)), named=True),
)
