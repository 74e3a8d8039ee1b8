"""Upstream ``SAM2VideoPredictor`` as a CPU fp32 oracle, and the drifting-window clip.

* Upstream stores memories as bfloat16 and then fails on CPU (NOTES, Measured 2026-11-30): the module
  name ``torch`` inside ``sam2.sam2_video_predictor`` is replaced by a proxy whose ``bfloat16`` is
  ``torch.float32``; nothing else changes.
* Random weights make the object-score head say "no object" everywhere: +10 on its last bias.
* test-small: upstream's ``SAM2Base`` hard-codes the decoder widths, so the predictor is built from
  modules and its prompt encoder / mask decoder are replaced by ones built from the ``Sam2Config``.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from sam2edge.config import Sam2Config, Sam2VideoConfig
from tests.oracles import perturb_

OBJ_SCORE_LIFT = 10.0


class _Fp32Torch(types.ModuleType):
    """``torch`` with ``bfloat16`` meaning float32 (only where upstream's predictor casts memories)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return torch.float32 if name == "bfloat16" else getattr(torch, name)


def patch_bfloat16() -> None:
    import sam2.sam2_video_predictor as svp

    if not isinstance(svp.torch, _Fp32Torch):
        svp.torch = _Fp32Torch()


PREDICTOR_FLAGS = dict(
    num_maskmem=7,
    sigmoid_scale_for_mem_enc=20.0,
    sigmoid_bias_for_mem_enc=-10.0,
    use_mask_input_as_output_without_sam=True,
    directly_add_no_mem_embed=True,
    no_obj_embed_spatial=True,
    use_high_res_features_in_sam=True,
    multimask_output_in_sam=True,
    iou_prediction_use_sigmoid=True,
    use_obj_ptrs_in_encoder=True,
    add_tpos_enc_to_obj_ptrs=True,
    proj_tpos_enc_in_obj_ptrs=True,
    use_signed_tpos_enc_to_obj_ptrs=True,
    only_obj_ptrs_in_the_past_for_eval=True,
    pred_obj_scores=True,
    pred_obj_scores_mlp=True,
    fixed_no_obj_ptr=True,
    multimask_output_for_tracking=True,
    use_multimask_token_for_obj_ptr=True,
    multimask_min_pt_num=0,
    multimask_max_pt_num=1,
    use_mlp_for_obj_ptr_proj=True,
    binarize_mask_from_pts_for_mem_enc=True,
    fill_hole_area=8,
    sam_mask_decoder_extra_args=dict(
        dynamic_multimask_via_stability=True,
        dynamic_multimask_stability_delta=0.05,
        dynamic_multimask_stability_thresh=0.98,
    ),
)


def _memory_modules(cfg: Sam2Config, vcfg: Sam2VideoConfig):
    from sam2.modeling.memory_attention import MemoryAttention, MemoryAttentionLayer
    from sam2.modeling.memory_encoder import CXBlock, Fuser, MaskDownSampler, MemoryEncoder
    from sam2.modeling.position_encoding import PositionEmbeddingSine
    from sam2.modeling.sam.transformer import RoPEAttention

    d, e = cfg.d_model, cfg.image_embedding_size
    rope = dict(rope_theta=vcfg.rope_theta, feat_sizes=[e, e], embedding_dim=d, num_heads=vcfg.attn_heads)
    layer = MemoryAttentionLayer(
        activation="relu",
        cross_attention=RoPEAttention(**rope, rope_k_repeat=True, dropout=0.1, kv_in_dim=vcfg.mem_dim),
        d_model=d,
        dim_feedforward=vcfg.attn_mlp_dim,
        dropout=0.1,
        pos_enc_at_attn=False,
        self_attention=RoPEAttention(**rope, dropout=0.1),
        pos_enc_at_cross_attn_keys=True,
        pos_enc_at_cross_attn_queries=False,
    )
    attention = MemoryAttention(d_model=d, pos_enc_at_input=True, layer=layer, num_layers=vcfg.attn_layers)
    encoder = MemoryEncoder(
        out_dim=vcfg.mem_dim,
        mask_downsampler=MaskDownSampler(embed_dim=d, kernel_size=3, stride=2, padding=1),
        fuser=Fuser(CXBlock(dim=d, kernel_size=vcfg.fuser_kernel, padding=vcfg.fuser_kernel // 2), vcfg.fuser_layers),
        position_encoding=PositionEmbeddingSine(num_pos_feats=vcfg.mem_dim, normalize=True, temperature=10000),
        in_dim=d,
    )
    return attention, encoder


def upstream_video_predictor(cfg: Sam2Config, vcfg: Sam2VideoConfig, seed: int = 0, official_yaml: bool | str = False):
    """Upstream SAM2VideoPredictor (eval, CPU, fp32 memories), perturbed weights, object score lifted.

    ``official_yaml``: True (sam2.1_hiera_t.yaml) or a file name under sam2/configs/sam2.1/ (``config.SIZES``):
    the full-size model built by upstream's own ``build_sam2_video_predictor``; False: built from ``cfg`` / ``vcfg``.
    """
    from sam2.sam2_video_predictor import SAM2VideoPredictor

    from sam2edge.checks.fidelity.upstream import UpstreamImagePath

    patch_bfloat16()
    torch.manual_seed(seed)
    if official_yaml:
        from sam2.build_sam import build_sam2_video_predictor

        yaml = "sam2.1_hiera_t.yaml" if official_yaml is True else official_yaml
        model = build_sam2_video_predictor(f"configs/sam2.1/{yaml}", ckpt_path=None, device="cpu")
    else:
        image = UpstreamImagePath(cfg)
        attention, encoder = _memory_modules(cfg, vcfg)
        model = SAM2VideoPredictor(
            image_encoder=image.image_encoder,
            memory_attention=attention,
            memory_encoder=encoder,
            image_size=cfg.image_size,
            **PREDICTOR_FLAGS,
        )
        model.sam_prompt_encoder, model.sam_mask_decoder = image.sam_prompt_encoder, image.sam_mask_decoder
    model = perturb_(model.eval(), seed + 4000)
    with torch.no_grad():
        model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.add_(OBJ_SCORE_LIFT)
    return model


def drifting_clip(folder: Path, frames: int, size: tuple[int, int], step: int = 9) -> list[np.ndarray]:
    """A window (W, H) drifting right and down across skimage's astronaut; JPEG frames 00000.jpg, ..."""
    from skimage import data

    photo = data.astronaut()  # 512 x 512 RGB
    w, h = size
    out = []
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(frames):
        x0, y0 = 20 + step * i, 10 + (step * i) // 2
        crop = np.ascontiguousarray(photo[y0 : y0 + h, x0 : x0 + w])
        assert crop.shape[:2] == (h, w), f"window {w}x{h} leaves the photo at frame {i}; use a smaller step"
        Image.fromarray(crop).save(folder / f"{i:05d}.jpg", quality=95)
        out.append(crop)
    return out
