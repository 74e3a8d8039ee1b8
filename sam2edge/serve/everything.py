"""``POST /api/images/ID/everything``: segment everything in a served photo, on the server.

Offered (``/api/info`` ``everything``) when the server's backend decodes B prompts per call: eager weights, or a
bundle whose card lists a ``decoder-batched`` graph (``runtime.backends.has_batched_decoder``). The photo's
features, computed when it was opened, are reused (no second encoder run). Answer: the photo with each mask in
its own colour (PNG, ``runtime.overlay.render_masks``), the mask count in the ``X-Masks`` header.
"""

from __future__ import annotations

import io

import numpy as np

from sam2edge.runtime.backends import Backend, Features, has_batched_decoder

POINTS_PER_SIDE = 32  # upstream's default grid: 1024 prompts, 16 calls of a B = 64 batched decoder
MAX_POINTS_PER_SIDE = 64


def points_per_side(query: dict) -> int:
    """``?points_per_side=N`` (1..MAX_POINTS_PER_SIDE), else POINTS_PER_SIDE; ValueError names the range."""
    raw = (query.get("points_per_side") or [str(POINTS_PER_SIDE)])[0]
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_POINTS_PER_SIDE:
        raise ValueError(f"points_per_side must be a whole number in 1..{MAX_POINTS_PER_SIDE}")
    return int(raw)


def segment_everything(backend: Backend, rgb: np.ndarray, features: Features, side: int) -> tuple[bytes, int]:
    """HxWx3 uint8 photo + its features -> (overlay PNG bytes, mask count), upstream's default filters."""
    from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.overlay import render_masks
    from sam2edge.runtime.predictor import Sam2Predictor

    if not has_batched_decoder(backend):
        raise ValueError("this bundle has no batched decoder; re-export it to segment everything")
    records = Sam2AutomaticMaskGenerator(Sam2Predictor(backend), points_per_side=side).generate(rgb, features)
    buf = io.BytesIO()
    render_masks(rgb, [r["segmentation"] for r in records]).save(buf, format="PNG")
    return buf.getvalue(), len(records)
