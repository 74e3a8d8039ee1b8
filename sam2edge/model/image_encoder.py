"""Image encoder: a trunk (Hiera, upstream ``hieradet.py``; or EdgeTAM's RepViT, ``repvit.py``) + the FPN neck
(upstream ``image_encoder.py``), rank <= 4. ``TRUNKS`` picks the trunk by ``Sam2Config.trunk``.

Tensors inside the trunk are channels-last (B, H, W, C) as upstream. Window partitioning,
the fused-qkv split and query pooling never create a tensor above rank 4. The windowed
positional embedding (bicubic interpolation of ``pos_embed`` plus the tiled
``pos_embed_window``) is a constant, baked into the ``pos_embed_baked`` buffer whenever
weights are loaded.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.model.layers import MLP, LayerNorm, Rewrites, attention
from sam2edge.model.repvit import RepViT


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * nWin, ws, ws, C), zero-padding H and W up to multiples of ws."""
    B, H, W, C = x.shape
    ph, pw = (ws - H % ws) % ws, (ws - W % ws) % ws
    if ph or pw:
        x = F.pad(x, (0, 0, 0, pw, 0, ph))
    Hp, Wp = H + ph, W + pw
    x = x.reshape(B * Hp // ws, ws, Wp // ws, ws * C)  # (B*nH, ws, nW, ws*C)
    x = x.transpose(1, 2)  # (B*nH, nW, ws, ws*C)
    return x.reshape(-1, ws, ws, C)  # (B*nH*nW, ws, ws, C)


def window_unpartition(win: torch.Tensor, ws: int, hw: tuple[int, int], batch: int) -> torch.Tensor:
    """(B * nWin, ws, ws, C) -> (B, H, W, C): inverse of window_partition, padding cropped."""
    H, W = hw
    Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws
    C = win.shape[-1]
    x = win.reshape(batch * Hp // ws, Wp // ws, ws, ws * C)  # (B*nH, nW, ws, ws*C)
    x = x.transpose(1, 2)  # (B*nH, ws, nW, ws*C)
    x = x.reshape(batch, Hp, Wp, C)  # (B, Hp, Wp, C)
    if Hp > H or Wp > W:
        x = x[:, :H, :W, :]
    return x


class QKV(nn.Linear):
    """Hiera's q / k / v projection: one (C_in -> 3C) Linear, the checkpoint's ``attn.qkv``. With ``split``
    (``Rewrites.qkv="split"``) it returns q, k and v as three products by its weight's row blocks, cut once at
    load (buffers, not saved), instead of one product sliced afterwards. The products run inside this layer,
    so an exported graph names them by its scope and a layer kept fp32 by name (``attn.qkv``) keeps all three."""

    PARTS = ("q_weight", "q_bias", "k_weight", "k_bias", "v_weight", "v_bias")

    def __init__(self, dim: int, dim_out: int, split: bool) -> None:
        super().__init__(dim, 3 * dim_out)
        self.split = split
        for name in self.PARTS:
            self.register_buffer(name, torch.empty(0), persistent=False)
        self.cut()

    @torch.no_grad()
    def cut(self) -> None:
        """Cut the weight (3C, C_in) and bias (3C,) into the q, k and v row blocks the split form multiplies by."""
        if not self.split:
            return
        C = self.out_features // 3
        for i, part in enumerate("qkv"):
            setattr(self, f"{part}_weight", self.weight.detach()[i * C : (i + 1) * C].clone())  # (C, C_in)
            setattr(self, f"{part}_bias", self.bias.detach()[i * C : (i + 1) * C].clone())  # (C,)

    def forward(self, x: torch.Tensor):
        """x (.., C_in) -> (.., 3C); split: a tuple of q, k, v (.., C) each."""
        if not self.split:
            return super().forward(x)
        parts = ((self.q_weight, self.q_bias), (self.k_weight, self.k_bias), (self.v_weight, self.v_bias))
        return tuple(F.linear(x, w, b) for w, b in parts)


def max_pool_nhwc(x: torch.Tensor, stride: int, rw: Rewrites) -> torch.Tensor:
    """MaxPool2d(kernel=stride, stride=stride) on (B, H, W, C); ``rw.q_pool`` says how (both exact)."""
    B, H, W, C = x.shape
    if rw.q_pool == "max_pool" or H % stride or W % stride:
        x = F.max_pool2d(x.permute(0, 3, 1, 2), kernel_size=stride, stride=stride)
        return x.permute(0, 2, 3, 1)
    s = stride
    rows = x.reshape(B * H // s, s, W, C)  # (B*H/s, s, W, C): the s rows of each window row
    y = rows[:, :1]
    for i in range(1, s):
        y = torch.maximum(y, rows[:, i : i + 1])  # (B*H/s, 1, W, C)
    cols = y.reshape(B * H // s, W // s, s * C)  # (B*H/s, W/s, s*C): the s columns of each window
    z = cols[..., :C]
    for i in range(1, s):
        z = torch.maximum(z, cols[..., i * C : (i + 1) * C])  # (B*H/s, W/s, C)
    return z.reshape(B, H // s, W // s, C)  # (B, H/s, W/s, C)


class MultiScaleAttention(nn.Module):
    """Hiera attention with optional query pooling. Input (B, H, W, C) -> (B, H', W', C_out)."""

    def __init__(self, dim: int, dim_out: int, num_heads: int, q_stride: int, rw: Rewrites) -> None:
        super().__init__()
        self.dim_out, self.num_heads, self.q_stride, self.rw = dim_out, num_heads, q_stride, rw
        self.qkv = QKV(dim, dim_out, rw.qkv == "split")
        self.proj = nn.Linear(dim_out, dim_out)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, H, W, C_in) -> q, k, v, each (B, N, C)."""
        B, H, W, _ = x.shape
        C = self.dim_out
        if self.qkv.split:
            return tuple(p.reshape(B, H * W, C) for p in self.qkv(x))  # (B, N, C) each
        qkv = self.qkv(x).reshape(B, H * W, 3 * C)  # (B, N, 3C), heads interleaved per q/k/v
        return qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]  # (B, N, C) each

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, _ = x.shape
        C = self.dim_out
        q, k, v = self._project(x)  # (B, N, C) each
        if self.q_stride:
            q = max_pool_nhwc(q.reshape(B, H, W, C), self.q_stride, self.rw)  # (B, H/s, W/s, C)
            H, W = q.shape[1:3]
            q = q.reshape(B, H * W, C)  # (B, N/s^2, C)
        chunk = self.rw.image_query_chunk
        # a global block (one item of N' queries) in query slices; windows (many short items) whole
        x = attention(q, k, v, self.num_heads, self.rw, query_chunk=chunk if B == 1 and q.shape[1] > chunk else 0)
        return self.proj(x.reshape(B, H, W, C))  # (B, H, W, C_out)


class ShiftedMLP(MLP):
    """The block's MLP, whose second Linear may read its input shifted per channel: ``GELU(fc1(x)) - shift``
    (``shift`` (hidden,), its bias holding ``W @ shift`` so the function is the same). Upstream checkpoints have no
    shift; an int8 export's state dict holds ``mlp.shift`` where the hidden channels sit at offsets
    (``export.smooth``), and loading it adds one elementwise subtraction to the graph, before the int8 product."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("shift", None)  # (hidden,) where loaded; None: not in the state dict

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        shift = state_dict.get(prefix + "shift")
        self.shift = None if shift is None else torch.empty_like(shift)  # the load copies it in
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., C) -> (..., C)
        h = self.act(self.layers[0](x))  # (..., hidden)
        return self.layers[1](h if self.shift is None else h - self.shift)


class MultiScaleBlock(nn.Module):
    """One Hiera block: (windowed) attention + MLP, with a pooled, projected shortcut at stage changes."""

    def __init__(
        self, dim: int, dim_out: int, num_heads: int, q_stride: int, window_size: int, mlp_ratio: float, rw: Rewrites
    ) -> None:
        super().__init__()
        self.dim, self.dim_out, self.window_size, self.q_stride, self.rw = dim, dim_out, window_size, q_stride, rw
        self.norm1 = LayerNorm(dim, 1e-6, rw)
        self.attn = MultiScaleAttention(dim, dim_out, num_heads, q_stride, rw)
        self.norm2 = LayerNorm(dim_out, 1e-6, rw)
        self.mlp = ShiftedMLP(dim_out, int(dim_out * mlp_ratio), dim_out, 2, act=nn.GELU)
        if dim != dim_out:
            self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x  # (B, H, W, C)
        x = self.norm1(x)
        if self.dim != self.dim_out:
            shortcut = self.proj(x)
            if self.q_stride:
                shortcut = max_pool_nhwc(shortcut, self.q_stride, self.rw)  # (B, H/s, W/s, C_out)
        B, H, W, _ = x.shape
        ws = self.window_size
        if ws > 0:
            x = window_partition(x, ws)  # (B*nWin, ws, ws, C)
        x = self.attn(x)
        if ws > 0:
            if self.q_stride:
                ws = ws // self.q_stride
                H, W = shortcut.shape[1:3]
            x = window_unpartition(x, ws, (H, W), B)  # (B, H', W', C_out)
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Conv 7x7 stride 4 pad 3, NCHW image -> (B, H/4, W/4, C)."""

    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=kernel, stride=4, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)


class Hiera(nn.Module):
    """Hierarchical ViT trunk. Image (B, 3, S, S) -> per-stage features (B, C_i, S/4/2^i, S/4/2^i), i = 0..3."""

    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        self.stage_ends = [sum(cfg.stages[: i + 1]) - 1 for i in range(len(cfg.stages))]
        q_pool_blocks = [e + 1 for e in self.stage_ends[:-1]][: cfg.q_pool]
        self.patch_embed = PatchEmbed(cfg.embed_dim, cfg.patch_kernel)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.embed_dim, *cfg.window_pos_embed_bkg))
        ws0 = cfg.window_spec[0]
        self.pos_embed_window = nn.Parameter(torch.zeros(1, cfg.embed_dim, ws0, ws0))
        self.grid = cfg.image_size // 4
        self.register_buffer("pos_embed_baked", torch.zeros(1, self.grid, self.grid, cfg.embed_dim), persistent=False)

        dim, heads, stage = cfg.embed_dim, cfg.num_heads, 0
        self.blocks = nn.ModuleList()
        for i in range(sum(cfg.stages)):
            window = 0 if i in cfg.global_att_blocks else cfg.window_spec[stage]
            dim_out = dim
            if i - 1 in self.stage_ends:  # first block of a new stage
                dim_out, heads, stage = dim * 2, heads * 2, stage + 1
            q_stride = cfg.q_stride if i in q_pool_blocks else 0
            self.blocks.append(MultiScaleBlock(dim, dim_out, heads, q_stride, window, cfg.mlp_ratio, rw))
            dim = dim_out
        self.refresh_constants()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_constants())

    @torch.no_grad()
    def refresh_constants(self) -> None:
        """Bake bicubic(pos_embed) + tile(pos_embed_window) at the trunk's grid size, and (``Rewrites.qkv``
        "split") each block's q / k / v weights."""
        for blk in self.blocks:
            blk.attn.qkv.cut()
        g = self.grid
        pe = F.interpolate(self.pos_embed.detach(), size=(g, g), mode="bicubic")  # (1, C, g, g)
        win = self.pos_embed_window.detach()
        pe = pe + win.tile(1, 1, g // win.shape[2], g // win.shape[3])
        self.pos_embed_baked = pe.permute(0, 2, 3, 1).contiguous()  # (1, g, g, C)

    def forward(self, x: torch.Tensor, pos_embed: torch.Tensor | None = None) -> list[torch.Tensor]:
        """``pos_embed`` (1, S/4, S/4, C): a caller's own (e.g. recomputed in an exported graph) instead of
        the baked one."""
        x = self.patch_embed(x) + (self.pos_embed_baked if pos_embed is None else pos_embed)  # (B, S/4, S/4, C)
        outs = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in self.stage_ends:
                outs.append(x.permute(0, 3, 1, 2))  # (B, C_i, H_i, W_i)
        return outs


class _NeckConv(nn.Module):
    """Lateral 1x1 conv, wrapped so parameter names match upstream (``convs.N.conv``)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class FpnNeck(nn.Module):
    """Lateral 1x1 convs + nearest top-down fusion on the listed levels. Outputs d_model channels, high-res first."""

    def __init__(self, cfg: Sam2Config) -> None:
        super().__init__()
        self.convs = nn.ModuleList(_NeckConv(c, cfg.d_model) for c in reversed(cfg.stage_dims))
        self.top_down_levels = set(cfg.fpn_top_down_levels)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        n = len(xs) - 1
        out: list[torch.Tensor] = [xs[0]] * len(xs)
        prev = None
        for i in range(n, -1, -1):
            lateral = self.convs[n - i](xs[i])
            if i in self.top_down_levels and prev is not None:
                prev = lateral + F.interpolate(prev, scale_factor=2.0, mode="nearest")
            else:
                prev = lateral
            out[i] = prev
        return out


# Sam2Config.trunk -> trunk class; each maps (B, 3, S, S) to per-stage (B, C_i, S / 2^(i+2), S / 2^(i+2)) features
TRUNKS: dict[str, type[nn.Module]] = {"hiera": Hiera, "repvit": RepViT}


class ImageEncoder(nn.Module):
    """Trunk + neck with the lowest ``scalp`` levels dropped: image -> [FPN_0, FPN_1, FPN_2], high-res first."""

    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        if cfg.trunk not in TRUNKS:
            raise ValueError(f"Sam2Config.trunk={cfg.trunk!r}; allowed: {sorted(TRUNKS)}")
        self.trunk = TRUNKS[cfg.trunk](cfg, rw)
        self.neck = FpnNeck(cfg)
        self.scalp = cfg.scalp

    def forward(self, x: torch.Tensor, pos_embed: torch.Tensor | None = None) -> list[torch.Tensor]:
        feats = self.neck(self.trunk(x, pos_embed))
        return feats[: len(feats) - self.scalp]


@lru_cache(maxsize=8)
def sine_position_encoding(d_model: int, h: int, w: int) -> torch.Tensor:
    """The neck's constant sine position encoding (upstream PositionEmbeddingSine, normalize=True).

    Shape-only, so it is computed here, host-side, and never part of an exported graph.
    Returns (1, d_model, h, w).
    """
    npf, scale, eps = d_model // 2, 2 * math.pi, 1e-6
    y = torch.arange(1, h + 1, dtype=torch.float32).view(1, -1, 1).repeat(1, 1, w)
    x = torch.arange(1, w + 1, dtype=torch.float32).view(1, 1, -1).repeat(1, h, 1)
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    dim_t = torch.arange(npf, dtype=torch.float32)
    dim_t = 10000 ** (2 * (dim_t // 2) / npf)
    px, py = x[..., None] / dim_t, y[..., None] / dim_t  # (1, h, w, npf)
    px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), dim=4).flatten(3)
    py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((py, px), dim=3).permute(0, 3, 1, 2)
