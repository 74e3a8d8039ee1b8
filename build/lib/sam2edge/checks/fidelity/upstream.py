"""Upstream eager reference: Meta's ``sam2`` modules for the image path, loaded with sam2edge weights.

Used by ``sam2edge bench --upstream`` as the speed baseline. The modules are built from a
``Sam2Config`` exactly as upstream's ``configs/sam2.1/sam2.1_hiera_t.yaml`` builds them, and
sam2edge's state dict loads by name (sam2edge names = upstream ``SAM2Base`` names for the
image path). The ``sam2`` package is an optional dependency (installed for tests).

Frames: ``encode`` takes 1x3xSxS ImageNet-normalised RGB; ``decode`` takes upstream's prompt
layout in model-input pixels (coords 1xNx2 (X, Y), labels 1xN: 1 fg, 0 bg, 2/3 box corners),
as ``SAM2ImagePredictor._predict`` passes them; the prompt encoder appends the pad point.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.errors import UserError


def upstream_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("sam2")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class UpstreamImagePath(nn.Module):
    """Upstream modules with SAM2Base's image-path names (image_encoder, sam_prompt_encoder, ...)."""

    def __init__(self, cfg: Sam2Config) -> None:
        super().__init__()
        try:
            from sam2.modeling.backbones.hieradet import Hiera
            from sam2.modeling.backbones.image_encoder import FpnNeck, ImageEncoder
            from sam2.modeling.position_encoding import PositionEmbeddingSine
            from sam2.modeling.sam.mask_decoder import MaskDecoder
            from sam2.modeling.sam.prompt_encoder import PromptEncoder
            from sam2.modeling.sam.transformer import TwoWayTransformer
        except ImportError:
            raise UserError(
                "upstream eager needs Meta's `sam2` package: "
                "SAM2_BUILD_CUDA=0 pip install --no-deps --no-build-isolation sam2==1.1.0 (plus iopath, hydra-core)"
            ) from None
        trunk = Hiera(
            embed_dim=cfg.embed_dim,
            num_heads=cfg.num_heads,
            stages=cfg.stages,
            global_att_blocks=cfg.global_att_blocks,
            window_pos_embed_bkg_spatial_size=cfg.window_pos_embed_bkg,
            window_spec=cfg.window_spec,
        )
        neck = FpnNeck(
            position_encoding=PositionEmbeddingSine(num_pos_feats=cfg.d_model, normalize=True, temperature=10000),
            d_model=cfg.d_model,
            backbone_channel_list=list(reversed(cfg.stage_dims)),
            fpn_top_down_levels=list(cfg.fpn_top_down_levels),
            fpn_interp_model="nearest",
        )
        self.image_encoder = ImageEncoder(trunk=trunk, neck=neck, scalp=cfg.scalp)
        e = cfg.image_embedding_size
        self.sam_prompt_encoder = PromptEncoder(
            embed_dim=cfg.d_model,
            image_embedding_size=(e, e),
            input_image_size=(cfg.image_size, cfg.image_size),
            mask_in_chans=cfg.mask_in_chans,
        )
        self.sam_mask_decoder = MaskDecoder(
            num_multimask_outputs=cfg.num_multimask_outputs,
            transformer=TwoWayTransformer(
                depth=cfg.decoder_depth,
                embedding_dim=cfg.d_model,
                mlp_dim=cfg.decoder_mlp_dim,
                num_heads=cfg.decoder_heads,
            ),
            transformer_dim=cfg.d_model,
            iou_head_depth=cfg.iou_head_depth,
            iou_head_hidden_dim=cfg.iou_head_hidden_dim,
            use_high_res_features=True,
            iou_prediction_use_sigmoid=True,
            pred_obj_scores=True,
            pred_obj_scores_mlp=True,
            use_multimask_token_for_obj_ptr=True,
            dynamic_multimask_via_stability=True,
            dynamic_multimask_stability_delta=cfg.stability_delta,
            dynamic_multimask_stability_thresh=cfg.stability_thresh,
        )
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.eval()

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        """As SAM2ImagePredictor.set_image: forward_image + conv_s0/s1 + no_mem_embed."""
        fpn = list(self.image_encoder(image)["backbone_fpn"])
        return {
            "image_embed": fpn[2] + self.no_mem_embed.reshape(1, -1, 1, 1),
            "feat_s0": self.sam_mask_decoder.conv_s0(fpn[0]),
            "feat_s1": self.sam_mask_decoder.conv_s1(fpn[1]),
        }

    @torch.no_grad()
    def decode(self, feats: dict, coords: torch.Tensor, labels: torch.Tensor, multimask_output: bool = True):
        """As SAM2ImagePredictor._predict (prompt encoder + mask decoder): -> masks, iou, object score logits."""
        sparse, dense = self.sam_prompt_encoder(points=(coords, labels), boxes=None, masks=None)
        masks, iou, _, obj = self.sam_mask_decoder(
            image_embeddings=feats["image_embed"],
            image_pe=self.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=False,
            high_res_features=[feats["feat_s0"], feats["feat_s1"]],
        )
        return masks, iou, obj


def upstream_from_state_dict(sd: dict[str, torch.Tensor], cfg: Sam2Config) -> UpstreamImagePath:
    """Upstream image path holding sam2edge weights ``sd`` (every upstream parameter must be covered)."""
    model = UpstreamImagePath(cfg)
    missing, _ = model.load_state_dict(sd, strict=False)
    if missing:
        raise UserError(f"weights do not cover upstream's image path: {len(missing)} missing, e.g. {missing[:3]}")
    return model.eval()


class UpstreamRunner:
    """Upstream eager with the bench interface: numpy in, ``encode`` / ``decode`` like a backend."""

    name = "upstream-eager"

    def __init__(self, model: UpstreamImagePath, cfg: Sam2Config) -> None:
        self.model, self.cfg = model, cfg

    def encode(self, image: np.ndarray) -> dict[str, torch.Tensor]:
        return self.model.encode(torch.as_tensor(image, dtype=torch.float32))

    def decode(self, feats: dict, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None = None):
        """coords 1xNx2 / labels 1xN in sam2edge's layout (trailing pad point included, as the predictor passes)."""
        if labels.shape[1] and labels[0, -1] == -1:  # upstream's prompt encoder appends the pad point itself
            coords, labels = coords[:, :-1], labels[:, :-1]
        c = torch.as_tensor(np.ascontiguousarray(coords), dtype=torch.float32)
        return self.model.decode(feats, c, torch.as_tensor(np.ascontiguousarray(labels), dtype=torch.int32))
