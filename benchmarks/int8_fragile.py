"""Why an int8 export holds or is refused: the emulated all-int8 encoder per activation granularity, weight
rounding and quantised operand, and how fragile the reference masks of its lowest clicks are.

    .venv/bin/python benchmarks/int8_fragile.py CHECKPOINT... [--config sam2.1-hiera-tiny] [--clicks 40] [--rows TEXT]

For each checkpoint, the all-int8 encoder (``export.int8_sensitivity.Int8Emulation``: int8 weights per output
channel, fp32 decoder) is measured end to end against eager fp32 with upstream's operations over the export's
click set: activations per tensor (ONNX's ``DynamicQuantizeLinear``) and per token (XNNPACK's dynamic
kernels: ExecuTorch, LiteRT; LiteRT's int8 convolutions too, a 1x1 one's activations per pixel, the patch
embedding's one range per image, and with them kept fp32), the encoder plain, with its norms' pairs scaled
(SmoothQuant) or shifted and scaled with the values' pair too (``export.smooth``, as exported), its weights
rounded to the nearest grid point or with GPTQ's compensation (``export.gptq``, as every int8 export does), and
with weights or activations alone int8 (which of the two a click's failure comes from). Every row names its
lowest clicks with what makes a reference mask fragile (``checks.fidelity.metrics.end_to_end``): its area in pixels (a
3-pixel mask reads IoU 0.33 for one pixel flipped) and the share of its low-res logits within 0.1 of the
threshold (a near-flat logit map flips under any rounding). Full size, 2 cores: about 30 s a row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

from sam2edge.checks.bench.script import add_checkpoints, at_least, first, missing_files, parsed, refusing


class Row(NamedTuple):
    label: str
    target: str  # whose activation granularity the emulation uses
    smoothing: str  # "none"; "scale": the norms' pairs scaled only (SmoothQuant); "shift": export.smooth as exported
    gptq: bool  # weights rounded with export.gptq (else nearest)
    quantised: str = "both"  # "both", "weights" (activations fp32) or "activations" (weights fp32)
    convs_fp32: bool = False  # LiteRT: the encoder graph's convolutions kept fp32 (its linear layers int8)


ROWS = (
    Row("per tensor, plain", "onnx", "none", False),
    Row("per token, plain", "executorch", "none", False),
    Row("per token, norms scaled", "executorch", "scale", False),
    Row("per token, norms scaled + GPTQ", "executorch", "scale", True),
    Row("per token, shifted and scaled", "executorch", "shift", False),
    Row("per token, shifted and scaled, weights int8 only", "executorch", "shift", False, "weights"),
    Row("per token, shifted and scaled, activations int8 only", "executorch", "shift", False, "activations"),
    Row("per tensor, shifted and scaled + GPTQ (ONNX int8 as exported)", "onnx", "shift", True),
    Row("per token, shifted and scaled + GPTQ (ExecuTorch int8 as exported)", "executorch", "shift", True),
    Row(
        "LiteRT int8 as exported (convolutions int8: 1x1 per pixel, patch embedding per image)", "litert", "shift", True
    ),
    Row("LiteRT int8, its convolutions kept fp32", "litert", "shift", True, convs_fp32=True),
)


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    labels = "; ".join(r.label for r in ROWS)
    return first(
        at_least("--clicks", args.clicks),
        None if _rows(args.rows) else f"--rows {args.rows!r}: no row's label holds it; labels: {labels}",
        missing_files(args.checkpoints, "give SAM 2.1 checkpoints' paths"),
    )


def _rows(text: str) -> tuple[Row, ...]:
    """The rows whose label holds ``text`` (every row for "")."""
    return tuple(r for r in ROWS if text in r.label)


def prepared(sd: dict, cfg, row: Row) -> dict:
    """The state dict ``row`` quantises: ``sd`` smoothed as ``row.smoothing`` says, GPTQ-rounded if ``row.gptq``
    (shifted and scaled + GPTQ: ``export.smooth.prepared_weights``, what every int8 export quantises)."""
    from sam2edge.export import gptq, smooth
    from sam2edge.model import Rewrites

    if row.smoothing == "shift" and row.gptq:
        return smooth.prepared_weights(sd, cfg, "int8")[0]
    if row.smoothing != "none":
        sd = smooth.smoothed(sd, cfg, Rewrites(), shift=row.smoothing == "shift")[0]
    return gptq.compensated(sd, cfg, smooth.CALIBRATION_PHOTOS)[0] if row.gptq else sd


def measure(sd: dict, cfg, row: Row, reference, prompts) -> dict:
    """End-to-end summary (worst, median, lowest clicks with their fragility) of the emulation ``row`` on the
    state dict it quantises (``prepared``)."""
    from torch import nn

    from sam2edge.checks.fidelity.metrics import end_to_end
    from sam2edge.export.int8_sensitivity import Int8Emulation
    from sam2edge.export.precision import GraphBackend
    from sam2edge.runtime.predictor import Sam2Predictor

    emu = Int8Emulation(sd, cfg, row.target, reference)
    for layer in emu.layers.values():
        if row.convs_fp32 and isinstance(layer, nn.Conv2d):
            layer.int8_enabled = False
        if row.quantised == "activations":
            layer.int8_weight = layer.weight.detach()
        elif row.quantised == "weights":
            layer.int8_granularity = "none"
    test = Sam2Predictor(GraphBackend(emu.quant, cfg, decoder_model=emu.fp32))
    return end_to_end(Sam2Predictor(reference), test, prompts)


@refusing
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoints(p)
    p.add_argument("--clicks", type=int, default=40)
    p.add_argument("--rows", default="", help="only the rows whose label holds this text (e.g. LiteRT)")
    args = parsed(p, argv, _problem)
    if args is None:
        return 2
    import torch

    from sam2edge.checks.fidelity import click_set
    from sam2edge.checks.fidelity.measure import CachedReference
    from sam2edge.config import get_config
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.weights import load_weights

    torch.set_num_threads(2)
    cfg, prompts = get_config(args.config), click_set(args.clicks)
    print("| checkpoint | int8 form | worst | median | lowest clicks (IoU, reference mask px, logits near 0) |")
    print("|---|---|---|---|---|")
    for path in args.checkpoints:
        sd, _ = load_weights(path, cfg)
        reference = CachedReference(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
        weights: dict[tuple[str, bool], dict] = {}  # (smoothing, gptq) -> the state dict rows with both quantise
        for row in _rows(args.rows):
            key = (row.smoothing, row.gptq)
            if key not in weights:
                weights[key] = prepared(sd, cfg, row)
            e = measure(weights[key], cfg, row, reference, prompts)
            low = "; ".join(
                f"{c['photo']} {c['kind']} {c['iou']:.3f}, {c['ref_mask_px']} px, {c['ref_logits_near_0']:.0%}"
                for c in e["lowest_clicks"][:3]
            )
            name = Path(path).stem
            print(f"| {name} | {row.label} | {e['iou_worst']:.4f} | {e['iou_median']:.4f} | {low} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
