"""The exact graphs the ExecuTorch XNNPACK programs hold (reference card 002's I/O), fp32 I/O at every precision.

``encoder.pte`` = ``XnnEncoderGraph``: image [1,3,S,S] (ImageNet-normalised RGB) ->
    image_embed [1,C,e,e] (no_mem_embed added), feat_s0 [1,C/8,4e,4e], feat_s1 [1,C/4,2e,2e].
``decoder.pte`` = ``XnnDecoderGraph`` (prompt encoder inside): image_embed, feat_s0, feat_s1,
    points [1,1,N,2] float (X, Y) model-input pixels, labels [1,1,N] int64 (1 fg, 0 bg, 2/3 box corners,
    -1 not-a-point pad, -2 ignored slot), mask_input [1,1,4e,4e] logits, has_mask_input [1] (0.0 / 1.0)
    -> masks [1,3,4e,4e], iou_scores [1,3], single_mask [1,1,4e,4e], single_iou [1,1], object_score [1,1].
``decoder_prep.pte`` = ``XnnImageProjectionsGraph``: image_embed, mask_input, has_mask_input -> image_q,
    image_k, image_v [1,e*e,Ci] (per image and mask input); ``decoder_cpu.pte`` = ``XnnGivenDecoderGraph``:
    decoder.pte's inputs + those three -> decoder.pte's outputs (what the runtime runs per click).

They compute what ``EncoderGraph`` / ``PointDecoderGraph`` compute, with every constant that is a function
of a few parameters recomputed in the graph instead of stored, so a program holds its parameters and no
more: the window position embedding (bicubic resize of ``pos_embed`` as two matrix products with the exact
bicubic weights, plus ``pos_embed_window`` added per window: 25 MB at 1024 if baked), the image positional
encoding and the no-mask dense embedding (broadcast from its (C,) vector).

At fp16 (``fp16_encoder``: fp16 weights and arithmetic, measured parts kept fp32) the I/O stays fp32: inputs
are cast in, outputs cast out, and the sparse prompt tokens are computed in fp32 (pixel coordinates up to 1024
need more than fp16's 11 bits).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.export.half import HalfGraph
from sam2edge.model import Sam2ImageModel
from sam2edge.model.mask_decoder import ImageProjections


def bicubic_matrix(src: int, dst: int) -> torch.Tensor:
    """(dst, src) matrix M with M @ v = F.interpolate(v, dst, mode='bicubic') along one axis (exact weights)."""
    eye = torch.eye(src, dtype=torch.float64).reshape(src, 1, src, 1)  # basis images, width 1
    out = F.interpolate(eye, size=(dst, 1), mode="bicubic", align_corners=False)  # (src, 1, dst, 1)
    return out.reshape(src, dst).t().contiguous().float()


class XnnEncoderGraph(nn.Module):
    """image 1x3xSxS -> (image_embed, feat_s0, feat_s1), as ``Sam2ImageModel.encode_image`` (fp32 I/O)."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model
        trunk = model.image_encoder.trunk
        self.has_pos_embed = hasattr(trunk, "pos_embed")  # Hiera; EdgeTAM's RepViT has none
        if self.has_pos_embed:
            g, bkg = trunk.grid, trunk.pos_embed.shape[-1]
            interp_t = bicubic_matrix(bkg, g).t().contiguous().to(trunk.pos_embed.dtype)  # (7, g)
            self.register_buffer("interp_t", interp_t)

    def pos_embed(self) -> torch.Tensor | None:
        """bicubic(pos_embed) + tile(pos_embed_window), channels-last (1, g, g, C); None for a trunk without."""
        if not self.has_pos_embed:
            return None
        trunk = self.model.image_encoder.trunk
        p, win = trunk.pos_embed, trunk.pos_embed_window  # (1, C, b, b), (1, C, w, w)
        _, c, b, _ = p.shape
        g, w = self.interp_t.shape[1], win.shape[-1]
        x = p.reshape(c * b, b) @ self.interp_t  # (C*b_y, g_x): resize along x
        x = x.reshape(c, b, g).transpose(1, 2).reshape(c * g, b) @ self.interp_t  # (C*g_x, g_y): along y
        pe = x.reshape(c, g, g).permute(2, 1, 0)  # (g_y, g_x, C)
        pe = pe.reshape(g // w, w, g // w, w * c) + win.permute(0, 2, 3, 1).reshape(1, w, 1, w * c)  # tile add
        return pe.reshape(1, g, g, c)  # (1, g, g, C)

    def backbone_fpn(self, image: torch.Tensor) -> list[torch.Tensor]:
        """As ``Sam2ImageModel.backbone_fpn``: raw FPN levels [1xCx4ex4e, 1xCx2ex2e, 1xCxexe] (model dtype)."""
        return self.model.backbone_fpn(image.to(self.model.no_mem_embed.dtype), pos_embed=self.pos_embed())

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        fpn0, fpn1, fpn2 = self.backbone_fpn(image)
        dec = m.sam_mask_decoder
        emb = fpn2 + m.no_mem_embed.reshape(1, -1, 1, 1)
        return emb.float(), dec.conv_s0(fpn0).float(), dec.conv_s1(fpn1).float()


class XnnDecoderGraph(nn.Module):
    """Prompt encoder + mask decoder with card 002's prompt layout (see module doc), fp32 I/O."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model
        self.points = copy.deepcopy(model.sam_prompt_encoder).float()  # sparse tokens in fp32 (tiny)
        e = model.cfg.image_embedding_size
        centres = (torch.arange(e, dtype=torch.float32) + 0.5) / e
        grid = torch.stack(torch.meshgrid(centres, centres, indexing="xy"), dim=-1)  # (e, e, 2) as (x, y)
        self.register_buffer("pe_grid", grid.reshape(1, e * e, 2))  # (1, e*e, 2) cell centres in [0, 1]

    def image_pe(self) -> torch.Tensor:
        """pe_layer.dense(e) recomputed, as rows (1, e*e, C) (the transformer's layout: no round trip)."""
        return self.points.pe_layer.encode(self.pe_grid)  # (1, e*e, C)

    def dense(self, mask_input: torch.Tensor, has_mask_input: torch.Tensor) -> torch.Tensor:
        """The dense prompt (1, C, e, e): the mask input's encoding where has_mask_input is 1.0, else the
        no-mask embedding broadcast over e x e."""
        pe = self.model.sam_prompt_encoder
        dt = self.model.no_mem_embed.dtype
        has = has_mask_input.to(dt).reshape(1, 1, 1, 1)
        no_mask = pe.no_mask_embed.weight.reshape(1, -1, 1, 1)  # (1, C, 1, 1), broadcast over e x e
        return has * pe.embed_mask(mask_input.to(dt)) + (1.0 - has) * no_mask  # (1, C, e, e)

    def forward(self, image_embed, feat_s0, feat_s1, points, labels, mask_input, has_mask_input):
        return self.decode(image_embed, feat_s0, feat_s1, points, labels, self.dense(mask_input, has_mask_input))

    def decode(self, image_embed, feat_s0, feat_s1, points, labels, dense, given: ImageProjections | None = None):
        """The decoder on a dense prompt (``dense``); ``given``: its first layer's image projections
        (``XnnImageProjectionsGraph`` of the same image and mask input), not computed again."""
        m = self.model
        dt = m.no_mem_embed.dtype
        n = points.shape[2]
        coords = points.reshape(1, n, 2)  # (1, N, 2)
        lab = labels.reshape(1, n).to(torch.float32)  # (1, N)
        valid = (lab != -2).to(dt)  # (1, N): ignored slots are removed as attention keys
        sparse = self.points.embed_points(coords, lab).to(dt)  # (1, N, C)
        masks, iou, obj = m.sam_mask_decoder(
            image_embed.to(dt), self.image_pe().to(dt), sparse, dense, feat_s0.to(dt), feat_s1.to(dt), valid, given
        )
        return tuple(t.float() for t in m.answers(masks, iou, obj))


class XnnImageProjectionsGraph(XnnDecoderGraph):
    """``decoder_prep.pte`` (card role decoder-prep): image_embed [1,C,e,e], mask_input [1,1,4e,4e],
    has_mask_input [1] (as ``XnnDecoderGraph``'s) -> image_q, image_k, image_v [1,e*e,Ci]: the decoder's
    first-layer projections of the image side (``MaskDecoder.image_projections``), which do not depend on
    the prompt's points: run once per image (and per mask input), not per click."""

    def forward(self, image_embed, mask_input, has_mask_input):
        m = self.model
        dt = m.no_mem_embed.dtype
        dense = self.dense(mask_input, has_mask_input)
        given = m.sam_mask_decoder.image_projections(image_embed.to(dt), self.image_pe().to(dt), dense)
        return tuple(t.float() for t in given)


class XnnGivenDecoderGraph(XnnDecoderGraph):
    """``decoder_cpu.pte`` (card role decoder-cpu): ``XnnDecoderGraph``'s inputs plus image_q, image_k,
    image_v [1,e*e,Ci] from ``XnnImageProjectionsGraph`` of the same image_embed and mask input; the same
    outputs, without the three image projections a click would otherwise compute (0.8 of the decoder's
    3.6 GFLOP at 1024 px)."""

    def forward(self, image_embed, feat_s0, feat_s1, points, labels, mask_input, has_mask_input, q, k, v):
        dt = self.model.no_mem_embed.dtype
        given = ImageProjections(q.to(dt), k.to(dt), v.to(dt))
        dense = self.dense(mask_input, has_mask_input)
        return self.decode(image_embed, feat_s0, feat_s1, points, labels, dense, given)


class XnnBatchedDecoderGraph(XnnDecoderGraph):
    """B point prompts per call against one image (``decoder_batched.pte``, card role decoder-batched), no mask
    input: image_embed, feat_s0, feat_s1 (as ``XnnDecoderGraph``, batch 1), points [B,N,2] float (X, Y)
    model-input pixels, labels [B,N] int64 (as ``XnnDecoderGraph``'s, -2 ignored slot) -> masks [B,3,4e,4e],
    iou_scores [B,3], single_mask [B,1,4e,4e], single_iou [B,1], object_score [B,1]. Row b equals
    ``XnnDecoderGraph`` on row b's prompt without a mask. The image stays one row: the decoder projects it
    once and broadcasts (``MaskDecoder.forward_tokens``; XNNPACK runs broadcasting multiplies and adds, not a
    64-input concatenation). B and N are those of the sample inputs it is traced with
    (``batched_decoder_inputs``)."""

    def forward(self, image_embed, feat_s0, feat_s1, points, labels):
        m = self.model
        dt = m.no_mem_embed.dtype
        lab = labels.to(torch.float32)  # (B, N)
        valid = (lab != -2).to(dt)  # (B, N): ignored slots are removed as attention keys
        sparse = self.points.embed_points(points, lab).to(dt)  # (B, N, C)
        dense = m.sam_prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)  # (1, C, 1, 1), broadcast
        emb, s0, s1 = (t.to(dt) for t in (image_embed, feat_s0, feat_s1))  # one row each, shared by the B prompts
        masks, iou, obj = m.sam_mask_decoder(emb, self.image_pe().to(dt), sparse, dense, s0, s1, valid)
        return tuple(t.float() for t in m.answers(masks, iou, obj))


def batched_decoder_inputs(cfg, batch: int, n: int = 2) -> tuple[torch.Tensor, ...]:
    """Sample inputs of ``XnnBatchedDecoderGraph``: B grid prompts (a click + upstream's pad point)."""
    emb, s0, s1, pts, labels, _, _ = decoder_inputs(cfg, n)
    return emb, s0, s1, pts.reshape(1, n, 2).repeat(batch, 1, 1), labels.reshape(1, n).repeat(batch, 1)


def given_decoder_inputs(model: Sam2ImageModel, click: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Inputs of ``XnnGivenDecoderGraph``: ``click`` (``XnnDecoderGraph``'s inputs, e.g. ``decoder_inputs``) plus
    the projections ``XnnImageProjectionsGraph`` makes of its image and mask input."""
    with torch.no_grad():
        given = XnnImageProjectionsGraph(model)(click[0], *click[5:])
    return (*click, *given)


def encoder_inputs(cfg) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, cfg.image_size, cfg.image_size),)


def decoder_inputs(cfg, n: int) -> tuple[torch.Tensor, ...]:
    """Sample decoder inputs with N points (a click, then pads/ignored slots)."""
    e, c = cfg.image_embedding_size, cfg.d_model
    labels = torch.full((1, 1, n), -2, dtype=torch.int64)
    labels[0, 0, 0] = 1
    if n > 1:
        labels[0, 0, 1] = -1
    return (
        torch.randn(1, c, e, e),
        torch.randn(1, c // 8, 4 * e, 4 * e),
        torch.randn(1, c // 4, 2 * e, 2 * e),
        torch.rand(1, 1, n, 2) * cfg.image_size,
        labels,
        torch.zeros(1, 1, 4 * e, 4 * e),
        torch.zeros(1),
    )


def fp16_encoder(graph: nn.Module, keep: tuple[str, ...] = ()) -> HalfGraph:
    """The encoder graph (``XnnEncoderGraph``) with fp16 weights and arithmetic (XNNPACK's fp16 kernels), the
    model parts of ``keep`` (``image_encoder.trunk.blocks.3``: names under the graph's ``model``) in fp32; I/O
    fp32 (``half.HalfGraph``)."""
    return HalfGraph(graph, tuple(f"model.{k}" for k in keep))
