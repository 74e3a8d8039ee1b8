"""The accuracy bars: ONE table per precision, applied by every export and by ``sam2edge verify``.

A bundle is measured against eager fp32 with upstream's operations (``measure.measure_backend``):
  fp32  every output's cosine >= 0.99999, and end-to-end mask IoU worst >= 0.99, median >= 0.999
  fp16  end-to-end mask IoU worst >= 0.99 and median >= 0.999
  int8  end-to-end mask IoU worst >= 0.95
Video bundles (``--video``; ``video.measure_video``: a two-object clip with a correction and reverse
propagation, mask IoU per frame vs eager fp32): fp32 worst >= 0.999; fp16 and int8 worst >= 0.95, median >= 0.99
(the reduced-precision clip bars; int8 quantises only the frame encoder).
Any NaN / inf in a measured output (or among the metrics) fails, whatever the bars: NaN never passes.
"""

from __future__ import annotations

import math

# precision -> bar name -> threshold (names as in fidelity.json "bars")
BARS: dict[str, dict[str, float]] = {
    "fp32": {"min_cosine": 0.99999, "min_iou_worst": 0.99, "min_iou_median": 0.999, "min_video_iou_worst": 0.999},
    "fp16": {"min_iou_worst": 0.99, "min_iou_median": 0.999, "min_video_iou_worst": 0.95, "min_video_iou_median": 0.99},
    "int8": {"min_iou_worst": 0.95, "min_video_iou_worst": 0.95, "min_video_iou_median": 0.99},
}


def bars_for(precision: str, overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The precision's bars, ``overrides`` replacing them key by key."""
    return {**BARS.get(precision, {}), **(overrides or {})}


def _finite(v: object) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


def nonfinite_failures(outputs: dict[str, dict], e2e: dict) -> list[str]:
    """One line per output (or end-to-end run) with NaN / inf values or metrics."""
    out = []
    for name, m in outputs.items():
        if m.get("nonfinite", 0) or not all(_finite(v) for v in m.values()):
            out.append(f"{name}: {m.get('nonfinite', 'some')} non-finite value(s) (NaN / inf)")
    if e2e.get("nonfinite", 0) or not all(_finite(v) for v in e2e.values()):
        out.append(f"end-to-end: {e2e.get('nonfinite', 'some')} prompt(s) gave non-finite scores or logits")
    return out


def _click(c: dict) -> str:
    """One failing click: photo, prompt kind, index in ``click_set``, IoU, and its reference mask's fragility."""
    ref = ""
    if "ref_mask_px" in c:
        ref = f" [reference mask {c['ref_mask_px']} px, {c['ref_logits_near_0']:.0%} of its logits within +-0.1 of 0]"
    return f"{c['photo']} {c['kind']} #{c['index']} {c['iou']:.4f}{ref}"


def check_bars(outputs: dict[str, dict], e2e: dict, bars: dict[str, float]) -> list[str]:
    """Failed bars, one line each (empty = passed). ``not x >= bar`` so that NaN fails too."""
    failures = nonfinite_failures(outputs, e2e)
    if "min_cosine" in bars:
        for name, m in outputs.items():
            if not m["cosine"] >= bars["min_cosine"]:
                failures.append(f"{name}: cosine {m['cosine']:.7f} < {bars['min_cosine']}")
    if "min_iou_worst" in bars and not e2e["iou_worst"] >= bars["min_iou_worst"]:
        under = [c for c in e2e.get("lowest_clicks", []) if not c["iou"] >= bars["min_iou_worst"]]
        where = ", ".join(_click(c) for c in under)
        failures.append(
            f"end-to-end mask IoU worst {e2e['iou_worst']:.4f} < {bars['min_iou_worst']}"
            + (f" ({where})" if where else "")
        )
    if "min_iou_median" in bars and not e2e["iou_median"] >= bars["min_iou_median"]:
        low = ", ".join(_click(c) for c in e2e.get("lowest_clicks", []))
        failures.append(
            f"end-to-end mask IoU median {e2e['iou_median']:.4f} < {bars['min_iou_median']}"
            + (f" (lowest: {low})" if low else "")
        )
    return failures
