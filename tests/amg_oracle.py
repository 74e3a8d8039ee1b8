"""Upstream ``SAM2AutomaticMaskGenerator`` as an oracle at any ``Sam2Config`` (test-small included).

* ``install_torchvision_ops()``: upstream imports ``torchvision.ops.boxes.batched_nms, box_area``;
  torchvision cannot be installed beside the CPU torch (NOTES), so a plain-Python reference stands in:
  the textbook greedy loop, one category at a time, written independently of sam2edge's vectorised NMS.
* ``UpstreamSam2ForPredictor``: the attributes ``SAM2ImagePredictor`` reads from a ``SAM2Base``
  (forward_image, _prepare_backbone_features, no_mem_embed, ...), over upstream's own image-path modules,
  so that the small test config runs through upstream's predictor and generator unchanged.
"""

from __future__ import annotations

import sys
import types

import torch
from oracles import TorchvisionStandIn
from torch import nn

from sam2edge.checks.fidelity.upstream import UpstreamImagePath
from sam2edge.config import Sam2Config


def reference_box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def reference_nms(boxes, scores, idxs, iou_threshold: float) -> torch.Tensor:
    """Brute force: visit boxes by decreasing score (ties by index); keep one unless a kept box of its
    category overlaps it with IoU > threshold. Returns kept indices by decreasing score."""
    b = [[float(v) for v in row] for row in boxes.tolist()]
    s, c = [float(v) for v in scores.tolist()], [int(v) for v in idxs.tolist()]
    order = sorted(range(len(b)), key=lambda i: (-s[i], i))
    kept: list[int] = []
    for i in order:
        ok = True
        for j in kept:
            if c[j] != c[i]:
                continue
            iw = min(b[i][2], b[j][2]) - max(b[i][0], b[j][0])
            ih = min(b[i][3], b[j][3]) - max(b[i][1], b[j][1])
            inter = max(iw, 0.0) * max(ih, 0.0)
            area_i = (b[i][2] - b[i][0]) * (b[i][3] - b[i][1])
            area_j = (b[j][2] - b[j][0]) * (b[j][3] - b[j][1])
            union = area_i + area_j - inter
            iou = inter / union if union > 0 else float("nan")
            if iou > iou_threshold:
                ok = False
                break
        if ok:
            kept.append(i)
    return torch.tensor(kept, dtype=torch.long)


def install_torchvision_ops(nms=reference_nms) -> None:
    """torchvision.transforms (oracles.TorchvisionStandIn) and torchvision.ops.boxes stand-ins; ``nms`` is the
    batched NMS (boxes, scores, idxs, iou_threshold) (the brute-force reference unless given, e.g. a fast one
    for benchmarks). The first call's choice stays (sys.modules.setdefault)."""
    TorchvisionStandIn.install()
    tv = sys.modules["torchvision"]
    ops = types.ModuleType("torchvision.ops")
    boxes = types.ModuleType("torchvision.ops.boxes")
    boxes.batched_nms = lambda b, s, i, iou_threshold: nms(b, s, i, iou_threshold)
    boxes.box_area = reference_box_area
    ops.boxes = boxes
    tv.ops = ops
    sys.modules.setdefault("torchvision.ops", ops)
    sys.modules.setdefault("torchvision.ops.boxes", boxes)


class UpstreamSam2ForPredictor(nn.Module):
    """Upstream image-path modules behind the SAM2Base attributes that SAM2ImagePredictor uses."""

    directly_add_no_mem_embed = True
    use_high_res_features_in_sam = True
    num_feature_levels = 3

    def __init__(self, path: UpstreamImagePath, cfg: Sam2Config) -> None:
        super().__init__()
        self.image_encoder = path.image_encoder
        self.sam_prompt_encoder = path.sam_prompt_encoder
        self.sam_mask_decoder = path.sam_mask_decoder
        self.no_mem_embed = path.no_mem_embed
        self.image_size = cfg.image_size
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.no_mem_embed.device

    def forward_image(self, img_batch: torch.Tensor):
        from sam2.modeling.sam2_base import SAM2Base

        return SAM2Base.forward_image(self, img_batch)

    def _prepare_backbone_features(self, backbone_out):
        from sam2.modeling.sam2_base import SAM2Base

        return SAM2Base._prepare_backbone_features(self, backbone_out)


def upstream_generator(path: UpstreamImagePath, cfg: Sam2Config, **kwargs):
    """Upstream's SAM2AutomaticMaskGenerator over ``path`` at ``cfg``'s resolution."""
    install_torchvision_ops()
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    gen = SAM2AutomaticMaskGenerator(UpstreamSam2ForPredictor(path, cfg), **kwargs)
    e = cfg.image_embedding_size
    gen.predictor._bb_feat_sizes = [(4 * e, 4 * e), (2 * e, 2 * e), (e, e)]  # upstream hard-codes 1024's
    return gen


def confident_(path):
    """Sharp mask logits and IoU predictions around 0.8 (see module docstring); same weights both sides."""
    with torch.no_grad():
        for mlp in path.sam_mask_decoder.output_hypernetworks_mlps:
            mlp.layers[-1].weight.mul_(3000.0)
            mlp.layers[-1].bias.mul_(3000.0)
        path.sam_mask_decoder.iou_prediction_head.layers[-1].bias.add_(1.5)
    return path
