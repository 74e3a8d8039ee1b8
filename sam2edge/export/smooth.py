"""SmoothQuant-style activation-aware scaling of the Hiera encoder for int8 (exact in fp32).

A LayerNorm followed by Linear layers computes ``W (g * n + b)`` (``n`` the normalised input): dividing the norm's
weight ``g`` and bias ``b`` by a per-channel ``s`` and multiplying the consumers' weight columns by ``s`` is the
same function, but moves range from the activations (quantised per call, one step per token or per tensor) to the
weights (quantised per output channel). With ``s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)`` (``X`` the norm's
output on calibration photos) a few outlier channels no longer set every other channel's activation step.

Pairs per Hiera block (``image_encoder.trunk.blocks.i``): ``norm1`` -> ``attn.qkv`` (+ ``proj``, the dimension
change's shortcut, which reads the same normalised input) and ``norm2`` -> ``mlp.layers.0``.
``smooth_state_dict`` is a pure function of a sam2edge state dict; ``calibrate`` measures ``max|X_j|`` on photos.
Every int8 export quantises the state dict ``export_weights`` returns (``export.pipeline``), on every target: the
activations are quantised per call, one range per tensor (onnxruntime's ``DynamicQuantizeLinear``) or per token
(XNNPACK's dynamic kernels: LiteRT, ExecuTorch), and a few outlier channels widen either.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from sam2edge.config import Sam2Config

BLOCK = "image_encoder.trunk.blocks.{}."
ALPHA = 0.5  # migration strength (SmoothQuant's default for most models)
# skimage's photos that the fidelity click set does not use (calibration never sees the measured images)
CALIBRATION_PHOTOS = ("motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "horse.png")
# norm -> the Linear layers that read its output
PAIRS = {"norm1": ("attn.qkv", "proj"), "norm2": ("mlp.layers.0",)}
# card.json extra.int8_smoothing of every int8 bundle
CARD_NOTE = (
    f"SmoothQuant-style LayerNorm -> Linear scaling of the encoder (export.smooth, alpha {ALPHA}, calibrated on "
    "skimage photos outside the fidelity click set; exact in fp32)"
)


@torch.no_grad()
def calibrate(model, cfg: Sam2Config, photos: tuple[str, ...] = CALIBRATION_PHOTOS) -> dict[str, torch.Tensor]:
    """``"blocks.i.normK"`` -> per-channel max |output| of that LayerNorm over ``photos`` (fp32 model)."""
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    # Hiera's blocks; a trunk without LayerNorm -> Linear pairs (RepViT: convolutions) has nothing to smooth
    for i, blk in enumerate(getattr(model.image_encoder.trunk, "blocks", ())):
        for norm in (n for n in PAIRS if hasattr(blk, n)):

            def hook(_m, _inp, out, key=f"blocks.{i}.{norm}"):
                a = out.detach().abs().reshape(-1, out.shape[-1]).amax(0)
                amax[key] = torch.maximum(amax[key], a) if key in amax else a

            hooks.append(getattr(blk, norm).register_forward_hook(hook))
    encode_photos(model, cfg, photos, hooks)
    return amax


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


def smooth_state_dict(sd: dict, amax: dict[str, torch.Tensor], alpha: float = ALPHA) -> tuple[dict, dict]:
    """(scaled state dict, {pair: max / median scale}) with every norm -> Linear pair of ``amax`` smoothed."""
    out = dict(sd)
    report = {}
    for key, a in amax.items():
        i, norm = re.fullmatch(r"blocks\.(\d+)\.(norm\d)", key).groups()
        pre = BLOCK.format(i)
        consumers = [f"{pre}{c}.weight" for c in PAIRS[norm] if f"{pre}{c}.weight" in sd]
        wmax = torch.stack([sd[c].abs().amax(0) for c in consumers]).amax(0)  # per input channel
        s = (a.clamp_min(1e-5) ** alpha / wmax.clamp_min(1e-5) ** (1 - alpha)).clamp(1e-2, 1e2)
        out[f"{pre}{norm}.weight"] = sd[f"{pre}{norm}.weight"] / s
        out[f"{pre}{norm}.bias"] = sd[f"{pre}{norm}.bias"] / s
        for c in consumers:
            out[c] = sd[c] * s[None, :]
        report[key] = {"max_scale": float(s.max()), "median_scale": float(s.median())}
    return out, report


def smoothed(sd: dict, cfg: Sam2Config, rewrites, alpha: float = ALPHA) -> tuple[dict, dict]:
    """Calibrate the fp32 model of ``sd`` on the photos and return the smoothed state dict and its report."""
    from sam2edge.model import build_sam2

    model = build_sam2(cfg, rewrites)
    model.load_state_dict(sd)
    return smooth_state_dict(sd, calibrate(model.eval(), cfg), alpha)


# card.json extra.int8_rounding of every int8 bundle
ROUNDING_NOTE = (
    "encoder Linear weights rounded to their int8 grid with GPTQ's error compensation (export.gptq, calibrated "
    "on the smoothing's photos); each target's quantiser reproduces them (ONNX's portable file as u8 codes q + 128)"
)


def export_weights(sd: dict, cfg: Sam2Config, precision: str) -> dict:
    """The state dict an export at ``precision`` builds its graphs from: int8 smoothed (the fp32 function is the
    same), then its encoder Linear weights GPTQ-rounded onto their int8 grid (``export.gptq``); every other
    precision ``sd`` itself."""
    if precision != "int8":
        return sd
    from sam2edge.export.gptq import compensated
    from sam2edge.model import Rewrites

    return compensated(smoothed(sd, cfg, Rewrites())[0], cfg, CALIBRATION_PHOTOS)[0]
