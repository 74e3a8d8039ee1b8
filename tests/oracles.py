"""Upstream oracles for parity tests: Meta's ``sam2`` modules and transformers' ``Sam2Model``.

Both are built from a ``Sam2Config`` so that the small test config and Hiera-Tiny use the
same code. Random weights: upstream init, then every floating tensor perturbed by
0.02 * randn so that no branch is trivially zero (NOTES).
"""

from __future__ import annotations

import torch
from torch import nn

from sam2edge.config import Sam2Config


def perturb_(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.add_(0.02 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return module


class MetaImagePath(nn.Module):
    """Upstream modules with SAM2Base's image-path names (image_encoder, sam_prompt_encoder, ...)."""

    def __init__(self, cfg: Sam2Config) -> None:
        super().__init__()
        from sam2.modeling.backbones.hieradet import Hiera
        from sam2.modeling.backbones.image_encoder import FpnNeck, ImageEncoder
        from sam2.modeling.position_encoding import PositionEmbeddingSine
        from sam2.modeling.sam.mask_decoder import MaskDecoder
        from sam2.modeling.sam.prompt_encoder import PromptEncoder
        from sam2.modeling.sam.transformer import TwoWayTransformer

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
        out = self.image_encoder(image)
        fpn = list(out["backbone_fpn"])
        res = {f"fpn{i}": f for i, f in enumerate(fpn)}
        res["pos0"], res["pos1"], res["pos2"] = out["vision_pos_enc"]
        res["feat_s0"] = self.sam_mask_decoder.conv_s0(fpn[0])
        res["feat_s1"] = self.sam_mask_decoder.conv_s1(fpn[1])
        res["image_embed"] = fpn[2] + self.no_mem_embed.reshape(1, -1, 1, 1)
        return res

    @torch.no_grad()
    def decode(self, feats, coords, labels, mask_input=None, multimask_output=True):
        """As SAM2ImagePredictor._predict, from model-input-pixel prompts (boxes already as labels 2/3)."""
        points = (coords, labels) if coords is not None else None
        sparse, dense = self.sam_prompt_encoder(points=points, boxes=None, masks=mask_input)
        masks, iou, _, obj = self.sam_mask_decoder(
            image_embeddings=feats["image_embed"],
            image_pe=self.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=False,
            high_res_features=[feats["feat_s0"], feats["feat_s1"]],
        )
        return {"sparse": sparse, "dense": dense, "masks": masks, "iou": iou, "obj": obj}


def meta_image_path(cfg: Sam2Config, seed: int = 0) -> MetaImagePath:
    torch.manual_seed(seed)
    return perturb_(MetaImagePath(cfg), seed + 1000)


def hf_sam2_model(seed: int = 0):
    """transformers ``Sam2Model`` (Hiera-Tiny defaults) with perturbed random weights, eval mode."""
    from transformers import Sam2Config as HFConfig
    from transformers import Sam2Model

    torch.manual_seed(seed)
    model = Sam2Model(HFConfig()).eval()
    perturb_(model, seed + 2000)
    # the prompt encoder's Gaussian matrix is a buffer tied to shared_image_embedding's; keep the tie
    model.prompt_encoder.shared_embedding.positional_embedding.copy_(model.shared_image_embedding.positional_embedding)
    return model


class TorchvisionStandIn:
    """Registers a minimal ``torchvision.transforms`` (ToTensor, Resize, Normalize) in sys.modules.

    Upstream's SAM2ImagePredictor imports only these three; torchvision itself cannot be installed
    beside the CPU torch (NOTES). Resize is exact only when the image is already at the target size,
    so predictor parity tests use 1024x1024 crops.
    """

    @staticmethod
    def install() -> None:
        import sys
        import types

        import numpy as np
        import torch.nn.functional as F

        class ToTensor:
            def __call__(self, pic):
                return torch.from_numpy(np.array(pic, dtype=np.uint8)).permute(2, 0, 1).float().div(255.0)

        class Resize(nn.Module):
            def __init__(self, size: tuple[int, int]) -> None:
                super().__init__()
                self.size = (int(size[0]), int(size[1]))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if x.shape[-2] == self.size[0] and x.shape[-1] == self.size[1]:
                    return x
                y = F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", align_corners=False, antialias=True)
                return y.squeeze(0)

        class Normalize(nn.Module):
            def __init__(self, mean: list[float], std: list[float]) -> None:
                super().__init__()
                self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
                self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return (x - self.mean) / self.std

        tv = types.ModuleType("torchvision")
        tr = types.ModuleType("torchvision.transforms")
        tr.ToTensor, tr.Resize, tr.Normalize = ToTensor, Resize, Normalize
        tv.transforms = tr
        sys.modules.setdefault("torchvision", tv)
        sys.modules.setdefault("torchvision.transforms", tr)


def meta_sam2base(seed: int = 0):
    """Upstream's full SAM2Base (video parts included) from the official Hiera-Tiny config, perturbed."""
    from sam2.build_sam import build_sam2 as upstream_build

    torch.manual_seed(seed)
    model = upstream_build("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu", mode="eval")
    return perturb_(model, seed + 3000)
