"""Activation-aware shifting and scaling of the Hiera encoder for int8 (exact in fp32).

A LayerNorm followed by Linear layers computes ``W (g * n + b) + c`` (``n`` the normalised input). Two changes of
its parameters leave that function as it is but move range from the activations (quantised per call, one step per
token or per tensor) to where int8 loses less:

  shift  ``b -= d``, ``c += W d``: each channel's range centred on 0 (Outlier Suppression+: a channel that sits at
         a large constant, as trained transformers' outlier channels do, no longer widens every token's step);
  scale  ``g /= s``, ``b /= s``, ``W[:, j] *= s_j``: SmoothQuant, ``s_j = max|X_j|^alpha / max|W_:,j|^(1-alpha)``
         (``X`` the shifted output on calibration photos): a few wide channels no longer set the others' step,
         their range moves into the weights (quantised per output channel).

The attention's values feed its output projection the same way, since each output token is a convex combination
(softmax weights summing to 1) of the value rows: ``proj(P (V - 1 d^T)) = proj(P V) - proj_W d``, and a value channel
divided by ``s`` is undone by multiplying the projection's column by ``s``; here the shift goes into the value
bias (rows ``2C:3C`` of ``attn.qkv``) and ``proj``'s bias, the scale into the value rows and ``proj``'s columns.

The MLP's hidden activations (GELU's output, the input of ``mlp.layers.1``) have no linear producer to fold into:
where their channels sit at offsets (outlier residual channels amplified by ``norm2`` give ``fc1``'s rows constant
parts), they are shifted by an explicit subtraction in the graph, ``mlp.shift`` (``model.image_encoder.ShiftedMLP``),
and ``W d`` goes into the layer's bias; only where centring narrows the calibrated range by ``SHIFT_GAIN`` or more,
so ordinary weights keep their graph as it is.

Pairs per Hiera block (``image_encoder.trunk.blocks.i``): ``norm1`` -> ``attn.qkv`` (+ ``proj``, the dimension
change's shortcut, which reads the same normalised input), ``norm2`` -> ``mlp.layers.0``, ``attn`` (values) ->
``attn.proj``. A windowed block whose grid is not a multiple of its window pads ``norm1``'s output with zeros, which
a shift would move: there ``norm1`` is scaled only (zeros stay zeros).
``smooth_state_dict`` is a pure function of a sam2edge state dict; ``calibrate`` measures the ranges on photos.
Every int8 export quantises the state dict ``export_weights`` returns (``export.pipeline``), on every target:
shifted and scaled, then GPTQ-rounded (``export.gptq``), both calibrated by one pass of the photos.

Why (upstream-s4-outliers of the robustness set: outlier residual channels at a constant offset; full-size
Hiera-Tiny, ExecuTorch's int8 emulated with activations per token, 40 clicks; ``benchmarks/int8_fragile.py``),
worst / median mask IoU: the norms' pairs scaled only (SmoothQuant) 0.5714 / 0.9661; shifted and scaled, with the
values' pair, 0.8571 / 0.9732 (activations alone int8: 0.9315 / 0.9943); with GPTQ's rounding, 0.9306 / 0.9946.
With the MLP's hidden activations shifted too, as exported, the export's selection measured all int8 0.8750 / 0.9971
at the lowest of three draws (0.9178 / 0.9938 without) and kept 6 layers fp32 where no set of up to 16 had held
(``benchmarks/precision_robustness.py``, record ``precision-robustness-mlp-shift-1024``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch

from sam2edge.config import Sam2Config

BLOCK = "image_encoder.trunk.blocks.{}."
ALPHA = 0.5  # migration strength (SmoothQuant's default for most models)
# skimage's photos that the fidelity click set does not use (calibration never sees the measured images)
CALIBRATION_PHOTOS = ("motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "horse.png")
# norm -> the Linear layers that read its output
PAIRS = {"norm1": ("attn.qkv", "proj"), "norm2": ("mlp.layers.0",)}
VALUES = "attn"  # calibration key of a block's values (the input of attn.proj)
HIDDEN = "mlp"  # calibration key of a block's MLP hidden activations (the input of mlp.layers.1)
# the MLP's hidden channels are shifted (an explicit subtraction, ``ShiftedMLP``) where centring them narrows the
# calibrated range of the whole tensor at least this much: (max hi - min lo) / the widest channel's (hi - lo).
# Full-size Hiera-Tiny, the calibration photos (``benchmarks/int8_offsets.py``, each block's ratio): upstream-s0,
# s1-perturbed, s2-perturbed, s3 1.00-1.08; upstream-s4-outliers 1.71-4.15
SHIFT_GAIN = 1.5
INPUTS = {VALUES: "attn.proj", HIDDEN: "mlp.layers.1"}  # calibration key part -> the Linear whose input it is
# card.json extra.int8_smoothing of every int8 bundle
CARD_NOTE = (
    f"Outlier Suppression+ / SmoothQuant-style shift and scale of the encoder's LayerNorm -> Linear and value -> "
    f"output projection pairs, and a per-channel shift of the MLP's hidden activations where they sit at offsets "
    f"(export.smooth, alpha {ALPHA}, calibrated on skimage photos outside the fidelity click set; exact in fp32)"
)


class ChannelRange(NamedTuple):
    lo: torch.Tensor  # (C,) per-channel min over the calibration photos' tokens
    hi: torch.Tensor  # (C,) per-channel max
    shiftable: bool  # False where zero padding follows (a shift would move the pad's value)


class RangeRecorder:
    """Forward hooks on ``model``'s Hiera blocks that record, while photos run through its encoder, the
    per-channel range of each LayerNorm of ``PAIRS`` (``"blocks.i.normK"``), of the values entering
    ``attn.proj`` (``"blocks.i.attn"``) and of the MLP's hidden activations (``"blocks.i.mlp"``), and which blocks
    pad their windows. ``hooks``: for ``encode_photos``; ``ranges()`` once the photos have run."""

    def __init__(self, model) -> None:
        self.seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.padded: set[int] = set()
        self.hooks = []
        # Hiera's blocks; a trunk without LayerNorm -> Linear pairs (RepViT: convolutions) has nothing to smooth
        for i, blk in enumerate(getattr(model.image_encoder.trunk, "blocks", ())):
            self.hooks.append(blk.register_forward_pre_hook(lambda m, inp, i=i: self._pads(m, inp, i)))
            for norm in (n for n in PAIRS if hasattr(blk, n)):
                key = f"blocks.{i}.{norm}"
                self.hooks.append(getattr(blk, norm).register_forward_hook(lambda _m, _i, o, k=key: self._record(k, o)))
            for part, name in INPUTS.items():
                key, layer = f"blocks.{i}.{part}", blk.get_submodule(name)
                self.hooks.append(layer.register_forward_pre_hook(lambda _m, inp, k=key: self._record(k, inp[0])))

    def _record(self, key: str, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1])  # (tokens, C)
        lo, hi = x.amin(0), x.amax(0)
        seen = self.seen
        seen[key] = (torch.minimum(seen[key][0], lo), torch.maximum(seen[key][1], hi)) if key in seen else (lo, hi)

    def _pads(self, blk, inp, i: int) -> None:  # inp[0]: (B, H, W, C), a block's input
        ws, (h, w) = blk.window_size, inp[0].shape[1:3]
        if ws > 0 and (h % ws or w % ws):
            self.padded.add(i)

    def ranges(self) -> dict[str, ChannelRange]:
        return {
            k: ChannelRange(lo, hi, not (k.endswith(".norm1") and block_key(k)[0] in self.padded))
            for k, (lo, hi) in self.seen.items()
        }


@torch.no_grad()
def calibrate(model, cfg: Sam2Config, photos: tuple[str, ...] = CALIBRATION_PHOTOS) -> dict[str, ChannelRange]:
    """``"blocks.i.normK"`` (that LayerNorm's output) and ``"blocks.i.attn"`` (the values entering ``attn.proj``)
    -> per-channel range over ``photos`` (fp32 model)."""
    rec = RangeRecorder(model)
    encode_photos(model, cfg, photos, rec.hooks)
    return rec.ranges()


def encode_photos(model, cfg: Sam2Config, photos: tuple[str, ...], hooks: list) -> None:
    """Run ``model``'s image encoder on each of ``photos`` (skimage's, preprocessed as the runtime does), then
    remove ``hooks`` (the forward hooks that record what the caller calibrates), also on error."""
    from sam2edge.checks.fidelity import photo
    from sam2edge.runtime.preprocess import preprocess

    try:
        for name in photos:
            x = preprocess(photo(name), cfg.image_size)
            model.image_encoder(torch.as_tensor(np.asarray(x)))
    finally:
        for h in hooks:
            h.remove()


def _shift_and_scale(
    r: ChannelRange, wmax: torch.Tensor, alpha: float, shift: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, s): the shift centring each channel of ``r`` (0 where not shiftable or not ``shift``) and the
    SmoothQuant scale of the shifted range against the readers' per-column weight max ``wmax``."""
    d = (r.lo + r.hi) / 2 if shift and r.shiftable else torch.zeros_like(r.lo)
    amax = torch.maximum(r.hi - d, d - r.lo)  # (C,) max |X_j - d_j|
    s = (amax.clamp_min(1e-5) ** alpha / wmax.clamp_min(1e-5) ** (1 - alpha)).clamp(1e-2, 1e2)
    return d, s


def block_key(key: str) -> tuple[int, str]:
    """(block index, part) of a calibration key: ``"blocks.i.normK"`` or ``"blocks.i.attn"``."""
    i, part = re.fullmatch(r"blocks\.(\d+)\.(\w+)", key).groups()
    return int(i), part


def centring_gain(r: ChannelRange) -> float:
    """How much centring each channel of ``r`` narrows the range of the whole tensor: ``(max hi - min lo) / max
    (hi - lo)`` (1: nothing to gain; an explicit shift is added from ``SHIFT_GAIN``)."""
    return float((r.hi.max() - r.lo.min()) / (r.hi - r.lo).max())


def shift_holder(key: str) -> str | None:
    """The module (name prefix) holding the explicit ``shift`` of calibration key ``key``, shifted by a
    subtraction in the graph (a block's MLP, ``model.image_encoder.ShiftedMLP``); None for a pair folded into
    its producer."""
    i, part = block_key(key)
    return f"{BLOCK.format(i)}mlp." if part == HIDDEN else None


def readers(sd: dict, key: str) -> list[str]:
    """The Linear layers (module names) reading the activation of calibration key ``key`` in ``sd``: a norm's
    ``PAIRS`` that the block has, the values' ``attn.proj``, the hidden activations' ``mlp.layers.1``."""
    i, part = block_key(key)
    names = (INPUTS[part],) if part in INPUTS else PAIRS[part]
    return [f"{BLOCK.format(i)}{n}" for n in names if f"{BLOCK.format(i)}{n}.weight" in sd]


def shifts_and_scales(
    sd: dict, ranges: dict[str, ChannelRange], alpha: float = ALPHA, shift: bool = True
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Calibration key -> (d, s), each (C,): the readers' inputs become ``(x - d) / s``. ``shift=False``:
    SmoothQuant alone, the norms' pairs scaled and nothing shifted (the values' pairs left out)."""
    out = {}
    for key, r in ranges.items():
        if shift_holder(key) is not None:  # shifted only, and only where that narrows the range (``SHIFT_GAIN``)
            if shift and centring_gain(r) >= SHIFT_GAIN:
                out[key] = ((r.lo + r.hi) / 2, torch.ones_like(r.lo))
            continue
        if block_key(key)[1] == VALUES and not shift:
            continue
        wmax = torch.stack([sd[f"{n}.weight"].abs().amax(0) for n in readers(sd, key)]).amax(0)  # per input channel
        out[key] = _shift_and_scale(r, wmax, alpha, shift)
    return out


def smooth_state_dict(
    sd: dict, ranges: dict[str, ChannelRange], alpha: float = ALPHA, shift: bool = True
) -> tuple[dict, dict]:
    """(shifted and scaled state dict, {pair: max / median scale, max |shift|}) for every pair of ``ranges``
    (``shifts_and_scales``; ``shift=False``: SmoothQuant alone, for comparison)."""
    return applied(sd, shifts_and_scales(sd, ranges, alpha, shift))


def applied(sd: dict, ds: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[dict, dict]:
    """(``sd`` with each pair's (d, s) of ``ds`` (``shifts_and_scales``) folded into its producer and readers,
    report): the function in fp32 is the same."""
    out, report = dict(sd), {}
    for key, (d, s) in ds.items():
        report[key] = {
            "max_scale": float(s.max()),
            "median_scale": float(s.median()),
            "max_shift": float(d.abs().max()),
        }
        i, part = block_key(key)
        pre, holder = BLOCK.format(i), shift_holder(key)
        if holder is not None:  # no producer: an explicit subtraction (``model.image_encoder.ShiftedMLP``), s = 1
            out[f"{holder}shift"] = d
        elif part == VALUES:  # values are rows 2C:3C of qkv (q, k, v blocks, heads packed head-major)
            qkv_w, qkv_b = out[f"{pre}attn.qkv.weight"], out[f"{pre}attn.qkv.bias"]
            v = slice(2 * len(d), 3 * len(d))
            out[f"{pre}attn.qkv.weight"] = torch.cat([qkv_w[: v.start], qkv_w[v] / s[:, None]])
            out[f"{pre}attn.qkv.bias"] = torch.cat([qkv_b[: v.start], (qkv_b[v] - d) / s])
        else:
            out[f"{pre}{part}.weight"] = sd[f"{pre}{part}.weight"] / s
            out[f"{pre}{part}.bias"] = (sd[f"{pre}{part}.bias"] - d) / s
        for c in readers(sd, key):
            out[f"{c}.bias"] = out[f"{c}.bias"] + out[f"{c}.weight"] @ d
            out[f"{c}.weight"] = out[f"{c}.weight"] * s[None, :]
    return out, report


def smoothed(sd: dict, cfg: Sam2Config, rewrites, alpha: float = ALPHA, shift: bool = True) -> tuple[dict, dict]:
    """Calibrate the fp32 model of ``sd`` on the photos and return the smoothed state dict and its report
    (``shift``: as ``smooth_state_dict``)."""
    from sam2edge.model import build_sam2

    model = build_sam2(cfg, rewrites)
    model.load_state_dict(sd)
    return smooth_state_dict(sd, calibrate(model.eval(), cfg), alpha, shift)


# card.json extra.int8_rounding of every int8 bundle
ROUNDING_NOTE = (
    "encoder Linear weights rounded to their int8 grid with GPTQ's error compensation (export.gptq, calibrated "
    "on the smoothing's photos); each target's quantiser reproduces them (ONNX's portable file as u8 codes q + 128)"
)


def prepared_weights(sd: dict, cfg: Sam2Config, precision: str) -> tuple[dict, dict]:
    """(the state dict an export at ``precision`` builds its graphs from, what was done to it, for the card):
    int8 shifted and scaled (the fp32 function is the same), then its encoder Linear weights GPTQ-rounded onto
    their int8 grid (``export.gptq``; the report gives the layers' output error against nearest rounding's);
    every other precision ``sd`` itself and ``{}``. One pass of the calibration photos measures both the
    ranges and each layer's input moments; a shifted and scaled layer's moments follow from its input's
    (``export.gptq.moved``)."""
    if precision != "int8":
        return sd, {}
    from dataclasses import replace

    from sam2edge.export.gptq import MomentRecorder, moved, round_layers
    from sam2edge.model import Rewrites, build_sam2

    model = build_sam2(cfg, replace(Rewrites(), qkv="fused"))
    model.load_state_dict(sd)
    ranges, moments = RangeRecorder(model), MomentRecorder(model)
    with torch.no_grad():
        encode_photos(model.eval(), cfg, CALIBRATION_PHOTOS, ranges.hooks + moments.hooks)
    ds, m = shifts_and_scales(sd, ranges.ranges()), moments.moments()
    shifted, pairs = applied(sd, ds)
    hs = {name: h for name, (h, _mean) in m.items()}
    for key, (d, s) in ds.items():
        for name in readers(sd, key):
            hs[name] = moved(*m[name], d, s)
    rounded, error = round_layers(shifted, hs)
    mlps = sum(shift_holder(k) is not None for k in pairs)  # the MLPs given an explicit shift
    return rounded, {
        "int8_smoothed_pairs": len(pairs) - mlps,
        "int8_shifted_mlps": mlps,
        "int8_rounding_error": error,
    }


def export_weights(sd: dict, cfg: Sam2Config, precision: str) -> dict:
    """``prepared_weights``' state dict: what an export at ``precision`` quantises."""
    return prepared_weights(sd, cfg, precision)[0]
