"""Memory encoder (upstream ``memory_encoder.py``): image features + a mask -> one spatial memory.

(B = batch, S = image_size, e = S/16, C = d_model, M = mem_dim)
  mask (B, 1, S, S), already in memory-encoder form (sigmoid or binarised, * scale + bias)
  -> mask_downsampler: 4 x [conv 3x3 stride 2, LayerNorm2d, GELU] + 1x1 conv -> (B, C, e, e)
  pix_feat (B, C, e, e) -> pix_feat_proj + mask -> fuser (ConvNeXt blocks) -> out_proj -> (B, M, e, e)
Parameter names are upstream's, so Meta's checkpoint maps by identity.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.model.layers import LayerNorm2d, Rewrites


class MaskDownSampler(nn.Module):
    """(B, 1, S, S) -> (B, C, S/stride, S/stride); channels x4 per stride-2 conv, as upstream."""

    def __init__(self, out_dim: int, total_stride: int, rw: Rewrites) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 1
        for _ in range(int(math.log2(total_stride))):
            cout = cin * 4
            layers += [nn.Conv2d(cin, cout, kernel_size=3, stride=2, padding=1), LayerNorm2d(cout, rw), nn.GELU()]
            cin = cout
        layers.append(nn.Conv2d(cin, out_dim, kernel_size=1))
        self.encoder = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class CXBlock(nn.Module):
    """ConvNeXt block: depthwise conv, LayerNorm2d, pointwise MLP (GELU), layer scale ``gamma``, residual."""

    def __init__(self, dim: int, kernel: int, rw: Rewrites) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=kernel, padding=kernel // 2, groups=dim)
        self.norm = LayerNorm2d(dim, rw)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x)).permute(0, 2, 3, 1)  # (B, H, W, C)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))  # (B, H, W, C)
        return x + y.permute(0, 3, 1, 2)  # (B, C, H, W)


class Fuser(nn.Module):
    def __init__(self, dim: int, num_layers: int, kernel: int, rw: Rewrites) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CXBlock(dim, kernel, rw) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MemoryEncoder(nn.Module):
    """pix_feat (B, C, e, e) + memory-form mask (B, 1, S, S) -> memory features (B, M, e, e)."""

    def __init__(self, cfg: Sam2Config, vcfg: Sam2VideoConfig, rw: Rewrites) -> None:
        super().__init__()
        d = cfg.d_model
        self.mask_downsampler = MaskDownSampler(d, vcfg.mask_stride, rw)
        self.pix_feat_proj = nn.Conv2d(d, d, kernel_size=1)
        self.fuser = Fuser(d, vcfg.fuser_layers, vcfg.fuser_kernel, rw)
        self.out_proj = nn.Conv2d(d, vcfg.mem_dim, kernel_size=1)

    def forward(self, pix_feat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.pix_feat_proj(pix_feat) + self.mask_downsampler(mask)
        return self.out_proj(self.fuser(x))
