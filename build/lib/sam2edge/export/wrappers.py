"""Export entry points: the exact graphs every target converts (encoder, two decoder contracts).

Decoder outputs (all targets, fp32 I/O):
  masks       1x3x4ex4e  multimask candidate logits (tokens 1..3)
  iou         1x3        their predicted IoU
  single_mask 1x1x4ex4e  SAM 2.1 single-mask answer (dynamic multimask via stability)
  single_iou  1x1
  object_score 1x1       object-presence logit
"""

from __future__ import annotations

import torch
from torch import nn

from sam2edge.model import Sam2ImageModel
from sam2edge.model.mask_decoder import ImageProjections

ENCODER_OUTPUTS = ("image_embeddings", "feat_s0", "feat_s1")
DECODER_OUTPUTS = ("masks", "iou_scores", "single_mask", "single_iou", "object_score")
IMAGE_PROJECTIONS = ImageProjections._fields  # ("image_q", "image_k", "image_v")


class EncoderGraph(nn.Module):
    """image 1x3xSxS (ImageNet-normalised RGB) -> image_embeddings 1xCxexe, feat_s0, feat_s1 (decoder-ready)."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.model.encode_image(image)


class TokenDecoderGraph(nn.Module):
    """Decoder fed host-encoded prompts (LiteRT contract).

    Inputs: image_embeddings 1xCxexe, feat_s0, feat_s1, sparse_prompt 1xKxC, sparse_valid 1xK (1 used,
    0 ignored slot), dense_prompt 1xCxexe (no-mask table or a mask encoding). Outputs: DECODER_OUTPUTS.
    """

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeddings, feat_s0, feat_s1, sparse_prompt, sparse_valid, dense_prompt):
        out = self.model.decode(image_embeddings, feat_s0, feat_s1, sparse_prompt, dense_prompt, sparse_valid)
        return self.model.answers(*out)


class GivenTokenDecoderGraph(nn.Module):
    """``TokenDecoderGraph`` given its prompt-independent work (LiteRT's CPU decoder): the inputs of
    ``TokenDecoderGraph`` plus image_q, image_k, image_v 1xHWxCi from ``ImageProjectionsGraph`` of the same
    image_embeddings and dense_prompt. Outputs: DECODER_OUTPUTS, equal to ``TokenDecoderGraph``'s."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, image_embeddings, feat_s0, feat_s1, sparse_prompt, sparse_valid, dense_prompt, image_q, image_k, image_v
    ):
        given = ImageProjections(image_q, image_k, image_v)
        m = self.model
        out = m.decode(image_embeddings, feat_s0, feat_s1, sparse_prompt, dense_prompt, sparse_valid, given)
        return m.answers(*out)


class ImageProjectionsGraph(nn.Module):
    """image_embeddings 1xCxexe + dense_prompt 1xCxexe -> IMAGE_PROJECTIONS (3 x 1xHWxCi): the decoder's
    first-layer image projections, run once per image (and per mask input), not per click."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeddings: torch.Tensor, dense_prompt: torch.Tensor) -> ImageProjections:
        return self.model.image_projections(image_embeddings, dense_prompt)


class MaskEncoderGraph(nn.Module):
    """mask_input 1x1x4ex4e logits -> dense_prompt 1xCxexe (the prompt encoder's mask_downscaling)."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, mask_input: torch.Tensor) -> torch.Tensor:
        return self.model.sam_prompt_encoder.embed_mask(mask_input)


class PointDecoderGraph(nn.Module):
    """Decoder with the prompt encoder inside (ONNX / ExecuTorch contract).

    Inputs: image_embeddings, feat_s0, feat_s1, point_coords 1xNx2 float (X, Y) model-input pixels,
    point_labels 1xN float (1 fg, 0 bg, 2/3 box corners, -1 not-a-point pad, -2 ignored slot),
    mask_input 1x1x4ex4e, has_mask_input (1,) 0.0 or 1.0. Outputs: DECODER_OUTPUTS.
    """

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeddings, feat_s0, feat_s1, point_coords, point_labels, mask_input, has_mask_input):
        pe = self.model.sam_prompt_encoder
        valid = (point_labels != -2).to(point_coords.dtype)  # (1, N)
        sparse = pe.embed_points(point_coords, point_labels)
        has = has_mask_input.reshape(1, 1, 1, 1)
        dense = has * pe.embed_mask(mask_input) + (1.0 - has) * pe.no_mask_dense
        out = self.model.decode(image_embeddings, feat_s0, feat_s1, sparse, dense, valid)
        return self.model.answers(*out)
