"""Numeric fidelity: array comparisons and end-to-end mask IoU over clicks on real photos.

Photos come from scikit-image's wheel (no download; ``sam2edge.checks.photos``). ``click_set`` is deterministic: single
positive clicks, positive+negative pairs, boxes, and box+point prompts, spread over five photos.
Masks are compared at the candidate the reference pipeline would show (its argmax IoU), so a
near-tie in predicted IoU cannot flip the comparison; how often both pipelines pick the same
candidate is reported separately as ``selection_agreement``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from sam2edge.checks.photos import PHOTOS, photo

LOWEST_CLICKS = 5  # end_to_end names this many lowest-IoU prompts (photo, kind, IoU): what a refusal failed on
NEAR_THRESHOLD = 0.1  # |low-res logit| under this: a pixel any rounding may flip (the mask threshold is 0)


@dataclass
class Prompt:
    photo: str
    point_coords: np.ndarray | None = None  # Nx2 (X, Y) original pixels
    point_labels: np.ndarray | None = None  # N
    box: np.ndarray | None = None  # (4,) XYXY original pixels
    multimask: bool = True
    kind: str = field(default="point")


def click_set(n: int = 40, seed: int = 0, photos: tuple[str, ...] = PHOTOS) -> list[Prompt]:
    """n prompts cycling through kinds (point, point+negative, box, box+point) and photos."""
    rng = np.random.default_rng(seed)
    sizes = {p: photo(p).shape[:2] for p in photos}
    out = []
    for i in range(n):
        name = photos[i % len(photos)]
        h, w = sizes[name]
        kind = ("point", "points", "box", "box+point")[(i // len(photos)) % 4]
        xy = rng.uniform([0.1 * w, 0.1 * h], [0.9 * w, 0.9 * h], size=(2, 2)).astype(np.float32)
        if kind == "point":
            out.append(Prompt(name, xy[:1], np.array([1]), kind=kind))
        elif kind == "points":
            out.append(Prompt(name, xy, np.array([1, 0]), multimask=False, kind=kind))
        else:
            c = xy[0]
            half = rng.uniform([0.08 * w, 0.08 * h], [0.3 * w, 0.3 * h]).astype(np.float32)
            box = np.concatenate([np.maximum(c - half, 0), np.minimum(c + half, [w - 1, h - 1])])
            if kind == "box":
                out.append(Prompt(name, None, None, box, multimask=False, kind=kind))
            else:
                out.append(Prompt(name, c[None], np.array([1]), box, multimask=False, kind=kind))
    return out


def compare(test: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """cosine, Pearson correlation, max-abs and max-abs relative to max|ref|, and how many ``test`` values
    are NaN / inf (``nonfinite``: any makes every bar fail)."""
    a, b = np.asarray(test, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    diff = np.abs(a - b).max() if a.size else 0.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = float(a @ b / (na * nb)) if na and nb else float(na == nb)
    sa, sb = a.std(), b.std()
    corr = float(((a - a.mean()) @ (b - b.mean())) / (a.size * sa * sb)) if sa and sb else float(np.allclose(a, b))
    scale = np.abs(b).max() if b.size else 0.0
    return {
        "cosine": cos,
        "correlation": corr,
        "max_abs": float(diff),
        "max_rel": float(diff / scale) if scale else float(diff),
        "nonfinite": int(a.size - np.isfinite(a).sum()),
    }


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def predict_pairs(ref, test, prompts: list[Prompt]) -> Iterator[tuple[int, Prompt, tuple, tuple]]:
    """(index in ``prompts``, prompt, ref.predict(...), test.predict(...)) for each prompt, ``ref`` and ``test``
    predictors with the same API. The prompts run grouped by photo (stable: a photo's prompts keep their order;
    ``click_set`` cycles through its photos, so in its own order every prompt would change photo): each photo is
    encoded once per call."""
    current = None
    for i in sorted(range(len(prompts)), key=lambda i: prompts[i].photo):
        p = prompts[i]
        if p.photo != current:
            img = photo(p.photo)
            ref.set_image(img)
            test.set_image(img)
            current = p.photo
        kw = dict(point_coords=p.point_coords, point_labels=p.point_labels, box=p.box, multimask_output=p.multimask)
        yield i, p, ref.predict(**kw), test.predict(**kw)


def end_to_end(ref, test, prompts: list[Prompt], progress: Callable[[int, int], None] | None = None) -> dict:
    """Mask IoU of ``test`` vs ``ref`` predictors (same API) over ``prompts``, one encode per photo (the IoUs and
    indices in the order of ``prompts``). The lowest
    clicks carry what makes a reference mask fragile: its area in pixels (``ref_mask_px``: a few pixels flip
    the IoU of a tiny mask) and the share of its low-res logits within ``NEAR_THRESHOLD`` of 0
    (``ref_logits_near_0``: a mask decided by a near-flat logit map flips under any rounding)."""
    agree, score_diff, nonfinite = 0, 0.0, 0
    ious, fragile = [0.0] * len(prompts), [(0, 0.0)] * len(prompts)  # in the order of ``prompts``
    for done, (i, _, (rm, rs, rl), (tm, ts, tl)) in enumerate(predict_pairs(ref, test, prompts), 1):
        nonfinite += int(not (np.isfinite(ts).all() and np.isfinite(tl).all()))
        k = int(np.argmax(rs))
        agree += int(np.argmax(ts) == k)
        ious[i] = mask_iou(tm[k], rm[k])
        fragile[i] = (int(rm[k].sum()), float((np.abs(rl[k]) < NEAR_THRESHOLD).mean()))
        score_diff = max(score_diff, float(np.abs(ts - rs).max()))
        if progress:
            progress(done, len(prompts))
    lowest = [
        {
            "index": int(i),
            "photo": prompts[i].photo,
            "kind": prompts[i].kind,
            "iou": float(ious[i]),
            "ref_mask_px": fragile[i][0],
            "ref_logits_near_0": round(fragile[i][1], 4),
        }
        for i in np.argsort(ious, kind="stable")[:LOWEST_CLICKS]
    ]
    return {
        **iou_summary(ious, prompts, agree),
        "iou_score_max_abs_diff": score_diff,
        "nonfinite": nonfinite,
        "lowest_clicks": lowest,
    }


def iou_summary(ious: list[float], prompts: list, agree: int) -> dict:
    """Per-prompt mask IoUs (+ how many chose the same candidate) -> clicks, photos, median, worst, agreement."""
    arr = np.array(ious)
    return {
        "clicks": len(prompts),
        "photos": sorted({p.photo for p in prompts}),
        "iou_median": float(np.median(arr)),
        "iou_worst": float(arr.min()),
        "selection_agreement": agree / len(prompts),
    }
