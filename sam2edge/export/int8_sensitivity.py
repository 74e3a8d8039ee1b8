"""int8 sensitivity sweep: which encoder layers cost the final mask IoU when quantised (``sam2edge diagnose --int8``).

Every target's int8 bundle quantises the encoder's Linear layers dynamically (int8 weights per output channel,
activations quantised per call; ``export.kept``), LiteRT's its convolutions too (``targets.Target.int8_layers``).
This module emulates that in eager PyTorch with fake quantisation of each ``nn.Linear`` of ``image_encoder``
(and, for LiteRT, each ``nn.Conv2d`` of the encoder graph: a 1x1 one's activations per pixel, the patch
embedding's one range per image; ``benchmarks/int8_draws.py`` compares the emulation with a bundle):

  weights      symmetric int8 per output channel (scale = max|w_row| / 127), every target;
  activations  asymmetric uint8 per call: per token (``per_token``: XNNPACK's dynamic quantiser, LiteRT's
               dynamic-range kernels) or per tensor (ONNX ``DynamicQuantizeLinear``: one range for the whole
               input, the stricter of the two: an outlier channel widens every token's step).

``sweep`` measures, over ``click_set(clicks)`` against eager fp32 with upstream's operations, the all-int8 encoder
(baseline) and then, for each Linear, the same with only that layer kept fp32: a layer whose fp32 copy lifts the
worst / mean mask IoU most is the one to keep (or to give SmoothQuant-style scaling). The decoder stays fp32, as
in every int8 bundle. The clicks below the int8 bar are listed with their photo and prompt kind.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.config import Sam2Config

ENCODER = "image_encoder."
# target -> activation granularity of its dynamic int8 kernels
ACTIVATIONS = {"executorch": "per_token", "litert": "per_token", "onnx": "per_tensor"}
# relative size of the dither that makes an emulation draw (``Int8Emulation.ious(draw=k)``). Each int8 layer rounds
# its input again, so a difference in fp32 rounding (another kernel, another CPU) grows within a few layers to the
# size of int8's own error: an XNNPACK program is one draw of int8's rounding, as an emulation dithered by 1e-6 is
# another. upstream-s4-outliers' ExecuTorch int8 image embedding (chelsea.png) is 0.0055 from fp32 (relative L2),
# 0.0046 from its emulation, and two dithered emulations are 0.0047 apart (``benchmarks/int8_draws.py``)
DITHER = 1e-6
# draws each int8 selection measurement takes: a click holds only where it holds in every draw
DRAWS = 3


def fake_quant_weight(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per output channel (rows of a Linear weight), dequantised."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def fake_quant_activation(x: torch.Tensor, granularity: str, dither: torch.Generator | None = None) -> torch.Tensor:
    """Asymmetric uint8 (range including 0), per token (last dim reduced) or per tensor, dequantised;
    ``"none"``: ``x`` itself (weights-only int8, for diagnosis). ``dither``: ``x`` first scaled elementwise by
    ``1 + DITHER * N(0, 1)`` drawn from it (one draw of int8's rounding, ``Int8Emulation.ious``)."""
    if granularity == "none":
        return x
    if dither is not None:
        x = x * (1.0 + DITHER * torch.randn(x.shape, generator=dither))
    dims = (-1,) if granularity == "per_token" else tuple(range(x.dim()))
    lo = x.amin(dim=dims, keepdim=True).clamp_max(0.0)
    hi = x.amax(dim=dims, keepdim=True).clamp_min(0.0)
    scale = ((hi - lo) / 255.0).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    return (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale


def _int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not self.int8_enabled:
        return F.linear(x, self.weight, self.bias)
    return F.linear(fake_quant_activation(x, self.int8_granularity, self.int8_dither), self.int8_weight, self.bias)


def _int8_conv_forward(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    if not self.int8_enabled:
        return self._conv_forward(x, self.weight, self.bias)
    if self.int8_granularity == "per_pixel":  # x (B, C, H, W): one range per pixel's C channels
        x = fake_quant_activation(x.movedim(1, -1), "per_token", self.int8_dither).movedim(-1, 1)
    else:
        x = fake_quant_activation(x, self.int8_granularity, self.int8_dither)
    return self._conv_forward(x, self.int8_weight, self.bias)


# convolutions in the encoder graph outside ``image_encoder``: the decoder's feature projections folded into it
ENCODER_GRAPH_CONVS = ("sam_mask_decoder.conv_s0", "sam_mask_decoder.conv_s1")


def int8_layers(model: nn.Module, granularity: str, kinds: tuple[str, ...] = ("linear",)) -> dict[str, nn.Module]:
    """Switch every encoder-graph layer of ``kinds`` of ``model`` (in place) to fake-quantised int8: "linear",
    every encoder Linear (activations at ``granularity``); "conv", every Conv2d of the encoder and
    ``ENCODER_GRAPH_CONVS`` (weights per output channel; activations as LiteRT's dynamic-range kernels take them:
    a 1x1 convolution one range per pixel, as a fully connected layer's rows, any other one range per image).
    name -> layer (each has an ``int8_enabled`` flag to keep it fp32)."""
    out = {}
    for name, m in model.named_modules():
        if "linear" in kinds and name.startswith(ENCODER) and isinstance(m, nn.Linear):
            m.int8_weight = fake_quant_weight(m.weight.detach())
            m.int8_granularity, m.int8_enabled, m.int8_dither = granularity, True, None
            m.forward = types.MethodType(_int8_forward, m)
            out[name] = m
        elif "conv" in kinds and isinstance(m, nn.Conv2d) and (name.startswith(ENCODER) or name in ENCODER_GRAPH_CONVS):
            m.int8_weight = fake_quant_weight(m.weight.detach().flatten(1)).view_as(m.weight)
            m.int8_granularity = "per_pixel" if m.kernel_size == (1, 1) else "per_tensor"
            m.int8_enabled, m.int8_dither = True, None
            m.forward = types.MethodType(_int8_conv_forward, m)
            out[name] = m
    return out


def fused_qkv(rewrites):
    """``rewrites`` with the fused qkv Linear (the "split" form multiplies by derived copies the fake
    quantisation would miss; per output channel and per token, both forms quantise identically)."""
    from dataclasses import replace

    return replace(rewrites, qkv="fused")


@dataclass(frozen=True)
class LayerRow:
    layer: str  # module name
    iou_worst: float  # end-to-end worst mask IoU with this layer kept fp32 (all other encoder Linears int8)
    iou_mean: float  # mean over the clicks

    def as_dict(self) -> dict:
        return {"layer": self.layer, "iou_worst": self.iou_worst, "iou_mean": self.iou_mean}


class Int8Emulation:
    """The all-int8 encoder of ``sd`` (fake-quantised Linears, ``target``'s activation granularity) with an
    fp32 decoder, measured end to end against ``reference`` (a backend: eager fp32, upstream's operations)."""

    def __init__(self, sd: dict, cfg: Sam2Config, target: str, reference) -> None:
        from sam2edge.export.precision import EMULATIONS
        from sam2edge.model import build_sam2
        from sam2edge.runtime.predictor import Sam2Predictor

        self.cfg, self.ref = cfg, Sam2Predictor(reference)
        self.fp32 = build_sam2(cfg, EMULATIONS[target].rewrites)
        self.fp32.load_state_dict(sd)
        self.fp32.eval()
        self.quant = build_sam2(cfg, fused_qkv(EMULATIONS[target].rewrites))
        self.quant.load_state_dict(sd)
        self.quant.eval()
        from sam2edge.targets import get_target

        self.layers = int8_layers(self.quant, ACTIVATIONS[target], get_target(target).int8_layers)

    def ious(self, prompts, kept: tuple[str, ...] = (), draw: int = 0) -> list[float]:
        """Per-prompt mask IoU with the layers of ``kept`` in fp32 and every other encoder Linear int8. ``draw``
        k > 0: every quantised activation dithered (``DITHER``) from one generator seeded with k, so the same
        draw gives the same IoUs; 0: not dithered."""
        from sam2edge.export.precision import _ious
        from sam2edge.runtime.predictor import Sam2Predictor

        with self._drawn(kept, draw) as backend:
            return _ious(self.ref, Sam2Predictor(backend), prompts)

    def encode(self, image, kept: tuple[str, ...] = (), draw: int = 0):
        """The emulated encoder's ``Features`` of a preprocessed ``image``, ``kept`` and ``draw`` as ``ious``."""
        with self._drawn(kept, draw) as backend:
            return backend.encode(image)

    @contextmanager
    def _drawn(self, kept: tuple[str, ...], draw: int):
        """A backend over the emulation with the layers of ``kept`` fp32 and draw ``draw``; every layer int8 and
        undithered again on exit."""
        from sam2edge.export.precision import GraphBackend

        dither = torch.Generator().manual_seed(draw) if draw else None
        for name, layer in self.layers.items():
            layer.int8_enabled, layer.int8_dither = name not in kept, dither
        try:
            yield GraphBackend(self.quant, self.cfg, decoder_model=self.fp32)
        finally:
            for layer in self.layers.values():
                layer.int8_enabled, layer.int8_dither = True, None


def sweep(sd: dict, cfg: Sam2Config, target: str, clicks: int = 10, bar: float = 0.95, reference=None) -> dict:
    """The baseline all-int8 encoder's IoUs (with the clicks under ``bar``) and, per encoder Linear, the IoUs
    with that layer alone kept fp32, ranked by the worst IoU they reach (best first)."""
    from sam2edge.checks.fidelity import click_set
    from sam2edge.checks.fidelity.measure import CachedReference
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend

    prompts = click_set(clicks)
    if reference is None:
        reference = CachedReference(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
    emu = Int8Emulation(sd, cfg, target, reference)
    base = emu.ious(prompts)
    rows = []
    for name in emu.layers:
        ious = emu.ious(prompts, (name,))
        rows.append(LayerRow(name, float(min(ious)), float(np.mean(ious))))
    rows.sort(key=lambda r: (-r.iou_worst, -r.iou_mean))
    failed = [
        {"index": i, "photo": p.photo, "kind": p.kind, "iou": float(v)}
        for i, (p, v) in enumerate(zip(prompts, base, strict=True))
        if not v >= bar
    ]
    return {
        "target": target,
        "activations": ACTIVATIONS[target],
        "clicks": len(prompts),
        "layers": len(emu.layers),
        "iou_worst": float(min(base)),
        "iou_median": float(np.median(base)),
        "iou_mean": float(np.mean(base)),
        "failed_clicks": failed,
        "ranking": [r.as_dict() for r in rows],
    }


# what int8 mixed precision aims at: the int8 bar (worst) and a median of 0.99 (the reduced-precision goal)
SELECTION_BARS = {"min_iou_worst": 0.95, "min_iou_median": 0.99}
RANK_CLICKS = 10  # the ranking's clicks (``sam2edge diagnose --int8``'s default)
MAX_KEPT = 16  # at most this many encoder Linears kept fp32 (Hiera-Tiny has 50)


def failing_photos(prompts, ious, worst: float) -> tuple[str, ...]:
    """The photos (in the click set's order) holding a click of ``prompts`` whose IoU is under ``worst``."""
    return tuple(dict.fromkeys(p.photo for p, v in zip(prompts, ious, strict=True) if not v >= worst))


def _group_first(rows: list[dict], group: tuple[str, ...], worst: float, mean: float) -> list[dict]:
    """``rows`` (a ranking, most lifting first) with ``group``'s members moved to the front where keeping them all
    fp32 (worst / mean IoU ``worst``, ``mean``) lifts the ranked clicks more than any one layer kept alone: layers
    that only lift them together (LiteRT's 1x1 convolutions, each reading outlier channels) rank first together.
    Each moved row notes the group's measurement."""
    if not rows or (worst, mean) <= (rows[0]["iou_worst_kept_alone"], rows[0]["iou_mean_kept_alone"]):
        return rows
    note = {"kept_together_with": len(group) - 1, "iou_worst_kept_together": worst, "iou_mean_kept_together": mean}
    members = [{**r, **note} for r in rows if r["part"] in group]
    return members + [r for r in rows if r["part"] not in group]


def select_int8(
    sd: dict,
    cfg: Sam2Config,
    target: str,
    reference,
    bars: dict | None = None,
    clicks: int = 40,
    rank_clicks: int = RANK_CLICKS,
    max_kept: int = MAX_KEPT,
    fallback: dict | None = None,
    draws: int = DRAWS,
):
    """Which encoder Linears a dynamic-int8 export of ``sd`` (the state dict it quantises, smoothed or not)
    keeps fp32 (``export.mixed.select``): the all-int8 emulation measured over ``click_set(clicks)``; if it
    misses ``bars`` (default ``SELECTION_BARS``), a ranking of every Linear kept fp32 alone (the layers that lift
    the worst IoU most first), then the fewest kept until the bars hold. The ranking measures every click of
    the photos whose clicks fell under the worst bar (``failing_photos``: a photo's clicks share one encode,
    so all its prompt kinds cost one photo's time), or ``click_set(rank_clicks)`` where only the median missed;
    the selection's ``ranked_on`` names them. Each measurement takes ``draws`` emulation draws
    (``Int8Emulation.ious``, ``DITHER``; the bundle's kernels are one more) and a click holds where it holds in
    every draw; the ranking measures on the draw whose worst click was lowest with every layer int8. Where the
    target quantises 1x1 convolutions (LiteRT), they are also measured kept together and rank first together
    when that lifts more than any one layer (``_group_first``).
    ``fallback`` (the int8 shipping bar): aimed at when even every Linear kept fp32 misses ``bars``
    (``export.mixed.select``)."""
    import dataclasses

    from sam2edge.checks.fidelity import click_set
    from sam2edge.export.mixed import MARGIN, select

    bars = SELECTION_BARS if bars is None else bars
    prompts = click_set(clicks)
    emu = Int8Emulation(sd, cfg, target, reference)
    base: list[float] = []  # the all-int8 measurement's IoU per click
    ranked_on: list[str] = []

    rank_draw = [0]  # the draw the ranking measures on

    def measure(kept: tuple[str, ...]) -> tuple[float, float]:
        quantised = set(emu.layers) - set(kept)  # none: every layer fp32, nothing to draw
        per_draw = [emu.ious(prompts, kept, d) for d in range(draws if quantised else 1)]  # draws x clicks
        ious = np.min(per_draw, axis=0)  # (clicks,) each click's lowest
        if not kept:
            base[:] = ious
            rank_draw[0] = int(np.argmin([min(v) for v in per_draw]))
        return float(ious.min()), float(np.median(ious))

    def ranking() -> list[dict]:
        from sam2edge.progress import Progress

        photos = failing_photos(prompts, base, bars.get("min_iou_worst", 0.0) + MARGIN["min_iou_worst"])
        rank_prompts = [p for p in prompts if p.photo in photos] or click_set(rank_clicks)
        ranked_on[:] = photos or [f"click_set({rank_clicks})"]
        rows = []
        group = tuple(n for n, m in emu.layers.items() if getattr(m, "int8_granularity", "") == "per_pixel")
        label = f"int8: ranking encoder layers (each kept fp32 alone) on {', '.join(ranked_on)}"
        with Progress(label, len(emu.layers) + (len(group) > 1), "layer") as bar:
            for name in emu.layers:
                bar.step(note=name)
                ious = emu.ious(rank_prompts, (name,), rank_draw[0])
                worst, mean = float(min(ious)), float(np.mean(ious))
                rows.append({"part": name, "iou_worst_kept_alone": worst, "iou_mean_kept_alone": mean})
            rows.sort(key=lambda r: (-r["iou_worst_kept_alone"], -r["iou_mean_kept_alone"]))
            if len(group) > 1:  # the 1x1 convolutions (LiteRT) kept together
                bar.step(note=f"the {len(group)} 1x1 convolutions together")
                ious = emu.ious(rank_prompts, group, rank_draw[0])
                rows = _group_first(rows, group, float(min(ious)), float(np.mean(ious)))
        return rows

    sel = select(ranking, measure, bars, max_kept, upper=list(emu.layers), label="int8", fallback=fallback)
    return dataclasses.replace(sel, ranked_on=tuple(ranked_on), draws=draws)
