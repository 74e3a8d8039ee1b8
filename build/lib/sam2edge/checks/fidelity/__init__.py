"""Fidelity: array metrics, end-to-end mask IoU on real photos, the bar table, and ``verify``."""

from sam2edge.checks.fidelity.bars import BARS, bars_for, check_bars
from sam2edge.checks.fidelity.metrics import Prompt, click_set, compare, end_to_end, iou_summary, mask_iou
from sam2edge.checks.photos import PHOTOS, photo, photo_path

__all__ = [
    "BARS",
    "PHOTOS",
    "Prompt",
    "bars_for",
    "check_bars",
    "click_set",
    "compare",
    "end_to_end",
    "iou_summary",
    "mask_iou",
    "photo",
    "photo_path",
]
