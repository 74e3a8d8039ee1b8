"""Memory attention (upstream ``memory_attention.py`` + ``RoPEAttention``), fixed-shape and rank <= 4.

The current frame's tokens (B, HW, C) self-attend, then cross-attend to a fixed number of memory
slots: ``S`` spatial memories of HW tokens each (mem_dim channels) and ``P`` object pointers of
C / mem_dim tokens each. Empty slots are removed by an additive key bias (0 kept, -1e4 removed),
so a graph with empty slots answers exactly as upstream's shorter concatenation.

RoPE is axial 2-D over the e x e grid, applied as real-valued cos/sin tables (baked buffers, no
complex tensors): a channel pair (x0, x1) becomes (x0 cos - x1 sin, x0 sin + x1 cos). Spatial
memory keys reuse the query table once per slot (upstream ``rope_k_repeat``); pointer tokens get
no RoPE (upstream ``num_k_exclude_rope``).

EdgeTAM (upstream ``RoPEAttentionv2`` as cross-attention): a memory slot holds the perceiver's L global
latents then G*G 2-D latents; the keys' table per slot (``key_rope_tables``) is the identity rotation
(cos 1, sin 0: exactly x) for the global latents, then the G x G grid's axial table for the 2-D latents.
"""

from __future__ import annotations

import torch
from torch import nn

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.model.layers import LayerNorm, Rewrites, attention


def rope_tables(dim: int, side: int, num_heads: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Axial RoPE as (cos, sin), each (side*side, dim): pair i of a head uses angle i, both channels.

    dim is the full width (num_heads heads of dim / num_heads channels); the per-head table is tiled.
    Tokens are row-major over the grid (x fastest), as upstream's ``init_t_xy``.
    """
    hd = dim // num_heads
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 4)[: hd // 4].float() / hd))  # (hd/4,)
    t = torch.arange(side * side, dtype=torch.float32)
    tx, ty = t % side, torch.div(t, side, rounding_mode="floor")
    angles = torch.cat([torch.outer(tx, freqs), torch.outer(ty, freqs)], dim=-1)  # (N, hd/2)
    angles = angles.repeat_interleave(2, dim=-1).repeat(1, num_heads)  # (N, dim): both channels of a pair
    return torch.cos(angles), torch.sin(angles)


def key_rope_tables(
    dim: int, num_global: int, grid: int, num_heads: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot key tables (num_global + grid*grid, dim): identity rows for the global latents, then the
    grid's axial table (upstream ``apply_rotary_enc_v2`` rotates only a slot's last grid*grid tokens)."""
    cos, sin = rope_tables(dim, grid, num_heads, theta)
    return torch.cat([torch.ones(num_global, dim), cos]), torch.cat([torch.zeros(num_global, dim), sin])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of x (B, N, C) by the angles of (N, C) tables."""
    B, N, C = x.shape
    pairs = x.reshape(B, N, C // 2, 2)  # (B, N, C/2, 2)
    swapped = torch.cat([-pairs[..., 1:2], pairs[..., 0:1]], dim=-1).reshape(B, N, C)  # (-x1, x0) per pair
    return x * cos + swapped * sin


def apply_rope_t(xt: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` in the transposed layout: xt (B, C, S, N) channel-major, tables (C, 1, N) -> (B, C, S, N)."""
    B, C, S, N = xt.shape
    pairs = xt.reshape(B, C // 2, 2, S * N)  # (B, C/2, 2, S*N): a pair's two channels on axis 2
    swapped = torch.cat([-pairs[:, :, 1:2], pairs[:, :, 0:1]], dim=2).reshape(B, C, S, N)  # (-x1, x0) per pair
    return xt * cos_t + swapped * sin_t


class RoPEAttention(nn.Module):
    """Projected attention with RoPE on queries and the first ``rope_keys`` key tokens (upstream names)."""

    def __init__(self, dim: int, kv_dim: int, num_heads: int, rw: Rewrites, query_chunk: int = 0) -> None:
        super().__init__()
        self.num_heads, self.rw, self.query_chunk = num_heads, rw, query_chunk  # queries per score slice (0: all)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(kv_dim, dim), nn.Linear(kv_dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        # attend over the raw values, then project them (rw.memory_values): exact, and cheaper when kv_dim < dim
        self.fold_values = rw.memory_values == "folded" and num_heads == 1 and kv_dim < dim

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rope_slots: int,
        key_bias: torch.Tensor | None = None,
        key_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """q (B, N, C) with N = HW; k, v (B, rope_slots*n + R, kv_dim); key_bias (B, Nk) -> (B, N, C).

        RoPE rotates q by (cos, sin) and each of the ``rope_slots`` blocks of n keys by ``key_rope`` (n rows;
        default: the query tables, n = HW); the R trailing keys stay as they are.
        """
        return self.attend(self.queries(q, cos, sin), k, v, cos, sin, rope_slots, key_bias, key_rope)

    def queries(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The projected, rotated queries (B, N, C) of ``forward``."""
        return apply_rope(self.q_proj(q), cos, sin)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rope_slots: int,
        key_bias: torch.Tensor | None = None,
        key_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``forward`` given the ``queries`` (B, N, C) already projected and rotated."""
        k = self.k_proj(k)
        v = v if self.fold_values else self.v_proj(v)  # (B, Nk, kv_dim) or (B, Nk, C)
        kc, ks = key_rope or (cos, sin)
        t = self.rw.rope_keys == "transposed"  # k as (B, C, Nk): a real TRANSPOSE feeds the score matmul
        k = self._rope_keys_t(k, kc, ks, rope_slots) if t else self._rope_keys(k, kc, ks, rope_slots)
        out = attention(q, k, v, self.num_heads, self.rw, key_bias, t, self.query_chunk)  # (B, N, kv_dim or C)
        # folded: softmax rows sum to 1, so attn @ (v W^T + b) = (attn @ v) W^T + b
        return self.out_proj(self.v_proj(out) if self.fold_values else out)

    @staticmethod
    def _rope_keys(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: int) -> torch.Tensor:
        """k (B, S*HW + R, C) -> the same with each of the S blocks of HW keys rotated (upstream's layout)."""
        B, spatial, C = k.shape[0], slots * cos.shape[0], k.shape[2]
        k_rope = k[:, :spatial].reshape(B * slots, cos.shape[0], C)  # (B*S, HW, C)
        k_rope = apply_rope(k_rope, cos, sin).reshape(B, spatial, C)  # (B, S*HW, C)
        return torch.cat([k_rope, k[:, spatial:]], dim=1) if k.shape[1] > spatial else k_rope

    @staticmethod
    def _rope_keys_t(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: int) -> torch.Tensor:
        """k (B, S*HW + R, C) -> kt (B, C, S*HW + R): the keys of ``_rope_keys``, transposed before the rotation."""
        B, Nk, C = k.shape
        n = cos.shape[0]
        kt = k.transpose(1, 2)  # (B, C, Nk)
        rot = kt[:, :, : slots * n].reshape(B, C, slots, n)  # (B, C, S, HW)
        rot = apply_rope_t(rot, cos.transpose(0, 1)[:, None], sin.transpose(0, 1)[:, None]).reshape(B, C, slots * n)
        return torch.cat([rot, kt[:, :, slots * n :]], dim=2) if Nk > slots * n else rot  # (B, C, Nk)


class MemoryAttentionLayer(nn.Module):
    """Pre-norm self-attention, cross-attention to memory (keys + pos), ReLU MLP; upstream names."""

    def __init__(self, cfg: Sam2Config, vcfg: Sam2VideoConfig, rw: Rewrites) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = RoPEAttention(d, d, vcfg.attn_heads, rw)
        self.cross_attn_image = RoPEAttention(d, vcfg.mem_dim, vcfg.attn_heads, rw, rw.query_chunk)
        self.linear1, self.linear2 = nn.Linear(d, vcfg.attn_mlp_dim), nn.Linear(vcfg.attn_mlp_dim, d)
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d, 1e-5, rw) for _ in range(3))

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        rope: tuple[torch.Tensor, ...],
        slots: int,
        key_bias: torch.Tensor,
    ) -> torch.Tensor:
        """tgt (Bt, HW, C); memory, memory_pos (B, Nk, mem_dim); key_bias (B, Nk) -> (B, HW, C).

        Bt = B, or Bt = 1 < B: one frame's tokens that every object shares (layer 0). Everything before the
        cross-attention's scores reads tgt alone (norm1, self-attention, residual, norm2, q projection and RoPE),
        so it runs once and is copied to the B objects (by concatenation: no BROADCAST_TO in a graph); each
        object's rows are exactly those of a B = 1 call.
        rope: (cos, sin) of the frame grid, optionally followed by the memory keys' per-slot (cos, sin)."""
        cos, sin = rope[:2]
        x = self.norm1(tgt)
        tgt = tgt + self.self_attn(x, x, x, cos, sin, 1)
        q = self.cross_attn_image.queries(self.norm2(tgt), cos, sin)  # (Bt, HW, C)
        B = memory.shape[0]
        if tgt.shape[0] < B:  # shared up to here: B copies
            tgt, q = torch.cat([tgt] * B), torch.cat([q] * B)  # (B, HW, C)
        key_rope = rope[2:] or None
        tgt = tgt + self.cross_attn_image.attend(q, memory + memory_pos, memory, cos, sin, slots, key_bias, key_rope)
        return tgt + self.linear2(torch.relu(self.linear1(self.norm3(tgt))))


class MemoryAttention(nn.Module):
    """Stack of ``MemoryAttentionLayer`` + final LayerNorm, with the RoPE tables baked as buffers."""

    def __init__(self, cfg: Sam2Config, vcfg: Sam2VideoConfig, rw: Rewrites) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MemoryAttentionLayer(cfg, vcfg, rw) for _ in range(vcfg.attn_layers))
        self.norm = LayerNorm(cfg.d_model, 1e-5, rw)
        e = cfg.image_embedding_size
        if vcfg.cross_rope_q_grid not in (0, e):
            raise ValueError(
                f"cross-attention RoPE query grid {vcfg.cross_rope_q_grid} is not the frame's {e}x{e} grid"
                f" (image size {cfg.image_size}); take the video config at this size (get_video_config)"
            )
        cos, sin = rope_tables(cfg.d_model, e, vcfg.attn_heads, vcfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)  # (HW, C)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.key_tables = vcfg.cross_rope_k_grid > 0  # EdgeTAM: per-slot key tables (L + G*G, C)
        if self.key_tables:
            kcos, ksin = key_rope_tables(
                cfg.d_model, vcfg.perceiver_latents, vcfg.cross_rope_k_grid, vcfg.attn_heads, vcfg.rope_theta
            )
            self.register_buffer("rope_cos_k", kcos, persistent=False)  # (L + G*G, C)
            self.register_buffer("rope_sin_k", ksin, persistent=False)

    def tables(self) -> tuple[torch.Tensor, ...]:
        """The baked RoPE tables in ``forward``'s ``rope`` order: frame (cos, sin) [+ per-slot key (cos, sin)]."""
        if self.key_tables:
            return self.rope_cos, self.rope_sin, self.rope_cos_k, self.rope_sin_k
        return self.rope_cos, self.rope_sin

    def forward(
        self,
        curr: torch.Tensor,
        curr_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        slots: int,
        key_bias: torch.Tensor,
        rope: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """curr (B or 1, HW, C), curr_pos (1, HW, C); memory, memory_pos (B, slots*n + R, mem_dim) (n = HW, or
        L + G*G perceiver tokens); key_bias (B, Nk). A curr of one row is the frame every object shares: layer 0
        runs its object-independent part once (``MemoryAttentionLayer.forward``).

        ``rope``: the ``tables()`` given as inputs instead of the baked buffers (LiteRT's GPU delegate
        computes RoPE wrongly from constant tables: GPU-vs-CPU cosine 0.988, exact from input tables).
        Returns the memory-conditioned tokens (B, HW, C).
        """
        out = curr + 0.1 * curr_pos
        for layer in self.layers:
            out = layer(out, memory, memory_pos, rope or self.tables(), slots, key_bias)
        return self.norm(out)
