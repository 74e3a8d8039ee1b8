"""Video backends: the per-frame graphs of tracking, called on numpy arrays.

A backend supplies six calls (shapes: S = image_size, e = S/16, C = d_model, M = mem_dim,
K = memory slots, P = object-pointer slots, B objects of one frame, ``runtime.video.batch``); the host
(``memory_bank``, ``video_predictor``) does everything else (frame selection, object bookkeeping, mask
selection) in numpy:

  encode_frame(image 1x3xSxS)                        -> FrameFeatures(vision 1xCxexe, feat_s0, feat_s1)
  no_memory(vision)                                  -> pix_feat 1xCxexe (vision + no_mem_embed)
  memory_attention(vision, MemoryInputs of B objects) -> pix_feat BxCxexe
  decode(pix_feat Bx.., feats, coords BxNx2, labels BxN, mask_input Bx1x4ex4e | None)
                                                     -> VideoDecoded of B rows (all four mask tokens)
  encode_memory(vision, low_res Bx1x4ex4e, binarize (every row), score Bx1)
                                                     -> memory BxMxexe (EdgeTAM: BxNxM tokens)
  downsample_mask(mask 1x1xSxS)                      -> 1x1x4ex4e

plus the constant ``no_obj_ptr`` (1xC). ``EagerVideoBackend`` runs the PyTorch model in fp32; exported
graphs implement the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.model import UPSTREAM, Rewrites
from sam2edge.model.sam2_video import Sam2VideoModel, build_sam2_video


@dataclass
class FrameFeatures:
    vision: np.ndarray  # 1xCxexe raw lowest FPN level (no no_mem_embed)
    feat_s0: np.ndarray  # 1x(C/8)x4ex4e
    feat_s1: np.ndarray  # 1x(C/4)x2ex2e


@dataclass
class MemoryInputs:
    mem_feats: np.ndarray  # (B*K)xMxexe spatial memories (EdgeTAM: (B*K)xNxM tokens), slot-major, empty: zeros
    mem_tpos: np.ndarray  # BxK index into maskmem_tpos_enc (num_maskmem - t_pos - 1)
    mem_valid: np.ndarray  # BxK 1.0 filled / 0.0 empty
    ptrs: np.ndarray  # (B*P)xC object pointers (empty slots: zeros)
    ptr_pos: np.ndarray  # BxP signed temporal distance / t_max
    ptr_valid: np.ndarray  # BxP 1.0 filled / 0.0 empty


@dataclass
class VideoDecoded:
    masks: np.ndarray  # Bx4x4ex4e logits of every mask token (token 0 = single-mask output)
    iou: np.ndarray  # Bx4
    score: np.ndarray  # Bx1 object-score logit
    ptrs: np.ndarray  # Bx4xC object pointer per mask token, no-object pointer mixed in where score <= 0


class VideoBackend(Protocol):
    name: str
    cfg: Sam2Config
    vcfg: Sam2VideoConfig
    no_obj_ptr: np.ndarray

    def encode_frame(self, image: np.ndarray) -> FrameFeatures: ...

    def no_memory(self, vision: np.ndarray) -> np.ndarray: ...

    def memory_attention(self, vision: np.ndarray, mem: MemoryInputs) -> np.ndarray: ...

    def decode(
        self,
        pix_feat: np.ndarray,
        feats: FrameFeatures,
        coords: np.ndarray,
        labels: np.ndarray,
        mask_input: np.ndarray | None,
    ) -> VideoDecoded: ...

    def encode_memory(
        self, vision: np.ndarray, low_res: np.ndarray, binarize: bool, score: np.ndarray
    ) -> np.ndarray: ...

    def downsample_mask(self, mask: np.ndarray) -> np.ndarray: ...


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


class EagerVideoBackend:
    """The PyTorch video model in fp32; default rewrites = upstream's operations."""

    name = "eager"

    def __init__(self, model: Sam2VideoModel) -> None:
        self.model, self.cfg, self.vcfg = model.eval(), model.cfg, model.vcfg
        self.no_obj_ptr = model.no_obj_ptr.detach().numpy().copy()

    @classmethod
    def from_state_dict(
        cls, sd: dict, cfg: Sam2Config, vcfg: Sam2VideoConfig, rewrites: Rewrites = UPSTREAM
    ) -> EagerVideoBackend:
        model = build_sam2_video(cfg, vcfg, rewrites)
        model.load_state_dict(sd, strict=True)
        return cls(model)

    @torch.no_grad()
    def encode_frame(self, image: np.ndarray) -> FrameFeatures:
        vision, s0, s1 = self.model.encode_frame(_t(image))
        return FrameFeatures(vision.numpy(), s0.numpy(), s1.numpy())

    @torch.no_grad()
    def no_memory(self, vision: np.ndarray) -> np.ndarray:
        return self.model.no_memory(_t(vision)).numpy()

    @torch.no_grad()
    def memory_attention(self, vision: np.ndarray, mem: MemoryInputs) -> np.ndarray:
        args = (mem.mem_feats, mem.mem_tpos, mem.mem_valid, mem.ptrs, mem.ptr_pos, mem.ptr_valid)
        return self.model.memory_attention_step(_t(vision), *(_t(a) for a in args)).numpy()

    @torch.no_grad()
    def decode(
        self,
        pix_feat: np.ndarray,
        feats: FrameFeatures,
        coords: np.ndarray,
        labels: np.ndarray,
        mask_input: np.ndarray | None,
    ) -> VideoDecoded:
        pe = self.model.sam_prompt_encoder
        sparse = pe.embed_points(_t(coords), _t(labels))
        dense = pe.no_mask_dense if mask_input is None else pe.embed_mask(_t(mask_input))
        out = self.model.decode_video(_t(pix_feat), _t(feats.feat_s0), _t(feats.feat_s1), sparse, dense)
        return VideoDecoded(*(o.numpy() for o in out))

    @torch.no_grad()
    def encode_memory(self, vision: np.ndarray, low_res: np.ndarray, binarize: bool, score: np.ndarray) -> np.ndarray:
        b = torch.full((low_res.shape[0], 1), 1.0 if binarize else 0.0)
        return self.model.encode_memory(_t(vision), _t(low_res), b, _t(score)).numpy()

    @torch.no_grad()
    def downsample_mask(self, mask: np.ndarray) -> np.ndarray:
        return self.model.downsample_mask(_t(mask)).numpy()
