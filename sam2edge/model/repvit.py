"""RepViT trunk (EdgeTAM's image encoder: timm ``repvit_m1``, ``features_only``), NCHW, rank <= 4.

Parameter names are timm's under ``body.`` (``stem.conv1.c.weight``, ``stages_{i}.blocks.{j}.token_mixer.conv.bn.*``,
...), so the original ``edgetam.pt`` (``image_encoder.trunk.body.*``) maps by identity. Every convolution is stored
as trained: a bias-free conv and its batch norm (``ConvNorm``), and the RepVGG-style token mixer's k x k and 1 x 1
depthwise branches beside its identity (``RepVggDw``). ``fuse`` folds each into ONE convolution (weight and bias as
non-persistent buffers, re-derived whenever weights are loaded), which is all ``forward`` runs: exact structural
re-parameterisation (eval-mode batch norm is affine per channel; a 1 x 1 depthwise kernel and the identity are k x k
kernels with one non-zero centre tap), so exported graphs hold only convolutions, GELUs and the SE gates.
``set_fused(False)`` runs the trained form instead (tests compare the two).

Image (B, 3, S, S) -> features (B, C_i, S / 2^(i+2), S / 2^(i+2)) of ``cfg.repvit_dims``, i = 0..3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.config import Sam2Config


def make_divisible(v: float, divisor: int = 8) -> int:
    """timm's ``make_divisible(v, divisor, round_limit=0)``: the SE squeeze width."""
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


class ConvNorm(nn.Module):
    """Bias-free conv ``c`` + batch norm ``bn`` (timm ``ConvNorm``); fused: one conv with bias."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, pad: int = 0, groups: int = 1) -> None:
        super().__init__()
        self.c = nn.Conv2d(cin, cout, k, stride, pad, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.fused = True
        self.register_buffer("weight", torch.empty(0), persistent=False)  # (cout, cin / groups, k, k) when fused
        self.register_buffer("bias", torch.empty(0), persistent=False)  # (cout,)

    @torch.no_grad()
    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of the one conv equal to conv + eval-mode batch norm."""
        bn = self.bn
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # (cout,)
        return self.c.weight * scale.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * scale

    @torch.no_grad()
    def fuse(self) -> None:
        self.weight, self.bias = self.folded()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return self.bn(self.c(x))
        c = self.c
        return F.conv2d(x, self.weight, self.bias, c.stride, c.padding, c.dilation, c.groups)


class RepVggDw(nn.Module):
    """Token mixer (timm ``RepVggDw``, legacy form of repvit_m1): k x k depthwise ConvNorm + 1 x 1 depthwise
    ConvNorm + identity; fused: one k x k depthwise conv."""

    def __init__(self, dim: int, k: int) -> None:
        super().__init__()
        self.conv = ConvNorm(dim, dim, k, 1, (k - 1) // 2, groups=dim)
        self.conv1 = ConvNorm(dim, dim, 1, 1, 0, groups=dim)
        self.k, self.fused = k, True
        self.register_buffer("weight", torch.empty(0), persistent=False)  # (dim, 1, k, k) when fused
        self.register_buffer("bias", torch.empty(0), persistent=False)  # (dim,)

    @torch.no_grad()
    def fuse(self) -> None:
        (w, b), (w1, b1) = self.conv.folded(), self.conv1.folded()  # (C, 1, k, k), (C, 1, 1, 1)
        centre = torch.zeros_like(w)  # the 1 x 1 branch and the identity sit on the centre tap
        c = self.k // 2
        centre[:, :, c, c] = w1[:, :, 0, 0] + 1.0
        self.weight, self.bias = w + centre, b + b1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return self.conv(x) + self.conv1(x) + x
        return F.conv2d(x, self.weight, self.bias, 1, self.k // 2, 1, x.shape[1])


class SqueezeExcite(nn.Module):
    """timm ``SEModule``: x * sigmoid(fc2(relu(fc1(mean_hw(x))))), 1 x 1 convs with bias."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        rd = make_divisible(dim * 0.25)
        self.fc1 = nn.Conv2d(dim, rd, 1)
        self.fc2 = nn.Conv2d(rd, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)  # (B, C, 1, 1)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class Mlp(nn.Module):
    """Channel mixer: 1 x 1 ConvNorm -> GELU -> 1 x 1 ConvNorm."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(dim, hidden)
        self.act = nn.GELU()
        self.conv2 = ConvNorm(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x)))


class Block(nn.Module):
    """RepViT block: token mixer, optional SE, residual channel mixer. (B, C, H, W) -> same."""

    def __init__(self, dim: int, mlp_ratio: int, k: int, use_se: bool) -> None:
        super().__init__()
        self.token_mixer = RepVggDw(dim, k)
        self.se = SqueezeExcite(dim) if use_se else nn.Identity()
        self.channel_mixer = Mlp(dim, dim * mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.se(self.token_mixer(x))
        return x + self.channel_mixer(x)


class Downsample(nn.Module):
    """Stage entry: block, stride-2 depthwise ConvNorm, 1 x 1 ConvNorm to the new width, residual MLP.
    (B, C, H, W) -> (B, C', H/2, W/2)."""

    def __init__(self, dim: int, dim_out: int, mlp_ratio: int, k: int) -> None:
        super().__init__()
        self.pre_block = Block(dim, mlp_ratio, k, use_se=False)
        self.spatial_downsample = ConvNorm(dim, dim, k, 2, (k - 1) // 2, groups=dim)
        self.channel_downsample = ConvNorm(dim, dim_out, 1)
        self.ffn = Mlp(dim_out, dim_out * mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.channel_downsample(self.spatial_downsample(self.pre_block(x)))
        return x + self.ffn(x)


class Stem(nn.Module):
    """Two stride-2 3 x 3 ConvNorms with a GELU between: (B, 3, S, S) -> (B, C_0, S/4, S/4)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(3, dim // 2, 3, 2, 1)
        self.act1 = nn.GELU()
        self.conv2 = ConvNorm(dim // 2, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act1(self.conv1(x)))


class Stage(nn.Module):
    """A downsample (every stage but the first) and ``depth`` blocks, SE on every other one (the first included)."""

    def __init__(self, dim: int, dim_out: int, depth: int, mlp_ratio: int, k: int, downsample: bool) -> None:
        super().__init__()
        self.downsample = Downsample(dim, dim_out, mlp_ratio, k) if downsample else nn.Identity()
        self.blocks = nn.Sequential(*(Block(dim_out, mlp_ratio, k, use_se=j % 2 == 0) for j in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class RepViTBody(nn.Module):
    """timm's ``FeatureListNet`` layout: ``stem``, ``stages_0`` .. ``stages_{n-1}``."""

    def __init__(self, cfg: Sam2Config) -> None:
        super().__init__()
        dims, k, r = cfg.repvit_dims, cfg.repvit_kernel, cfg.repvit_mlp_ratio
        self.stem = Stem(dims[0])
        self.num_stages = len(dims)
        prev = dims[0]
        for i, (dim, depth) in enumerate(zip(dims, cfg.repvit_depths)):
            self.add_module(f"stages_{i}", Stage(prev, dim, depth, r, k, downsample=i > 0))
            prev = dim

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for i in range(self.num_stages):
            x = getattr(self, f"stages_{i}")(x)
            outs.append(x)  # (B, C_i, S / 2^(i+2), S / 2^(i+2))
        return outs


class RepViT(nn.Module):
    """EdgeTAM's trunk. Image (B, 3, S, S) -> per-stage features, high-res first (as ``Hiera``)."""

    def __init__(self, cfg: Sam2Config, rw=None) -> None:
        super().__init__()
        self.body = RepViTBody(cfg)
        self.fuse()
        self.register_load_state_dict_post_hook(lambda module, _: module.fuse())

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold every conv + batch norm, and each token mixer's branches, into one convolution (buffers)."""
        for m in self.modules():
            if isinstance(m, (ConvNorm, RepVggDw)):
                m.fuse()

    def set_fused(self, fused: bool) -> None:
        """``False``: run the trained form (separate convs, batch norms and branches) instead of the folded one."""
        for m in self.modules():
            if isinstance(m, (ConvNorm, RepVggDw)):
                m.fused = fused

    def forward(self, x: torch.Tensor, pos_embed: torch.Tensor | None = None) -> list[torch.Tensor]:
        if pos_embed is not None:
            raise ValueError("the RepViT trunk has no position embedding")
        return self.body(x)
