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


def mask_colors(n: int, seed: int = 0) -> np.ndarray:
    """n distinct RGB colours (n x 3 uint8): hues spaced by the golden ratio, full saturation."""
    import colorsys

    hues = (seed * 0.17 + np.arange(n) * 0.6180339887) % 1.0
    return np.array([[round(255 * c) for c in colorsys.hsv_to_rgb(h, 0.85, 0.95)] for h in hues], np.uint8)


def render_masks(rgb: np.ndarray, masks: list[np.ndarray], alpha: float = 0.55) -> Image.Image:
    """HxWx3 uint8 photo + HxW bool masks -> RGB image, each mask its own colour; larger masks are drawn
    first so that smaller ones stay visible (upstream's ``show_anns`` order)."""
    out = rgb.astype(np.float32).copy()
    order = sorted(range(len(masks)), key=lambda i: -int(np.count_nonzero(masks[i])))
    colors = mask_colors(len(masks)).astype(np.float32)
    for rank, i in enumerate(order):
        m = np.asarray(masks[i], bool)
        out[m] = (1 - alpha) * out[m] + alpha * colors[rank]
    return Image.fromarray(out.clip(0, 255).astype(np.uint8))
