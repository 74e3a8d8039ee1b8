"""EdgeTAM's 2-D spatial perceiver (upstream ``perceiver.py`` ``PerceiverResampler``): one spatial memory of
e x e tokens compressed to L + G*G latent tokens before the memory attention reads it.

Shapes (B = objects, M = mem_dim = perceiver width, e = image_size / 16, L = global latents, G*G = 2-D
latents on a G x G grid, w = e / G window side):

  memory (B, M, e, e) -> global path: L learned latents cross-attend to all e*e tokens (keys and values get
                         the memory's sine position encoding added after projection), then FF, self-attention
                         over the L latents, FF; per layer
                      -> 2-D path: latent (i, j) of the G x G grid cross-attends to the w x w window (i, j) of
                         the memory only (no position encoding), then FF, self-attention over itself (a
                         single token: its value), FF; per layer
                      -> LayerNorm of both -> (B, L + G*G, M), global latents first
  position encoding of the output (constant, ``out_pos``): zeros for the global latents, the sine encoding
                         of the G x G grid for the 2-D latents -> (L + G*G, M)

Parameter names are upstream's (``spatial_perceiver.``), so the official checkpoint maps by identity. Every
tensor stays at rank <= 4 (windows are cut by rank-4 reshapes, not upstream's rank-6 ``window_partition``), and
several objects run as one batch (upstream's ``forward_2d`` raises on a batch of two or more: it calls ``view``
on an expanded tensor).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sam2edge.config import Sam2VideoConfig
from sam2edge.model.image_encoder import sine_position_encoding
from sam2edge.model.layers import LayerNorm, Rewrites, attention


class FeedForward(nn.Sequential):
    """Upstream ``FeedForward``: LayerNorm, Linear (no bias), GELU, Linear (no bias); indices 0, 1, 3."""

    def __init__(self, dim: int, mult: int, rw: Rewrites) -> None:
        super().__init__(
            LayerNorm(dim, 1e-5, rw),
            nn.Linear(dim, dim * mult, bias=False),
            nn.GELU(),
            nn.Linear(dim * mult, dim, bias=False),
        )


class PerceiverAttention(nn.Module):
    """Latents (queries) attend to inputs x (keys / values); ``pos`` is added to the projected keys and values."""

    def __init__(self, dim: int, dim_head: int, heads: int, rw: Rewrites) -> None:
        super().__init__()
        inner = dim_head * heads
        self.heads, self.rw = heads, rw
        self.norm_x, self.norm_latents = LayerNorm(dim, 1e-5, rw), LayerNorm(dim, 1e-5, rw)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, latents: torch.Tensor, x: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """latents (B, N, dim), x (B, Nx, dim), pos (1, Nx, inner) or None -> (B, N, dim)."""
        q = self.to_q(self.norm_latents(latents))  # (B, N, inner)
        kv = self.to_kv(self.norm_x(x))  # (B, Nx, 2 inner)
        inner = q.shape[-1]
        k, v = kv[..., :inner], kv[..., inner:]  # (B, Nx, inner) each
        if pos is not None:
            k, v = k + pos, v + pos
        return self.to_out(attention(q, k, v, self.heads, self.rw))


class SelfAttention(nn.Module):
    """Upstream perceiver ``Attention``: pre-norm self-attention without biases."""

    def __init__(self, dim: int, dim_head: int, heads: int, rw: Rewrites) -> None:
        super().__init__()
        inner = dim_head * heads
        self.heads, self.rw = heads, rw
        self.norm = LayerNorm(dim, 1e-5, rw)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, dim) -> (B, N, dim). One token per item (the 2-D latents): softmax over one key is exactly 1,
        so the output is that token's projected value (no q or score computed)."""
        x = self.norm(x)
        inner = self.to_q.weight.shape[0]
        kv = self.to_kv(x)  # (B, N, 2 inner)
        if x.shape[1] == 1:
            return self.to_out(kv[..., inner:])
        return self.to_out(attention(self.to_q(x), kv[..., :inner], kv[..., inner:], self.heads, self.rw))


class PerceiverLayer(nn.Module):
    """Upstream ``PerceiverEncoderLayer`` with ``use_self_attn``: cross-attention, FF, self-attention, FF."""

    def __init__(self, dim: int, dim_head: int, heads: int, ff_mult: int, self_attn: bool, rw: Rewrites) -> None:
        super().__init__()
        self.attn = PerceiverAttention(dim, dim_head, heads, rw)
        self.ff = FeedForward(dim, ff_mult, rw)
        self.use_self_attn = self_attn
        if self_attn:
            self.self_attn = SelfAttention(dim, dim_head, heads, rw)
            self.self_ff = FeedForward(dim, ff_mult, rw)

    def forward(self, latents: torch.Tensor, x: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        latents = self.attn(latents, x, pos) + latents
        latents = self.ff(latents) + latents
        if self.use_self_attn:
            latents = self.self_attn(latents) + latents
            latents = self.self_ff(latents) + latents
        return latents


def windows(x: torch.Tensor, grid: int) -> torch.Tensor:
    """(B, e, e, C) channels-last -> (B*G*G, w*w, C): window (i, j) of a G x G grid, windows row-major, tokens
    row-major inside a window (upstream ``window_partition`` + flatten), through rank-4 reshapes only."""
    B, e, _, C = x.shape
    w = e // grid
    x = x.reshape(B * grid, w, grid, w * C)  # (B*G [window row], w [row in window], G [window col], w*C)
    x = x.permute(0, 2, 1, 3)  # (B*G, G, w, w*C)
    return x.reshape(B * grid * grid, w * w, C)  # (B*G*G, w*w, C)


class PerceiverResampler(nn.Module):
    """memory (B, M, e, e) -> latents (B, L + G*G, M); ``out_pos`` (L + G*G, M) is their position encoding."""

    def __init__(
        self,
        dim: int,
        side: int,
        depth: int,
        num_latents: int,
        num_latents_2d: int,
        dim_head: int,
        heads: int,
        ff_mult: int,
        self_attn: bool,
        rw: Rewrites,
    ) -> None:
        super().__init__()
        grid = math.isqrt(num_latents_2d)
        if grid * grid != num_latents_2d or side % grid:
            raise ValueError(f"{num_latents_2d} 2-D latents need a square grid that divides the {side}x{side} memory")
        if dim_head * heads != dim:
            raise ValueError(f"perceiver heads x dim_head = {heads} x {dim_head} must equal its width {dim}")
        self.grid = grid
        self.latents = nn.Parameter(torch.zeros(num_latents, dim))
        self.latents_2d = nn.Parameter(torch.zeros(num_latents_2d, dim))
        self.layers = nn.ModuleList(PerceiverLayer(dim, dim_head, heads, ff_mult, self_attn, rw) for _ in range(depth))
        self.norm = LayerNorm(dim, 1e-5, rw)
        key_pos = sine_position_encoding(dim, side, side).reshape(1, dim, side * side).transpose(1, 2)  # (1, e*e, M)
        grid_pos = sine_position_encoding(dim, grid, grid).reshape(dim, grid * grid).t()  # (G*G, M)
        self.register_buffer("key_pos", key_pos.contiguous(), persistent=False)
        self.register_buffer("out_pos", torch.cat([torch.zeros(num_latents, dim), grid_pos]), persistent=False)

    def forward(self, memory: torch.Tensor, latents: torch.Tensor | None = None) -> torch.Tensor:
        """memory (B, M, e, e) -> (B, L + G*G, M). ``latents``: (L + G*G, M), the parameters ``latents`` then
        ``latents_2d`` given as an input instead (LiteRT's GPU delegate computes the first layer wrongly when
        the latents are constants: GPU-vs-CPU cosine 0.95-0.98 at the reduced config, exact from an input)."""
        B, M, e, _ = memory.shape
        n = self.latents.shape[0]
        lat = (self.latents, self.latents_2d) if latents is None else (latents[:n], latents[n:])
        tokens = memory.permute(0, 2, 3, 1)  # (B, e, e, M)
        out = [self.norm(self._global(tokens.reshape(B, e * e, M), lat[0])), self.norm(self._grid(tokens, lat[1]))]
        return torch.cat(out, dim=1)  # (B, L + G*G, M)

    def _global(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """x (B, e*e, M), latents (L, M) -> (B, L, M): every global latent reads the whole memory."""
        B = x.shape[0]
        lat = latents.unsqueeze(0)  # (1, L, M)
        if B > 1:  # B copies by concatenation (GPU delegates reject BROADCAST_TO)
            lat = torch.cat([lat] * B)
        for layer in self.layers:
            lat = layer(lat, x, self.key_pos)
        return lat

    def _grid(self, tokens: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """tokens (B, e, e, M), latents (G*G, M) -> (B, G*G, M): latent (i, j) reads window (i, j) only (batch =
        B*G*G windows)."""
        B, _, _, M = tokens.shape
        n = self.grid * self.grid
        x = windows(tokens, self.grid)  # (B*G*G, w*w, M)
        lat = latents.unsqueeze(0)  # (1, G*G, M)
        if B > 1:  # B copies by concatenation (GPU delegates reject BROADCAST_TO)
            lat = torch.cat([lat] * B)
        lat = lat.reshape(B * n, 1, M)  # (B*G*G, 1, M): one query per window
        for layer in self.layers:
            lat = layer(lat, x)
        return lat.reshape(B, n, M)


def build_perceiver(vcfg: Sam2VideoConfig, side: int, rw: Rewrites) -> PerceiverResampler:
    """The spatial perceiver of ``vcfg`` for memory frames of ``side`` x ``side`` tokens of ``vcfg.mem_dim``."""
    return PerceiverResampler(
        vcfg.mem_dim,
        side,
        vcfg.perceiver_layers,
        vcfg.perceiver_latents,
        vcfg.perceiver_latents_2d,
        vcfg.perceiver_dim_head,
        vcfg.perceiver_heads,
        vcfg.perceiver_ff_mult,
        vcfg.perceiver_self_attn,
        rw,
    )
