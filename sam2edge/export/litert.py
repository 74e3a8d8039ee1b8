"""LiteRT export: build -> convert (litert-torch) -> lint -> verify -> bundle.

Writes (see ``sam2edge.runtime.litert_backend`` for every file's inputs / outputs and the host tables):
``encoder.tflite`` (EncoderGraph), ``decoder.tflite`` (TokenDecoderGraph, K host-encoded token slots),
``mask_encoder.tflite`` (MaskEncoderGraph: mask-input prompts run on the accelerator too, so the host
never needs convolution code), the raw float32 host tables, ``fidelity.json``, ``card.json``,
``manifest.json``.

Graphs are built with the default ``Rewrites()`` (rank-4 math attention, zero-stuff transposed conv,
overflow-safe LayerNorm); inputs and outputs are named through signature kwargs / dict outputs.
fp16 = litert-torch's ``full_fp16_recipe`` (fp16 weights, fp32 I/O).

Verification before anything is written:
  * lint (``checks.tflite_lint``): a banned op or a >4-D tensor refuses the export unless ``allow_dirty``;
  * ``POST_EXPORT_CHECKS``: further checks on the staged files (e.g. GPU delegate residency), by name;
  * fidelity vs the eager fp32 model with upstream's operations: per output cosine / correlation / max-abs
    on a real photo (encoder outputs; decoder outputs and the mask encoder on the reference features),
    and end-to-end mask IoU over ``num_clicks`` clicks on real photos. Bars in ``BARS``; a failing bundle is
    refused unless ``force`` (then written with status "rejected").
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sam2edge.bundle import CARD, finalize_bundle
from sam2edge.checks.fidelity import click_set, compare, end_to_end, photo
from sam2edge.checks.gpu.report import export_check as gpu_delegate_check
from sam2edge.checks.tflite.lint import LintReport, lint_file
from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.export.wrappers import (
    DECODER_OUTPUTS,
    ENCODER_OUTPUTS,
    EncoderGraph,
    MaskEncoderGraph,
    TokenDecoderGraph,
)
from sam2edge.io import atomic_dir
from sam2edge.model import UPSTREAM, Rewrites, Sam2ImageModel, build_sam2
from sam2edge.progress import Progress, stage
from sam2edge.runtime.backends import Decoded, EagerBackend, Features
from sam2edge.runtime.litert_backend import (
    CARD_CONST_FILE,
    DECODER_FILE,
    DEFAULT_NUM_TOKENS,
    ENCODER_FILE,
    MASK_ENCODER_FILE,
    SIGNATURE,
    TABLE_FILES,
    LiteRTBackend,
    write_tables,
)
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import preprocess
from sam2edge.runtime.prompts import prompt_tables

PRECISIONS = ("fp32", "fp16")
BARS = {"fp32_cosine_min": 0.99999, "iou_median_min": 0.999, "iou_worst_min": 0.99}
FIDELITY_PHOTO = "astronaut.png"
FIDELITY_CLICKS = 40
ROLES = {ENCODER_FILE: "encoder", DECODER_FILE: "decoder", MASK_ENCODER_FILE: "mask-encoder"}


@dataclass
class ExportContext:
    """What a post-export check sees: the staged folder (all .tflite files and tables written)."""

    folder: Path
    cfg: Sam2Config
    precision: str
    lint: dict[str, LintReport]
    files: dict[str, str] = field(default_factory=dict)  # file -> role
    allow_dirty: bool = False  # --allow-dirty: a check records a failure instead of refusing the export


# check name -> fn(ctx) -> dict recorded in card.json extra["checks"][name]; raise UserError to refuse.
# (The LiteRT GPU-delegate residency check of issue 6 registers here.)
POST_EXPORT_CHECKS: dict[str, Callable[[ExportContext], dict]] = {"gpu_delegate": gpu_delegate_check}


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


def convert_graph(module: nn.Module, sample_kwargs: dict[str, torch.Tensor], path: Path, precision: str) -> None:
    """litert-torch conversion of one graph to ``path`` (fp16: fp16 weights, fp32 I/O)."""
    import litert_torch

    quant = None
    if precision == "fp16":
        from litert_torch.generative.quantize.quant_recipes import full_fp16_recipe

        quant = full_fp16_recipe()
    edge = litert_torch.convert(module.eval(), sample_kwargs=sample_kwargs, quant_config=quant)
    edge.export(str(path))
    del edge
    gc.collect()


def lint_graphs(folder: Path, files: list[str], allow_dirty: bool) -> dict[str, LintReport]:
    """Lint every file; a GPU-dirty graph raises UserError naming the op and why, unless allow_dirty."""
    reports = {f: lint_file(folder / f) for f in files}
    for f, r in reports.items():
        stage(f"lint {f}: {r.nodes} nodes, highest rank {r.max_rank}; {r.verdict}")
        if not r.clean and not allow_dirty:
            raise UserError(f"{f} is not GPU-clean: {r.problems()[0]}; fix the model rewrite or pass --allow-dirty")
    return reports


# ---- fidelity ------------------------------------------------------------------------------------


def decoder_cases(cfg: Sam2Config) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Prompt kind -> (coords 1xNx2 model-input px, labels 1xN) in the predictor's layout (box, points, pad)."""
    s = float(cfg.image_size)
    pt, neg, tl, br, pad = (0.45, 0.4), (0.62, 0.7), (0.2, 0.25), (0.72, 0.8), (0.0, 0.0)

    def case(points, labels):
        xy = np.array([[x * s, y * s] if (x, y) != pad else [0.0, 0.0] for x, y in points], np.float32)
        return xy[None], np.array(labels, np.float32)[None]

    return {
        "point": case([pt, pad], [1, -1]),
        "points+negative": case([pt, neg, pad], [1, 0, -1]),
        "box": case([tl, br, pad], [2, 3, -1]),
        "box+point": case([tl, br, pt, pad], [2, 3, 1, -1]),
    }


def _worst(into: dict[str, dict], name: str, m: dict[str, float]) -> None:
    if name not in into:
        into[name] = dict(m)
        return
    w = into[name]
    w["cosine"], w["correlation"] = min(w["cosine"], m["cosine"]), min(w["correlation"], m["correlation"])
    w["max_abs"], w["max_rel"] = max(w["max_abs"], m["max_abs"]), max(w["max_rel"], m["max_rel"])


def _decoded_fields(d: Decoded) -> dict[str, np.ndarray]:
    return dict(zip(DECODER_OUTPUTS, (d.masks, d.iou, d.single_mask, d.single_iou, d.object_score)))


def per_output(ref: EagerBackend, test, x: np.ndarray, mask_encoder: Callable | None = None) -> dict[str, dict]:
    """Worst-case comparison per output: encoder on image ``x``; decoder (every prompt kind, without and
    with a mask input) and mask encoder on the reference features, so that each graph is measured alone."""
    rf, tf = ref.encode(x), test.encode(x)
    out: dict[str, dict] = {}
    for name, attr in zip(ENCODER_OUTPUTS, ("image_embed", "feat_s0", "feat_s1")):
        out[f"encoder.{name}"] = compare(getattr(tf, attr), getattr(rf, attr))
    feats = Features(rf.image_embed, rf.feat_s0, rf.feat_s1)
    first = None
    for coords, labels in decoder_cases(ref.cfg).values():
        r0 = ref.decode(feats, coords, labels, None)
        first = first if first is not None else np.clip(r0.single_mask, -32.0, 32.0)
        for mask in (None, first):
            r = _decoded_fields(ref.decode(feats, coords, labels, mask))
            t = _decoded_fields(test.decode(feats, coords, labels, mask))
            for name in DECODER_OUTPUTS:
                _worst(out, f"decoder.{name}", compare(t[name], r[name]))
    if mask_encoder is not None:
        with torch.no_grad():
            ref_dense = ref.model.sam_prompt_encoder.embed_mask(torch.from_numpy(first)).numpy()
        out["mask_encoder.dense_prompt"] = compare(mask_encoder(first), ref_dense)
    return out


def measure_fidelity(
    ref: EagerBackend, test: LiteRTBackend, rewrite: EagerBackend, precision: str, num_clicks: int
) -> dict:
    """fidelity.json body: per-output comparisons, eager rewrite vs upstream, end-to-end IoU, bars."""
    cfg = ref.cfg
    x = preprocess(photo(FIDELITY_PHOTO), cfg.image_size).numpy()
    stage(f"fidelity: per-output comparison on {FIDELITY_PHOTO} (eager fp32 with upstream's operations = reference)")
    outputs = per_output(ref, test, x, test.encode_mask)
    rewrite_cmp = per_output(ref, rewrite, x)
    bar = Progress(f"fidelity: end-to-end mask IoU over {num_clicks} clicks", num_clicks)
    prompts = sorted(click_set(num_clicks), key=lambda p: p.photo)  # grouped by photo: one encode per photo
    e2e = end_to_end(Sam2Predictor(ref), Sam2Predictor(test), prompts, lambda i, n: bar.step())
    failures = []
    if precision == "fp32":
        failures += [
            f"{k} cosine {v['cosine']:.7f} < {BARS['fp32_cosine_min']}"
            for k, v in outputs.items()
            if v["cosine"] < BARS["fp32_cosine_min"]
        ]
    if e2e["iou_median"] < BARS["iou_median_min"]:
        failures.append(f"end-to-end mask IoU median {e2e['iou_median']:.5f} < {BARS['iou_median_min']}")
    if e2e["iou_worst"] < BARS["iou_worst_min"]:
        failures.append(f"end-to-end mask IoU worst {e2e['iou_worst']:.5f} < {BARS['iou_worst_min']}")
    return {
        "reference": "sam2edge eager fp32 with upstream's operations (Rewrites=UPSTREAM)",
        "photo": FIDELITY_PHOTO,
        "prompt_kinds": list(decoder_cases(cfg)),
        "outputs": outputs,
        "eager_rewrite_vs_upstream": rewrite_cmp,
        "end_to_end": e2e,
        "bars": {k: v for k, v in BARS.items() if precision == "fp32" or not k.startswith("fp32")},
        "passed": not failures,
        "failures": failures,
    }


# ---- the export ----------------------------------------------------------------------------------


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / CARD).is_file())):
        raise UserError(f"{out} exists and is not an export bundle; choose an empty or new --out folder")


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
    """Build, convert, lint, check, verify and write a LiteRT bundle into ``out``; returns the card."""
    from sam2edge.weights import load_weights

    if precision not in PRECISIONS:
        raise UserError(f"LiteRT export supports --precision {' or '.join(PRECISIONS)}, not {precision!r}")
    out = Path(out)
    _check_out(out)
    sd, prov = load_weights(checkpoint, cfg)
    model = build_sam2(cfg, Rewrites())
    model.load_state_dict(sd)
    with atomic_dir(out) as tmp:
        for i, (name, (module, kwargs)) in enumerate(graphs(model, num_tokens).items()):
            stage(f"convert {i + 1}/3 {name} ({precision}, {cfg.image_size}px) with litert-torch")
            convert_graph(module, kwargs, tmp / name, precision)
        files = {name: ROLES[name] for name in (ENCODER_FILE, DECODER_FILE, MASK_ENCODER_FILE)}
        reports = lint_graphs(tmp, list(files), allow_dirty)
        files.update(write_tables(prompt_tables(model), tmp))
        ctx = ExportContext(tmp, cfg, precision, reports, dict(files), allow_dirty)
        checks = {}
        for check_name, check in POST_EXPORT_CHECKS.items():
            stage(f"check: {check_name}")
            checks[check_name] = check(ctx)
        ref = EagerBackend.from_state_dict(sd, cfg, UPSTREAM)
        test = LiteRTBackend(tmp, cfg, num_tokens)
        fidelity = measure_fidelity(ref, test, EagerBackend(model), precision, num_clicks)
        fidelity["checks"] = checks  # post-export checks (GPU delegate residency / numerics) in fidelity.json
        if not fidelity["passed"] and not force:
            raise UserError(f"export refused: {fidelity['failures'][0]}; pass --force to write it as 'rejected'")
        extra = {
            "num_tokens": num_tokens,
            "io": _io_extra(reports),
            "tables": _tables_extra(cfg),
            "prompt_layout": (
                "sparse_prompt slots in order: box corners (labels 2 = top-left, 3 = bottom-right), then points "
                "(1 = object, 0 = background), then ONE not_a_point pad (label -1); the remaining slots are zero "
                "tokens with sparse_valid 0. Coordinates (X, Y) in model-input pixels of the SxS resized image."
            ),
            "dense_prompt": "no mask input: no_mask.bin broadcast to [1,C,e,e]; mask input: mask_encoder.tflite",
            "preprocess": "resize to SxS bilinear, /255, mean (0.485,0.456,0.406), std (0.229,0.224,0.225), NCHW",
            "lint": {
                f: {
                    "verdict": r.verdict,
                    "nodes": r.nodes,
                    "max_rank": r.max_rank,
                    "ops": r.ops,
                    "weight_dtypes": r.weight_dtypes,
                }
                for f, r in reports.items()
            },
            "gpu_clean": all(r.clean for r in reports.values()),
            "checks": checks,
        }
        card = finalize_bundle(
            tmp,
            target="litert",
            precision=precision,
            resolution=cfg.image_size,
            config=config_name,
            source=prov,
            command=command,
            artifacts=files,
            fidelity=fidelity,
            status="shippable" if fidelity["passed"] else "rejected",
            extra=extra,
        )
    return card


def export_from_args(args: argparse.Namespace) -> int:
    """``sam2edge export --target litert`` (see ``sam2edge.cli.export``)."""
    cfg = get_config(args.config)
    if args.resolution is not None:
        cfg = cfg.at_resolution(args.resolution)
    card = export_litert(
        cfg,
        args.config,
        args.checkpoint,
        args.precision,
        args.out,
        allow_dirty=args.allow_dirty,
        force=args.force,
        command=getattr(args, "command_line", ""),
    )
    print(summary(card, Path(args.out)))
    return 0


def summary(card: dict, out: Path) -> str:
    fid = card["fidelity"]
    lines = [f"bundle: {out.resolve()} ({card['precision']}, {card['resolution']}px, status {card['status']})"]
    for a in card["artifacts"]:
        if a["file"].endswith(".tflite"):
            lines.append(f"  {a['file']:<20} {a['bytes'] / 1e6:8.2f} MB  {card['extra']['lint'][a['file']]['verdict']}")
    worst = min(fid["outputs"].items(), key=lambda kv: kv[1]["cosine"])
    e2e = fid["end_to_end"]
    lines.append(
        f"  worst output cosine {worst[1]['cosine']:.7f} ({worst[0]}); end-to-end IoU over {e2e['clicks']} "
        f"clicks: median {e2e['iou_median']:.5f}, worst {e2e['iou_worst']:.5f}"
    )
    if fid["failures"]:
        lines.append("  FAILED: " + "; ".join(fid["failures"]))
    return "\n".join(lines)
