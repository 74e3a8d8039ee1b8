"""The SAM 2.1 video path: the image model plus the memory path, as fixed-shape per-frame stages.

Parameter names equal upstream ``SAM2Base``'s, so Meta's checkpoint maps by identity.
Shapes (B objects per call, one frame; S = image_size, e = S/16, HW = e*e, C = d_model, M = mem_dim,
K = memory_slots, P = max_obj_ptrs, T = num_maskmem):

  encode_frame:     image (1, 3, S, S) -> vision (1, C, e, e) (raw FPN level 2), feat_s0, feat_s1
  no_memory:        vision -> pix_feat = vision + no_mem_embed (a frame conditioned on prompts only)
  memory_attention: vision (1, C, e, e), mem_feats (B*K, M, e, e), mem_tpos (B, K) index into
                    maskmem_tpos_enc, mem_valid (B, K), ptrs (B*P, C), ptr_pos (B, P) signed t / t_max,
                    ptr_valid (B, P) -> pix_feat (B, C, e, e); invalid slots (0.0) change nothing
  decode:           pix_feat (B, C, e, e), feat_s0, feat_s1 (1 row), prompt tokens (B, N, C), dense
                    -> masks (B, 4, 4e, 4e), iou (B, 4), object score logit (B, 1), object pointers (B, 4, C)
                    (one per mask token, the no-object pointer already mixed in where the score is <= 0)
  encode_memory:    vision (1, C, e, e), low-res logits (B, 1, 4e, 4e), binarize (B, 1), score (B, 1)
                    -> (B, M, e, e), or with EdgeTAM's perceiver (B, L + G*G, M) tokens (then mem_feats is
                    (B*K, L + G*G, M))
  downsample_mask:  binary mask (1, 1, S, S) -> (1, 1, 4e, 4e) (a mask prompt's decoder input)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.config import HIERA_TINY, VIDEO_TINY, Sam2Config, Sam2VideoConfig
from sam2edge.model.image_encoder import sine_position_encoding
from sam2edge.model.layers import MLP, Rewrites
from sam2edge.model.memory_attention import MemoryAttention
from sam2edge.model.memory_encoder import MemoryEncoder
from sam2edge.model.perceiver import build_perceiver
from sam2edge.model.sam2 import Sam2ImageModel

KEY_REMOVED = -1e4  # additive logit bias of an empty memory slot (exp underflows to exactly 0)


def sine_freqs(dim: int) -> torch.Tensor:
    """Upstream ``get_1d_sine_pe``'s divisors 10000^(2 floor(i/2) / (dim/2)), (dim/2,) fp32, computed as upstream."""
    half = dim // 2
    i = torch.arange(half, dtype=torch.float32)
    return 10000 ** (2 * torch.div(i, 2, rounding_mode="floor") / half)


def sine_1d(pos: torch.Tensor, dim: int, dim_t: torch.Tensor | None = None) -> torch.Tensor:
    """Upstream ``get_1d_sine_pe``: positions (..., N) -> (..., N, dim) = [sin, cos](pos / 10000^(2i/dim)).

    ``dim_t``: ``sine_freqs(dim)`` baked as a buffer (a graph then holds a constant, not arange / floor_div)."""
    dim_t = sine_freqs(dim).to(pos.device) if dim_t is None else dim_t.float()
    x = pos.float().unsqueeze(-1) / dim_t  # fp32 even in an fp16 graph (frequencies up to 10000)
    return torch.cat([x.sin(), x.cos()], dim=-1).to(pos.dtype)


def repeat_cols(x: torch.Tensor, n: int) -> torch.Tensor:
    """(R, 1) -> (R, n), every column a copy, as an outer product with ones: exact, and converters keep it a
    matmul (``expand`` and ``x * ones`` become BROADCAST_TO, which GPU delegates reject)."""
    return x @ x.new_ones(1, n)


def repeat_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """(1, N) -> (n, N), every row a copy (see ``repeat_cols``)."""
    return x.new_ones(n, 1) @ x


class Sam2VideoModel(Sam2ImageModel):
    def __init__(self, cfg: Sam2Config, vcfg: Sam2VideoConfig, rw: Rewrites) -> None:
        super().__init__(cfg, rw)
        d, m = cfg.d_model, vcfg.mem_dim
        self.vcfg = vcfg
        self.memory_attention = MemoryAttention(cfg, vcfg, rw)
        self.memory_encoder = MemoryEncoder(cfg, vcfg, rw)
        self.maskmem_tpos_enc = nn.Parameter(torch.zeros(vcfg.num_maskmem, 1, 1, m))
        self.no_mem_pos_enc = nn.Parameter(torch.zeros(1, 1, d))  # unused by SAM 2.1 (no_mem_embed is added)
        self.no_obj_ptr = nn.Parameter(torch.zeros(1, d))
        if vcfg.no_obj_embed_spatial:
            self.no_obj_embed_spatial = nn.Parameter(torch.zeros(1, m))
        self.obj_ptr_proj = MLP(d, d, d, 3)
        if vcfg.ptr_tpos_enc:
            self.obj_ptr_tpos_proj = nn.Linear(d, m)
        self.mask_downsample = nn.Conv2d(1, 1, kernel_size=4, stride=4)
        e = cfg.image_embedding_size
        curr_pos = sine_position_encoding(d, e, e).reshape(1, d, e * e).transpose(1, 2)  # (1, HW, C)
        mem_pos = sine_position_encoding(m, e, e).reshape(1, m, e * e).transpose(1, 2)  # (1, HW, M)
        self.spatial_perceiver = None
        if vcfg.perceiver_layers:
            self.spatial_perceiver = build_perceiver(vcfg, e, rw)
            mem_pos = self.spatial_perceiver.out_pos.unsqueeze(0)  # (1, L + G*G, M): a memory frame's tokens
        self.register_buffer("curr_pos", curr_pos.contiguous(), persistent=False)
        self.register_buffer("ptr_freqs", sine_freqs(d), persistent=False)  # (C/2,) pointer temporal encoding
        self.register_buffer("tpos_index", torch.arange(vcfg.num_maskmem).float(), persistent=False)  # (T,)
        self.register_buffer("mem_pos", mem_pos.contiguous(), persistent=False)

    def encode_frame(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(1, 3, S, S) -> (vision (1, C, e, e) without no_mem_embed, feat_s0, feat_s1)."""
        fpn0, fpn1, fpn2 = self.image_encoder(image)
        return fpn2, self.sam_mask_decoder.conv_s0(fpn0), self.sam_mask_decoder.conv_s1(fpn1)

    def no_memory(self, vision: torch.Tensor) -> torch.Tensor:
        return vision + self.no_mem_embed.reshape(1, -1, 1, 1)

    def _memory_tokens(
        self, mem_feats: torch.Tensor, mem_tpos: torch.Tensor, ptrs: torch.Tensor, ptr_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Memory tokens and their position encodings, both (B, K*N + P*C/M, M), slot-major per object (N = HW,
        or the perceiver's L + G*G tokens of a memory frame); B = mem_tpos.shape[0] objects, object b's slots
        are rows b*K .. b*K + K - 1 of mem_feats and b*P .. b*P + P - 1 of ptrs."""
        B, K = mem_tpos.shape
        P, C = ptrs.shape[0] // B, ptrs.shape[1]
        M, T = self.vcfg.mem_dim, self.vcfg.num_maskmem
        if self.spatial_perceiver is None:
            spatial = mem_feats.reshape(B * K, M, -1).transpose(1, 2)  # (B*K, HW, M)
        else:
            spatial = mem_feats  # (B*K, L + G*G, M): already tokens
        N = spatial.shape[1]
        idx = self.tpos_index.to(mem_tpos.dtype).reshape(1, T)
        onehot = torch.relu(1.0 - (mem_tpos.reshape(B * K, 1) - idx).abs())  # (B*K, T): exact for integer t_pos
        tpos = onehot @ self.maskmem_tpos_enc.reshape(T, M)  # (B*K, M)
        spatial_pos = self.mem_pos + tpos.reshape(B * K, 1, M)  # (B*K, N, M)
        n = C // M  # tokens per pointer
        ptr_tokens = ptrs.reshape(B, P * n, M)  # (B, P*n, M): pointer p's n tokens contiguous
        if self.vcfg.ptr_tpos_enc:
            ptr_pe = self.obj_ptr_tpos_proj(sine_1d(ptr_pos.reshape(B * P), C, self.ptr_freqs))  # (B*P, M)
            ptr_pe = repeat_rows(ptr_pe.reshape(1, B * P * M), n).reshape(n, B * P, M).transpose(0, 1)  # (B*P, n, M)
            ptr_pe = ptr_pe.reshape(B, P * n, M)  # pointer p's n tokens contiguous
        else:  # upstream add_tpos_enc_to_obj_ptrs=False: pointers carry a zero position (ptr_pos is unused)
            ptr_pe = torch.zeros_like(ptr_tokens)
        memory = torch.cat([spatial.reshape(B, K * N, M), ptr_tokens], dim=1)
        memory_pos = torch.cat([spatial_pos.reshape(B, K * N, M), ptr_pe], dim=1)
        return memory, memory_pos

    def memory_attention_step(
        self,
        vision: torch.Tensor,
        mem_feats: torch.Tensor,
        mem_tpos: torch.Tensor,
        mem_valid: torch.Tensor,
        ptrs: torch.Tensor,
        ptr_pos: torch.Tensor,
        ptr_valid: torch.Tensor,
        rope: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """The current frame's features conditioned on each object's memory bank: -> pix_feat (B, C, e, e).

        B objects = mem_tpos.shape[0] (each its own slots and validity; see ``_memory_tokens``); vision
        (1, C, e, e) is the frame every object shares, or (B, C, e, e). B = 1 is the single-object layout.
        ``rope``: ``MemoryAttention.tables()`` given as inputs (exported graphs)."""
        Bv, C, e, _ = vision.shape
        B, K = mem_tpos.shape
        P, HW = ptrs.shape[0] // B, e * e
        N = HW if self.spatial_perceiver is None else mem_feats.shape[1]  # tokens per memory frame
        n = C // self.vcfg.mem_dim
        memory, memory_pos = self._memory_tokens(mem_feats, mem_tpos, ptrs, ptr_pos)
        mem_bias = repeat_cols(mem_valid.reshape(B * K, 1), N).reshape(B, K * N)  # (B, K*N)
        ptr_bias = repeat_cols(ptr_valid.reshape(B * P, 1), n).reshape(B, P * n)  # (B, P*n)
        key_bias = (torch.cat([mem_bias, ptr_bias], dim=1) - 1.0) * -KEY_REMOVED  # (B, Nk): 0 or -1e4
        curr = vision.reshape(Bv, C, HW).transpose(1, 2)  # (Bv, HW, C): Bv = 1 < B, layer 0 shares its first half
        out = self.memory_attention(curr, self.curr_pos, memory, memory_pos, K, key_bias, rope)  # (B, HW, C)
        return out.transpose(1, 2).reshape(B, C, e, e)

    def decode_video(
        self,
        pix_feat: torch.Tensor,
        feat_s0: torch.Tensor,
        feat_s1: torch.Tensor,
        sparse: torch.Tensor,
        dense: torch.Tensor,
        sparse_valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> masks (1, 4, 4e, 4e), iou (1, 4), score (1, 1), object pointers (1, 4, C) per mask token.

        sparse_valid (1, N): 1.0 used / 0.0 ignored prompt slot (fixed-slot graphs); None = all used."""
        pe = self.sam_prompt_encoder.image_pe
        dec = self.sam_mask_decoder
        masks, iou, obj, tokens = dec.forward_tokens(pix_feat, pe, sparse, dense, feat_s0, feat_s1, sparse_valid)
        present = (obj > 0).to(tokens.dtype).reshape(-1, 1, 1)  # (1, 1, 1)
        ptrs = present * self.obj_ptr_proj(tokens) + (1.0 - present) * self.no_obj_ptr.reshape(1, 1, -1)
        return masks, iou, obj, ptrs

    def encode_memory(
        self,
        vision: torch.Tensor,
        low_res: torch.Tensor,
        binarize: torch.Tensor,
        score: torch.Tensor,
        latents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Memory of one frame: low-res mask logits upsampled to S, binarised (point prompts) or
        sigmoid, * scale + bias, fused with vision; no_obj_embed_spatial added where score <= 0 (SAM 2.1);
        EdgeTAM: then compressed by the perceiver (``latents``: its latents as an input, see
        ``PerceiverResampler.forward``). Batched over objects (B, ...) -> (B, M, e, e) or (B, N, M)."""
        s = self.cfg.image_size
        hi = F.interpolate(low_res, size=(s, s), mode="bilinear", align_corners=False)  # (1, 1, S, S)
        b = binarize.reshape(-1, 1, 1, 1)
        mask = b * (hi > 0).to(hi.dtype) + (1.0 - b) * torch.sigmoid(hi)
        mask = mask * self.vcfg.sigmoid_scale + self.vcfg.sigmoid_bias
        feats = self.memory_encoder(vision, mask)  # (B, M, e, e)
        if self.vcfg.no_obj_embed_spatial:
            absent = 1.0 - (score > 0).to(feats.dtype).reshape(-1, 1, 1, 1)
            feats = feats + absent * self.no_obj_embed_spatial.reshape(1, -1, 1, 1)
        if self.spatial_perceiver is not None:
            return self.spatial_perceiver(feats, latents)  # (B, L + G*G, M)
        return feats

    def downsample_mask(self, mask: torch.Tensor) -> torch.Tensor:
        return self.mask_downsample(mask)


def build_sam2_video(
    cfg: Sam2Config = HIERA_TINY, vcfg: Sam2VideoConfig = VIDEO_TINY, rewrites: Rewrites | None = None
) -> Sam2VideoModel:
    """Build the video model in eval mode (weights uninitialised until loaded)."""
    if cfg.d_model % vcfg.mem_dim:
        raise ValueError(f"d_model {cfg.d_model} is not a multiple of mem_dim {vcfg.mem_dim}")
    if not math.log2(vcfg.mask_stride).is_integer():
        raise ValueError(f"mask_stride {vcfg.mask_stride} is not a power of 2")
    return Sam2VideoModel(cfg, vcfg, rewrites or Rewrites()).eval()
