"""ExecuTorch XNNPACK export: build -> (quantize) -> lower -> verify -> bundle (reference card 002).

Writes ``encoder.pte`` (``XnnEncoderGraph``) and ``decoder.pte`` (``XnnDecoderGraph``, prompt encoder
inside, ``MAX_POINTS`` prompt slots), ``fidelity.json``, ``card.json``, ``manifest.json``; I/O of both
programs in ``sam2edge.runtime.executorch_backend``.

Model: ``Rewrites(transposed_conv="native")`` (XNNPACK has a deconvolution; the zero-stuff form would
need zero-filled tensors it cannot make), rank-4 math attention, overflow-safe LayerNorm; the graph
legalization of ``executorch_lower`` puts LayerNorm, attention and (fp32) GELU in the delegate.
Precisions (I/O fp32 for all):
  fp32  as is;
  fp16  ``model.half()``; XNNPACK's fp16 GELU is an approximation (measured up to 15 % relative error), so
        GELU stays exact on the portable kernel and is reported outside the delegate;
  int8  dynamic int8 (per-channel symmetric weights, per-token activations) on every Linear of the
        encoder via the XNNPACK quantizer (torchao pt2e); the decoder stays fp32 (4.2 M parameters; its
        int8 lowering fails in XNNPACK's ChannelsLastTaggedReshapePass on the mask-input LayerNorm2d).
        Must pass the accuracy bar (``ACCURACY_BAR``) or is refused.
Fidelity: per-output comparison with eager fp32 with upstream's operations, and end-to-end mask IoU over
``FIDELITY_CLICKS`` clicks on real photos against that fp32 pipeline. fp32 must reach cosine
``FP32_COSINE`` on every output; fp16 / int8 must reach the bar (worst IoU >= 0.95) or are refused
(``--force`` writes them with status "rejected").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from sam2edge.bundle import CARD, finalize_bundle
from sam2edge.checks.fidelity import click_set, compare, end_to_end, photo
from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.export.executorch_graphs import XnnDecoderGraph, XnnEncoderGraph, decoder_inputs, encoder_inputs
from sam2edge.export.executorch_lower import lower
from sam2edge.export.wrappers import DECODER_OUTPUTS, ENCODER_OUTPUTS
from sam2edge.io import atomic_dir
from sam2edge.model import UPSTREAM, Rewrites, Sam2ImageModel, build_sam2
from sam2edge.progress import Progress, stage
from sam2edge.runtime.backends import EagerBackend, Features
from sam2edge.runtime.executorch_backend import DECODER_FILE, ENCODER_FILE, MAX_POINTS, ExecuTorchBackend
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import preprocess

PRECISIONS = ("fp32", "fp16", "int8")
REWRITES = Rewrites(transposed_conv="native", texture_limit=0)  # XNNPACK: no texture limits
FP32_COSINE = 0.99999
ACCURACY_BAR = 0.95  # worst end-to-end mask IoU vs the fp32 pipeline, every precision below fp32
FIDELITY_CLICKS = 40
FIDELITY_PHOTO = "astronaut.png"
SIZE_RATIO_MAX = 1.05  # file bytes / parameter bytes at that precision ...
GRAPH_BYTES_PER_OP = 256  # ... plus the serialized graph description (~170 B per operator measured at test-small)
DECODER_PARTS = ("sam_prompt_encoder.", "sam_mask_decoder.")
ENCODER_ONLY = ("sam_mask_decoder.conv_s0.", "sam_mask_decoder.conv_s1.")


def build_model(sd: dict, cfg: Sam2Config, precision: str) -> Sam2ImageModel:
    model = build_sam2(cfg, REWRITES)
    model.load_state_dict(sd)
    return model.half() if precision == "fp16" else model


def _quantize_int8(module: torch.nn.Module, args: tuple) -> torch.nn.Module:
    """Dynamic int8 (XNNPACK quantizer): per-channel int8 weights, activations quantized per call."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    with torch.no_grad():
        graph = torch.export.export(module, args, strict=False).module()
        prepared = prepare_pt2e(graph, quantizer)
        prepared(*args)
        return convert_pt2e(prepared)


def lower_program(module: torch.nn.Module, args: tuple, precision: str, role: str):
    """-> (ExecutorchProgramManager, Census) for one graph at one precision (int8: the encoder only)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if precision == "int8" and role == "encoder":
        module = _quantize_int8(module, args)
    return lower(module, args, [XnnpackPartitioner()])


def parameter_bytes(model: Sam2ImageModel, precision: str) -> dict[str, int]:
    """Bytes of the parameters each program holds, at ``precision``.

    int8: encoder Linear weights 1 byte each + one fp32 scale per output channel; everything else fp32.
    """
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {"encoder": 0, "decoder": 0}
    for name, p in model.named_parameters():
        if precision == "int8" and name in linear and not name.startswith(DECODER_PARTS):
            size = p.numel() + 4 * p.shape[0]
        else:
            size = p.numel() * (2 if precision == "fp16" else 4)
        part = "decoder" if name.startswith(DECODER_PARTS) and not name.startswith(ENCODER_ONLY) else "encoder"
        out[part] += size
    return out


def per_output(ref: EagerBackend, test: ExecuTorchBackend, x: np.ndarray) -> dict[str, dict]:
    """Worst comparison per output: encoder on ``x``; decoder on the reference features for a click,
    clicks + negative, a box, box + click, each without and with a mask input."""
    rf, tf = ref.encode(x), test.encode(x)
    out = {
        f"encoder.{n}": compare(getattr(tf, a), getattr(rf, a))
        for n, a in zip(ENCODER_OUTPUTS, ("image_embed", "feat_s0", "feat_s1"))
    }
    s = float(ref.cfg.image_size)
    pt, neg, tl, br, pad = [0.45, 0.4], [0.62, 0.7], [0.2, 0.25], [0.72, 0.8], [0.0, 0.0]
    cases = [
        ([pt, pad], [1, -1]),
        ([pt, neg, pad], [1, 0, -1]),
        ([tl, br, pad], [2, 3, -1]),
        ([tl, br, pt, pad], [2, 3, 1, -1]),
    ]
    feats = Features(rf.image_embed, rf.feat_s0, rf.feat_s1)
    for pts, labels in cases:
        coords, lab = (np.array(pts, np.float32) * s)[None], np.array(labels, np.float32)[None]
        first = np.clip(ref.decode(feats, coords, lab, None).single_mask, -32, 32)
        for mask in (None, first):
            r, t = ref.decode(feats, coords, lab, mask), test.decode(feats, coords, lab, mask)
            for name, a in zip(DECODER_OUTPUTS, ("masks", "iou", "single_mask", "single_iou", "object_score")):
                m = compare(getattr(t, a), getattr(r, a))
                key = f"decoder.{name}"
                if key not in out or m["cosine"] < out[key]["cosine"]:
                    out[key] = m
    return out


def measure_fidelity(ref: EagerBackend, test: ExecuTorchBackend, precision: str, num_clicks: int) -> dict:
    """fidelity.json body: per-output comparisons, end-to-end IoU vs the fp32 pipeline, bar verdict."""
    x = preprocess(photo(FIDELITY_PHOTO), ref.cfg.image_size).numpy()
    stage(f"fidelity: per-output comparison on {FIDELITY_PHOTO}")
    outputs = per_output(ref, test, x)
    bar = Progress(f"fidelity: end-to-end mask IoU over {num_clicks} clicks", num_clicks)
    e2e = end_to_end(Sam2Predictor(ref), Sam2Predictor(test), click_set(num_clicks), lambda i, n: bar.step())
    failures = []
    if precision == "fp32":
        low = {k: v["cosine"] for k, v in outputs.items() if v["cosine"] < FP32_COSINE}
        failures += [f"{k} cosine {c:.7f} < {FP32_COSINE}" for k, c in low.items()]
    elif e2e["iou_worst"] < ACCURACY_BAR:
        failures.append(
            f"{precision} worst mask IoU {e2e['iou_worst']:.4f} (median {e2e['iou_median']:.4f}) over "
            f"{e2e['clicks']} clicks < the {ACCURACY_BAR} bar"
        )
    return {
        "reference": "sam2edge eager fp32 with upstream's operations (Rewrites=UPSTREAM): the fp32 pipeline",
        "photo": FIDELITY_PHOTO,
        "outputs": outputs,
        "end_to_end": e2e,
        "bars": {"fp32_cosine_min": FP32_COSINE} if precision == "fp32" else {"iou_worst_min": ACCURACY_BAR},
        "passed": not failures,
        "failures": failures,
    }


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / CARD).is_file())):
        raise UserError(f"{out} exists and is not an export bundle; choose an empty or new --out folder")


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
    """Build, lower, verify and write an ExecuTorch XNNPACK bundle into ``out``; returns the card."""
    from sam2edge.weights import load_weights

    if precision not in PRECISIONS:
        raise UserError(f"ExecuTorch export supports --precision {', '.join(PRECISIONS)}, not {precision!r}")
    out = Path(out)
    _check_out(out)
    sd, prov = load_weights(checkpoint, cfg)
    model = build_model(sd, cfg, precision)
    programs = {
        ENCODER_FILE: (XnnEncoderGraph(model), encoder_inputs(cfg)),
        DECODER_FILE: (XnnDecoderGraph(model), decoder_inputs(cfg, MAX_POINTS)),
    }
    params = parameter_bytes(model, precision)
    with atomic_dir(out) as tmp:
        census, sizes = {}, {}
        for i, (name, (module, args)) in enumerate(programs.items()):
            stage(f"lower {i + 1}/2 {name} ({precision}, {cfg.image_size}px) to ExecuTorch XNNPACK")
            role = name.split(".")[0]
            prog, counts = lower_program(module.eval(), args, precision, role)
            (tmp / name).write_bytes(prog.buffer)
            del prog
            census[name] = counts.as_dict()
            size = (tmp / name).stat().st_size
            limit = int(SIZE_RATIO_MAX * params[role] + GRAPH_BYTES_PER_OP * counts.total_ops)
            sizes[name] = {
                "bytes": size,
                "parameter_bytes": params[role],
                "ratio": round(size / params[role], 4),
                "limit_bytes": limit,
            }
        ref = EagerBackend.from_state_dict(sd, cfg, UPSTREAM)
        fidelity = measure_fidelity(ref, ExecuTorchBackend(tmp, cfg), precision, num_clicks)
        fidelity["failures"] += [
            f"{n} is {s['ratio']:.3f}x its parameter bytes ({s['bytes']} > limit {s['limit_bytes']})"
            for n, s in sizes.items()
            if s["bytes"] > s["limit_bytes"]
        ]
        fidelity["passed"] = not fidelity["failures"]
        if not fidelity["passed"] and not force:
            raise UserError(f"export refused: {fidelity['failures'][0]}; pass --force to write it marked 'rejected'")
        extra = {
            "max_points": MAX_POINTS,
            "delegation": census,
            "sizes": sizes,
            "rewrites": REWRITES.__dict__,
            "prompt_layout": (
                f"points [1,1,{MAX_POINTS},2] / labels [1,1,{MAX_POINTS}] int64: box corners (2, 3), points (1, 0), "
                "one pad (-1), then ignored slots (-2); (X, Y) in model-input pixels"
            ),
            "preprocess": "resize to SxS bilinear, /255, mean (0.485,0.456,0.406), std (0.229,0.224,0.225), NCHW",
        }
        card = finalize_bundle(
            tmp,
            target="executorch",
            precision=precision,
            resolution=cfg.image_size,
            config=config_name,
            source=prov,
            command=command,
            artifacts={ENCODER_FILE: "encoder", DECODER_FILE: "decoder"},
            fidelity=fidelity,
            status="shippable" if fidelity["passed"] else "rejected",
            extra=extra,
        )
    return card


def summary(card: dict, out: Path) -> str:
    fid, ex = card["fidelity"], card["extra"]
    lines = [f"bundle: {out.resolve()} ({card['precision']}, {card['resolution']}px, status {card['status']})"]
    for name, s in ex["sizes"].items():
        d = ex["delegation"][name]
        lines.append(
            f"  {name:<12} {s['bytes'] / 1e6:8.2f} MB = {s['ratio']:.3f}x parameters; "
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


def export_from_args(args: argparse.Namespace) -> int:
    """``sam2edge export --target executorch`` (see ``sam2edge.cli.export``)."""
    cfg = get_config(args.config)
    if args.resolution is not None:
        cfg = cfg.at_resolution(args.resolution)
    card = export_executorch(
        cfg,
        args.config,
        args.checkpoint,
        args.precision,
        args.out,
        force=args.force,
        command=getattr(args, "command_line", ""),
    )
    print(summary(card, Path(args.out)))
    return 0
