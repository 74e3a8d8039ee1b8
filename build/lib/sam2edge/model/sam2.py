"""The SAM 2.1 image path as one module, and its builder.

Parameter names equal upstream's ``SAM2Base`` names for the image path, so Meta's
checkpoint maps by identity (see ``sam2edge.weights.keymap``).

Stages (B = batch, S = image_size, e = S/16, C = d_model):
  encode_image:  image Bx3xSxS (ImageNet-normalised RGB) -> image_embed BxCxexe (no_mem_embed added),
                 feat_s0 Bx(C/8)x4ex4e, feat_s1 Bx(C/4)x2ex2e  (conv_s0 / conv_s1 folded in)
  sam_prompt_encoder: points / box / mask -> sparse BxNxC, dense BxCxexe
  decode:        features + prompt embeddings -> masks Bx4x4ex4e logits, iou Bx4, object score Bx1
  image_projections: image_embed + dense -> the decode's prompt-independent first-layer projections
                 (3 x BxHWxCi, HW = e*e, Ci = C / attention_downsample_rate), for ``decode(given=...)``
"""

from __future__ import annotations

import torch
from torch import nn

from sam2edge.config import HIERA_TINY, Sam2Config
from sam2edge.model.image_encoder import ImageEncoder
from sam2edge.model.layers import Rewrites
from sam2edge.model.mask_decoder import ImageProjections, MaskDecoder
from sam2edge.model.prompt_encoder import PromptEncoder


class Sam2ImageModel(nn.Module):
    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        self.cfg, self.rewrites = cfg, rw
        self.image_encoder = ImageEncoder(cfg, rw)
        self.sam_prompt_encoder = PromptEncoder(cfg, rw)
        self.sam_mask_decoder = MaskDecoder(cfg, rw)
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, cfg.d_model))

    def backbone_fpn(self, image: torch.Tensor, pos_embed: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Raw FPN levels after scalp, high-res first: [BxCx4ex4e, BxCx2ex2e, BxCxexe]. ``pos_embed``: see
        ``Hiera.forward``."""
        return self.image_encoder(image, pos_embed)

    def encode_image(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decoder-ready features (image_embed, feat_s0, feat_s1); see module docstring for shapes."""
        fpn0, fpn1, fpn2 = self.image_encoder(image)
        image_embed = fpn2 + self.no_mem_embed.reshape(1, -1, 1, 1)
        return image_embed, self.sam_mask_decoder.conv_s0(fpn0), self.sam_mask_decoder.conv_s1(fpn1)

    def decode(
        self,
        image_embed: torch.Tensor,
        feat_s0: torch.Tensor,
        feat_s1: torch.Tensor,
        sparse: torch.Tensor,
        dense: torch.Tensor,
        sparse_valid: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All four mask tokens: (masks Bx4x4ex4e logits, iou Bx4, object_score_logits Bx1). ``given``:
        ``image_projections(image_embed, dense)``, computed beforehand (the same answer)."""
        pe = self.sam_prompt_encoder.image_pe
        return self.sam_mask_decoder(image_embed, pe, sparse, dense, feat_s0, feat_s1, sparse_valid, given)

    def image_projections(self, image_embed: torch.Tensor, dense: torch.Tensor) -> ImageProjections:
        """The decode's prompt-independent work (``MaskDecoder.image_projections``): 3 x BxHWxCi."""
        return self.sam_mask_decoder.image_projections(image_embed, self.sam_prompt_encoder.image_pe, dense)

    def answers(self, masks: torch.Tensor, iou: torch.Tensor, obj: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """THE answer of every graph and backend, from ``decode``'s four tokens: (multimask masks Bx3x4ex4e,
        their iou Bx3, single-mask (SAM 2.1 dynamic) Bx1x4ex4e, its iou Bx1, object_score Bx1)."""
        dec = self.sam_mask_decoder
        return (*dec.multimask(masks, iou), *dec.single_mask(masks, iou), obj)

    def forward(
        self, image: torch.Tensor, coords: torch.Tensor, labels: torch.Tensor, multimask_output: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """End to end for one prompt set: coords BxNx2 (X,Y) model-input pixels, already padded; labels BxN."""
        feats = self.encode_image(image)
        sparse = self.sam_prompt_encoder.embed_points(coords, labels)
        dense = self.sam_prompt_encoder.no_mask_dense.expand(sparse.shape[0], -1, -1, -1)
        masks, iou, obj = self.decode(*feats, sparse, dense)
        dec = self.sam_mask_decoder
        masks, iou = dec.multimask(masks, iou) if multimask_output else dec.single_mask(masks, iou)
        return masks, iou, obj


def build_sam2(cfg: Sam2Config = HIERA_TINY, rewrites: Rewrites | None = None) -> Sam2ImageModel:
    """Build the image-path model in eval mode (weights uninitialised until loaded)."""
    return Sam2ImageModel(cfg, rewrites or Rewrites()).eval()
