"""Error-compensated int8 rounding of the encoder's Linear weights (GPTQ, Frantar et al. 2022).

Every int8 target stores each encoder Linear's weight rows as int8 on a symmetric per-row grid
(``scale = max|w_row| / 127``: XNNPACK's dynamic kernels in ExecuTorch and LiteRT, onnxruntime's s8 VNNI file).
Rounding each weight to its nearest grid point (what the targets' quantisers do) is a fixed change of the
function; GPTQ instead rounds the input columns one at a time and spreads each column's rounding error over
the columns not yet rounded, weighted by the inverse of ``H = E[x x^T]`` (the layer's inputs on calibration
photos), so that ``W x`` moves as little as possible for inputs like the photos'. The columns go in the order
of their inputs' energy (``diag(H)``, largest first: GPTQ's "act order"), so the columns smoothing widened are
rounded while every other column can still take their error.

The result is a weight that lies on the same grid (each row keeps its largest-magnitude entry at +-127, so
a target's max-abs scale is ours and its rounding reproduces these int8 values exactly): an int8 export quantises
``compensated(...)``'s state dict and the targets' quantisers change nothing further (ONNX's portable
``encoder.onnx`` stores the same codes as u8, q + 128 with zero point 128: ``export.onnx_int8.INT8_WEIGHTS``).
A layer the mixed-precision selection keeps fp32 computes in fp32 with these same weights (the selection measures
the emulation built from them, so what it chose is what the bundle runs).

Why: upstream-s3 of the robustness set, full-size Hiera-Tiny, ExecuTorch's int8 emulated (shifted and scaled, 40
clicks; ``benchmarks/int8_fragile.py``): worst / median mask IoU 0.0625 / 0.9958 with nearest rounding, 0.9921 /
0.9971 with this. With weights int8 and activations fp32 the worst click read 0.0624, with activations int8 and
weights fp32 0.9926: its mask is a near-flat logit map that any fixed change of the function shifts across the
threshold. ``round_layers``' report (card.json ``extra.int8_rounding_error``) gives the layers' output error
against nearest rounding's.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.export.int8_sensitivity import fake_quant_weight as nearest  # the targets' own rounding

ENCODER = "image_encoder."
DAMP = 0.01  # added to H's diagonal, as a share of its mean (GPTQ's default): keeps the inverse stable
BLOCK = 128  # columns rounded per block before the rest is updated (same result, less memory traffic)
QMAX = 127  # symmetric int8 grid: q in [-127, 127]


class MomentRecorder:
    """Forward hooks on every encoder Linear of ``model`` (its qkv one Linear) that sum, while photos run through
    its encoder, each layer's input ``x x^T`` and ``x`` (float64) over the tokens. ``hooks``: for
    ``export.smooth.encode_photos``; ``moments()`` once the photos have run."""

    def __init__(self, model: nn.Module) -> None:
        self.sums: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self.hooks = [
            m.register_forward_hook(lambda _m, inp, _out, name=name: self._record(name, inp[0]))
            for name, m in model.named_modules()
            if name.startswith(ENCODER) and isinstance(m, nn.Linear)
        ]

    def _record(self, name: str, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()  # (tokens, in)
        xx, xs, n = x.T @ x, x.sum(0), x.shape[0]
        if name in self.sums:
            a, b, c = self.sums[name]
            xx, xs, n = a + xx, b + xs, c + n
        self.sums[name] = (xx, xs, n)

    def moments(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module name -> (``E[x x^T]`` (in x in), ``E[x]`` (in,)), float64."""
        return {k: (xx / n, xs / n) for k, (xx, xs, n) in self.sums.items()}


@torch.no_grad()
def hessians(model: nn.Module, cfg: Sam2Config, photos: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Module name -> ``E[x x^T]`` (float64, ``in x in``) of each encoder Linear's input over the tokens of
    ``photos`` (the fp32 ``model``; its qkv must be one Linear)."""
    from sam2edge.export.smooth import encode_photos

    rec = MomentRecorder(model)
    encode_photos(model, cfg, photos, rec.hooks)
    return {k: h for k, (h, _m) in rec.moments().items()}


def moved(h: torch.Tensor, mean: torch.Tensor, d: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The second moment of ``(x - d) / s`` from ``x``'s (``h`` = E[x x^T], ``mean`` = E[x]): what a layer
    reads after ``export.smooth`` shifted and scaled its input (``S^-1 (H - d m^T - m d^T + d d^T) S^-1``)."""
    d, s = d.double(), s.double()
    centred = h - torch.outer(d, mean) - torch.outer(mean, d) + torch.outer(d, d)
    return centred / torch.outer(s, s)


@torch.no_grad()
def rounded(w: torch.Tensor, h: torch.Tensor, damp: float = DAMP, act_order: bool = True) -> torch.Tensor:
    """``w`` (out x in) on its symmetric per-row int8 grid, rounded column by column with GPTQ's error
    compensation for inputs of second moment ``h`` (in x in), dequantised, ``w``'s dtype. ``act_order``: the
    columns of the largest inputs first (``diag(h)`` descending), while the most columns are left to take their
    error (GPTQ's "act order")."""
    if act_order:
        order = torch.argsort(torch.diag(h), descending=True)  # (in,): column permutation
        return rounded(w[:, order], h[order][:, order], damp, act_order=False)[:, torch.argsort(order)]
    W = w.double().clone()  # (out, in), updated as columns are rounded
    H = h.double().clone()
    cols = W.shape[1]
    dead = torch.diag(H) == 0  # inputs that are always 0: their columns cannot matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(cols, dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)  # H^-1 = U^T U
    scale = W.abs().amax(1).clamp_min(1e-12) / QMAX  # (out,): the grid every target recomputes from the row
    rows = torch.arange(W.shape[0])
    pinned = W.abs().argmax(1)  # (out,): each row's largest entry stays at +-127 so the scale is kept
    pin_q = torch.sign(W[rows, pinned]) * QMAX
    Q = torch.zeros_like(W)
    for start in range(0, cols, BLOCK):
        end = min(start + BLOCK, cols)
        Wb, Ub = W[:, start:end].clone(), U[start:end, start:end]
        Err = torch.zeros_like(Wb)  # (out, block): scaled rounding errors
        for j in range(end - start):
            col = Wb[:, j]
            q = torch.clamp(torch.round(col / scale), -QMAX, QMAX)
            fix = pinned == start + j
            q[fix] = pin_q[fix]
            Q[:, start + j] = q * scale
            err = (col - Q[:, start + j]) / Ub[j, j]
            Wb[:, j:] -= err[:, None] * Ub[j, j:][None, :]
            Err[:, j] = err
        W[:, end:] -= Err @ U[start:end, end:]
    return Q.to(w.dtype)


def output_error(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    """``E|(w - q) x|^2`` for inputs of second moment ``h``: the layer's mean squared output change."""
    d = (w - q).double()
    return float(torch.einsum("oi,ij,oj->", d, h, d))


def compensated(sd: dict, cfg: Sam2Config, photos: tuple[str, ...]) -> tuple[dict, dict]:
    """(``sd`` with every encoder Linear weight GPTQ-rounded on its int8 grid, report): ``round_layers`` with
    the second moments of ``sd``'s own fp32 model on ``photos``."""
    from dataclasses import replace

    from sam2edge.model import Rewrites, build_sam2

    model = build_sam2(cfg, replace(Rewrites(), qkv="fused"))
    model.load_state_dict(sd)
    return round_layers(sd, hessians(model.eval(), cfg, photos))


def round_layers(sd: dict, hs: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(``sd`` with the weight of every layer of ``hs`` (module name -> its inputs' ``E[x x^T]``) GPTQ-rounded
    on its int8 grid, report): the report gives the layers' output error against nearest rounding's (median,
    max ratio)."""
    out, ratios = dict(sd), []
    for name, h in hs.items():
        w = sd[f"{name}.weight"]
        out[f"{name}.weight"] = q = rounded(w, h)
        ratios.append(output_error(w, q, h) / max(output_error(w, nearest(w), h), 1e-30))
    report = {
        "layers": len(ratios),
        "error_vs_nearest_median": float(np.median(ratios)),
        "error_vs_nearest_max": max(ratios),
    }
    return out, report
