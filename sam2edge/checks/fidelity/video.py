"""Tracking fidelity of a video backend (an export bundle) against eager fp32, frame by frame.

The clip: a window drifting right and down across scikit-image's astronaut (``CLIP_FRAMES`` frames of
``CLIP_SIZE``), two objects (a click on object 1, a box on object 2, both on frame 0), forward
propagation, a correction (a background click on object 1 at frame ``CORRECTION_FRAME``), forward
propagation again, then reverse propagation from the last frame. Both predictors run the same calls;
per pass and frame index, the mask IoU (video resolution, logits > 0) worst over the objects, so drift
over time is visible. A pixel whose reference logit is a tie (within ``TIE`` of 0, relative to the object's largest
|logit|) is left out of its IoU and counted in the report (``threshold_ties``). Bars (``bars.BARS``):
``min_video_iou_worst`` / ``min_video_iou_median``.
Timing: seconds per backend call kind per frame (encoder / memory attention / decoder / memory encoder),
measured on whatever machine runs the check (a record, not a bar).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from sam2edge.checks.fidelity.bars import bars_for
from sam2edge.checks.fidelity.metrics import mask_iou

CLIP_FRAMES = 6
CLIP_SIZE = (200, 150)  # (W, H) of the window
CORRECTION_FRAME = 3
# A reference logit within TIE x the object's largest |logit| of 0 sits on the mask threshold to fp32 rounding:
# an fp32 bundle's logits differ from eager's by up to ~1e-6 of that scale, so either side of 0 is right. Measured:
# a test-small-edgetam ExecuTorch fp32 --video bundle (synthetic weights), every logit within 7.5e-7 of the scale,
# flipped one pixel whose reference logit was 1.7e-8 of the scale from 0, which alone put a 960-pixel mask at
# IoU 0.9990, under the fp32 bar of 0.999; the clip holds 5 such ties in all (benchmarks/video_flips.py).
TIE = 1e-6
STAGES = {
    "encode_frame": "encoder",
    "memory_attention": "memory_attention",
    "decode": "decoder",
    "encode_memory": "memory_encoder",
}


def clip(frames: int = CLIP_FRAMES, size: tuple[int, int] = CLIP_SIZE, step: int = 9) -> list[np.ndarray]:
    """HxWx3 uint8 frames: a (W, H) window drifting across the astronaut photo."""
    from sam2edge.checks.fidelity import photo

    img = photo("astronaut.png")
    w, h = size
    out = []
    for i in range(frames):
        x0, y0 = 20 + step * i, 10 + (step * i) // 2
        crop = np.ascontiguousarray(img[y0 : y0 + h, x0 : x0 + w])
        if crop.shape[:2] != (h, w):
            raise ValueError(f"window {w}x{h} leaves the photo at frame {i}; use fewer frames or a smaller step")
        out.append(crop)
    return out


class Timed:
    """A video backend whose stage calls are timed (seconds summed per stage)."""

    def __init__(self, backend) -> None:
        self._b, self.seconds = backend, defaultdict(float)

    def __getattr__(self, name: str):
        attr = getattr(self._b, name)
        if name not in STAGES:
            return attr

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return attr(*a, **k)
            finally:
                self.seconds[STAGES[name]] += time.perf_counter() - t0

        return timed


def run_clip(backend, frames: list[np.ndarray]) -> dict[str, dict[int, np.ndarray]]:
    """The scenario on one backend: pass name -> frame index -> (objects, 1, H, W) logits."""
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor

    h, w = frames[0].shape[:2]
    pred = Sam2VideoPredictor(backend)
    state = pred.init_state(frames)
    out: dict[str, dict[int, np.ndarray]] = {}
    pred.add_new_points_or_box(state, 0, 1, points=np.array([[0.55 * w, 0.35 * h]]), labels=np.array([1]))
    pred.add_new_points_or_box(state, 0, 2, box=np.array([0.1 * w, 0.55 * h, 0.5 * w, 0.95 * h]))
    out["forward"] = {f: m.numpy() for f, _, m in pred.propagate_in_video(state)}
    c = CORRECTION_FRAME
    _, _, m = pred.add_new_points_or_box(state, c, 1, points=np.array([[0.3 * w, 0.3 * h]]), labels=np.array([0]))
    out["correction"] = {c: m.numpy()}
    out["corrected"] = {f: m.numpy() for f, _, m in pred.propagate_in_video(state)}
    out["reverse"] = {f: m.numpy() for f, _, m in pred.propagate_in_video(state, len(frames) - 1, reverse=True)}
    return out


def ties(ref: np.ndarray) -> np.ndarray:
    """The pixels of one object's reference logits (any shape) that sit on the threshold (``TIE``). A NaN is never
    a tie, and a NaN scale makes none."""
    return np.abs(ref) <= TIE * np.abs(ref).max()


def _per_frame(test: dict[int, np.ndarray], ref: dict[int, np.ndarray]) -> dict[str, float]:
    """frame index -> mask IoU worst over objects, each object's threshold ties left out."""
    out = {}
    for f in sorted(ref):
        keep = [~ties(r) for r in ref[f]]  # per object
        out[str(f)] = min(mask_iou((t > 0) & k, (r > 0) & k) for t, r, k in zip(test[f], ref[f], keep, strict=True))
    return out


def measure_video(
    ref,
    test,
    precision: str,
    frames: list[np.ndarray] | None = None,
    bars: dict | None = None,
    want: dict[str, dict[int, np.ndarray]] | None = None,
) -> dict:
    """Run the clip on ``ref`` (eager fp32) and ``test``; per-pass, per-frame IoU, latency, bars, failures.
    ``want``: ``run_clip(ref, frames)`` where the caller already ran it (an export that measures two frame
    encoders against one reference); ``ref`` is then not used (None will do)."""
    frames = clip() if frames is None else frames
    timed = Timed(test)
    want = run_clip(ref, frames) if want is None else want
    got = run_clip(timed, frames)
    passes = {name: _per_frame(got[name], want[name]) for name in want}
    ious = [v for p in passes.values() for v in p.values()]
    nonfinite = sum(int((~np.isfinite(m)).sum()) for p in got.values() for m in p.values())
    calls = sum(len(p) for p in got.values())
    report = {
        "clip": {
            "frames": len(frames),
            "size": list(frames[0].shape[1::-1]),
            "objects": 2,
            "passes": list(passes),
            "correction_frame": CORRECTION_FRAME,
        },
        "per_frame_iou": passes,
        "iou_worst": float(min(ious)),
        "iou_median": float(np.median(ious)),
        "threshold_ties": int(sum(ties(r).sum() for p in want.values() for m in p.values() for r in m)),
        "nonfinite": nonfinite,
        "latency_ms_per_frame": {k: 1e3 * s / calls for k, s in timed.seconds.items()},
        "bars": {k: v for k, v in bars_for(precision, bars).items() if k.startswith("min_video")},
    }
    report["failures"] = video_failures(report)
    return report


def video_failures(report: dict) -> list[str]:
    """Failed video bars, one line each; ``not x >= bar`` so that NaN fails too."""
    bars, out = report["bars"], []
    if report["nonfinite"]:
        out.append(f"video: {report['nonfinite']} non-finite mask logits (NaN / inf)")
    for key, name in (("iou_worst", "worst"), ("iou_median", "median")):
        bar = bars.get(f"min_video_{key}")
        if bar is not None and not report[key] >= bar:
            worst = min(
                ((p, f, v) for p, fr in report["per_frame_iou"].items() for f, v in fr.items()), key=lambda t: t[2]
            )
            out.append(f"video mask IoU {name} {report[key]:.4f} < {bar} (worst: {worst[0]} pass, frame {worst[1]})")
    return out
