"""Prompt encoder (upstream ``sam/prompt_encoder.py``): points, box corners and a mask input -> tokens.

Coordinate frame: points are (X, Y) in model-input pixels, i.e. in [0, image_size) of the
resized square image. Labels: 1 foreground, 0 background, 2 box top-left, 3 box
bottom-right, -1 padding ("not a point"). Label selection is arithmetic (one-hot matmul and
where), with no data-dependent control flow. The image positional encoding and the dense
no-mask embedding are constants, baked into buffers whenever weights are loaded.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.model.layers import LayerNorm2d, Rewrites


class PositionEmbeddingRandom(nn.Module):
    """Random-Fourier positional encoding; ``positional_encoding_gaussian_matrix`` is (2, C/2)."""

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn(2, num_pos_feats))

    def encode(self, coords01: torch.Tensor) -> torch.Tensor:
        """(..., 2) coordinates normalised to [0, 1] -> (..., C) = [sin, cos](2*pi*(2c-1) @ G)."""
        c = (2 * coords01 - 1) @ self.positional_encoding_gaussian_matrix
        c = 2 * math.pi * c
        return torch.cat([torch.sin(c), torch.cos(c)], dim=-1)

    def dense(self, size: int) -> torch.Tensor:
        """Encoding of every cell centre of a size x size grid: (1, C, size, size)."""
        centres = (
            torch.arange(size, dtype=torch.float32, device=self.positional_encoding_gaussian_matrix.device) + 0.5
        ) / size
        grid = torch.stack(torch.meshgrid(centres, centres, indexing="xy"), dim=-1)  # (size, size, 2) as (x, y)
        return self.encode(grid).permute(2, 0, 1).unsqueeze(0)


class PromptEncoder(nn.Module):
    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        d, e = cfg.d_model, cfg.image_embedding_size
        self.embed_dim, self.image_size, self.embed_size = d, cfg.image_size, e
        self.pe_layer = PositionEmbeddingRandom(d // 2)
        self.point_embeddings = nn.ModuleList(nn.Embedding(1, d) for _ in range(4))  # bg, fg, box TL, box BR
        self.not_a_point_embed = nn.Embedding(1, d)
        m = cfg.mask_in_chans
        self.mask_downscaling = nn.Sequential(
            nn.Conv2d(1, m // 4, kernel_size=2, stride=2),
            LayerNorm2d(m // 4, rw),
            nn.GELU(),
            nn.Conv2d(m // 4, m, kernel_size=2, stride=2),
            LayerNorm2d(m, rw),
            nn.GELU(),
            nn.Conv2d(m, d, kernel_size=1),
        )
        self.no_mask_embed = nn.Embedding(1, d)
        self.register_buffer("image_pe", torch.zeros(1, d, e, e), persistent=False)
        self.register_buffer("no_mask_dense", torch.zeros(1, d, e, e), persistent=False)
        self.register_buffer("label_embed", torch.zeros(4, d), persistent=False)
        self.refresh_constants()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_constants())

    @torch.no_grad()
    def refresh_constants(self) -> None:
        e = self.embed_size
        self.image_pe = self.pe_layer.dense(e).contiguous()  # (1, C, e, e)
        self.no_mask_dense = self.no_mask_embed.weight.detach().reshape(1, -1, 1, 1).expand(1, -1, e, e).contiguous()
        self.label_embed = torch.cat([p.weight.detach() for p in self.point_embeddings], dim=0)  # (4, C)

    def embed_points(self, coords: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Sparse tokens for points that are already padded.

        coords: Bx N x2, (X, Y) in model-input pixels. labels: BxN (any numeric dtype), values in
        {-1, 0, 1, 2, 3}. Returns BxNxC. A label -1 token is ``not_a_point_embed`` alone.
        """
        pe = self.pe_layer.encode((coords + 0.5) / self.image_size)  # (B, N, C)
        labels = labels.to(pe.dtype).unsqueeze(-1)  # (B, N, 1)
        onehot = (labels == torch.arange(4, dtype=pe.dtype, device=pe.device)).to(pe.dtype)  # (B, N, 4)
        base = torch.where(labels == -1, self.not_a_point_embed.weight, pe)  # (B, N, C)
        return base + onehot @ self.label_embed

    def embed_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """Mask-input logits Bx1x(4e)x(4e) -> dense embedding BxCxexe."""
        return self.mask_downscaling(mask)

    def forward(
        self,
        points: tuple[torch.Tensor, torch.Tensor] | None,
        boxes: torch.Tensor | None,
        masks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Upstream-compatible entry: (sparse BxNxC, dense BxCxexe).

        Mirrors upstream: one padding point is appended when points come without a box;
        boxes (Bx4, XYXY model-input pixels) become two corner tokens after the points.
        """
        tokens = []
        if points is not None:
            coords, labels = points
            if boxes is None:
                b = coords.shape[0]
                coords = torch.cat([coords, coords.new_zeros(b, 1, 2)], dim=1)
                labels = torch.cat([labels.to(coords.dtype), -coords.new_ones(b, 1)], dim=1)
            tokens.append(self.embed_points(coords, labels))
        if boxes is not None:
            corners = boxes.reshape(-1, 2, 2)  # (B, 2, 2)
            corner_labels = torch.tensor([2.0, 3.0], device=corners.device).expand(corners.shape[0], 2)
            tokens.append(self.embed_points(corners, corner_labels))
        if points is not None:
            bs = points[0].shape[0]
        elif boxes is not None:
            bs = boxes.shape[0]
        else:
            bs = masks.shape[0] if masks is not None else 1
        sparse = torch.cat(tokens, dim=1) if tokens else self.image_pe.new_zeros(bs, 0, self.embed_dim)
        dense = self.embed_mask(masks) if masks is not None else self.no_mask_dense.expand(bs, -1, -1, -1)
        return sparse, dense
