"""Rendering a mask over its photo, with the prompt drawn: what a person looks at."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

MASK_RGB = (30, 144, 255)


def render_overlay(
    rgb: np.ndarray,
    mask: np.ndarray,
    point_coords: np.ndarray | None = None,
    point_labels: np.ndarray | None = None,
    box: np.ndarray | None = None,
    alpha: float = 0.5,
) -> Image.Image:
    """HxWx3 uint8 photo + HxW bool mask -> RGB image: mask tinted, fg points green, bg red, box yellow."""
    out = rgb.astype(np.float32).copy()
    m = np.asarray(mask, bool)
    out[m] = (1 - alpha) * out[m] + alpha * np.array(MASK_RGB, np.float32)
    img = Image.fromarray(out.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    r = max(3, min(img.size) // 100)
    if box is not None:
        draw.rectangle([float(v) for v in box], outline=(255, 220, 0), width=max(2, r // 2))
    if point_coords is not None:
        for (x, y), lab in zip(np.asarray(point_coords).reshape(-1, 2), np.asarray(point_labels).reshape(-1)):
            color = (0, 220, 0) if lab == 1 else (230, 30, 30)
            draw.ellipse([x - r, y - r, x + r, y + r], fill=color, outline=(255, 255, 255), width=max(1, r // 3))
    return img
