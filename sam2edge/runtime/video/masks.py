"""Per-frame mask answers of the video predictor, on the host: upstream's dynamic single mask and hole filling.

Both are pure numpy (scipy for the connected components), shared with the browser tracker's tests.
"""

from __future__ import annotations

import numpy as np

from sam2edge.config import Sam2Config


def stable_single_mask(masks: np.ndarray, iou: np.ndarray, cfg: Sam2Config) -> np.ndarray:
    """SAM 2.1 dynamic single mask: token 0 if stable, else the best multimask candidate (1x1x4ex4e)."""
    single = masks[:, 0:1]
    area_i = np.float32((single > cfg.stability_delta).sum())  # fp32 division, as upstream
    area_u = np.float32((single > -cfg.stability_delta).sum())
    stability = area_i / area_u if area_u > 0 else np.float32(1.0)
    if stability >= cfg.stability_thresh:
        return single
    k = 1 + int(np.argmax(iou[0, 1:]))
    return masks[:, k : k + 1]


def fill_holes(masks: np.ndarray, max_area: int) -> np.ndarray:
    """Upstream ``fill_holes_in_mask_scores``: background (logit <= 0) components of 8-connected area
    <= max_area get the logit 0.1. masks (N, 1, h, w) -> same shape."""
    from scipy import ndimage

    out = masks.copy()
    for i in range(masks.shape[0]):
        labels, _ = ndimage.label(masks[i, 0] <= 0, structure=np.ones((3, 3), bool))
        areas = np.bincount(labels.ravel())
        hole = (labels > 0) & (areas[labels] <= max_area)
        out[i, 0][hole] = np.float32(0.1)
    return out
