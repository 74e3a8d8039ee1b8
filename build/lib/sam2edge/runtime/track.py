"""The tracking job behind ``sam2edge track``: prompts -> per-frame label maps -> PNG masks and an overlay video.

Prompts are in video pixels. Tracking runs forward from the earliest prompted frame and, with
``reverse``, also backward from it; frames never reached get an empty label map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.errors import UserError
from sam2edge.io import atomic_dir, atomic_path
from sam2edge.runtime.video_io import (
    MAX_OBJECT_ID,
    close_writer,
    label_map,
    open_writer,
    overlay_frame,
    write_frame,
    write_mask_png,
)
from sam2edge.runtime.video_predictor import Sam2VideoPredictor


@dataclass(frozen=True)
class Prompt:
    frame: int  # frame index, 0-based
    obj_id: int  # object id, 1..255 (the pixel value in the mask PNGs)
    point: tuple[float, float, int] | None = None  # X, Y video pixels, label 1 object / 0 background
    box: tuple[float, float, float, float] | None = None  # X0, Y0, X1, Y1 video pixels


def check_prompts(prompts: list[Prompt], num_frames: int, width: int, height: int) -> None:
    """One-line UserError for the first prompt that names no frame, object or place in the video."""
    if not prompts:
        raise UserError("no prompt given; add --point F:X,Y[@OBJ] and/or --box F:X0,Y0,X1,Y1[@OBJ]")
    for p in prompts:
        if not 0 <= p.frame < num_frames:
            raise UserError(f"frame {p.frame} is out of range; the video has frames 0..{num_frames - 1}")
        if not 1 <= p.obj_id <= MAX_OBJECT_ID:
            raise UserError(f"object {p.obj_id} is not a valid id; use 1..{MAX_OBJECT_ID} (@OBJ, default 1)")
        if p.point is not None and not (0 <= p.point[0] < width and 0 <= p.point[1] < height):
            x, y = p.point[:2]
            raise UserError(f"point {x:g},{y:g} is outside the {width}x{height} frame; use 0 <= X < {width}")
        if p.box is not None:
            x0, y0, x1, y1 = p.box
            if x1 <= x0 or y1 <= y0 or min(x0, y0) < 0 or x1 > width or y1 > height:
                raise UserError(
                    f"box {x0:g},{y0:g},{x1:g},{y1:g} is empty or leaves the {width}x{height} frame;"
                    f" give X0 < X1 <= {width}, Y0 < Y1 <= {height}"
                )
    boxes = {}
    for p in prompts:
        if p.box is not None and boxes.setdefault((p.frame, p.obj_id), p.box) != p.box:
            raise UserError(f"two boxes for object {p.obj_id} on frame {p.frame}; give one box per object and frame")


def add_prompts(predictor: Sam2VideoPredictor, state, prompts: list[Prompt]) -> None:
    """One ``add_new_points_or_box`` call per (frame, object): its points and box together."""
    keys = sorted({(p.frame, p.obj_id) for p in prompts})
    for frame, obj in keys:
        group = [p for p in prompts if (p.frame, p.obj_id) == (frame, obj)]
        pts = [p.point for p in group if p.point is not None]
        box = next((p.box for p in group if p.box is not None), None)
        points = np.array([q[:2] for q in pts], np.float32) if pts else None
        labels = np.array([q[2] for q in pts], np.int32) if pts else None
        predictor.add_new_points_or_box(state, frame, obj, points=points, labels=labels, box=box)


def track(
    predictor: Sam2VideoPredictor,
    frames: list[np.ndarray],
    prompts: list[Prompt],
    reverse: bool,
    on_frame: Callable[[int], None] = lambda _: None,
) -> list[np.ndarray]:
    """Label maps (HxW uint8, pixel = object id) for every frame; ``on_frame`` is called per tracked frame."""
    h, w = frames[0].shape[:2]
    check_prompts(prompts, len(frames), w, h)
    state = predictor.init_state(frames)
    add_prompts(predictor, state, prompts)
    labels = [np.zeros((h, w), np.uint8) for _ in frames]
    start = min(p.frame for p in prompts)
    passes = [False, True] if reverse else [False]
    for backwards in passes:
        for f, obj_ids, masks in predictor.propagate_in_video(state, start_frame_idx=start, reverse=backwards):
            labels[f] = label_map((masks[:, 0] > 0).numpy(), obj_ids)
            on_frame(f)
    return labels


def frames_to_track(num_frames: int, prompts: list[Prompt], reverse: bool) -> int:
    """How many frame steps ``track`` makes (for a progress bar)."""
    start = min(p.frame for p in prompts)
    return (num_frames - start) + (start + 1 if reverse and start > 0 else 0)


def write_outputs(
    frames: list[np.ndarray], labels: list[np.ndarray], out_dir: str | Path, overlay: str | Path | None, fps: float
) -> None:
    """Palette PNG per frame (00000.png, ...) into a new folder, and an overlay video; each atomic."""
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        for i, lab in enumerate(labels):
            write_mask_png(tmp / f"{i:05d}.png", lab)
        if overlay is not None:
            _write_overlay(frames, labels, Path(overlay), fps)


def _write_overlay(frames: list[np.ndarray], labels: list[np.ndarray], dest: Path, fps: float) -> None:
    h, w = frames[0].shape[:2]
    with atomic_path(dest) as tmp:
        container, stream = open_writer(tmp, dest.suffix, w, h, fps)
        try:
            for frame, lab in zip(frames, labels):
                write_frame(container, stream, overlay_frame(frame, lab))
            close_writer(container, stream)
        except BaseException:
            container.close()
            raise


def refuse_existing(out_dir: str | Path, overlay: str | Path | None) -> None:
    """Never write over a user's folder or file: fail before any work."""
    if Path(out_dir).exists():
        raise UserError(f"{out_dir} already exists; pass a new folder to --out")
    if overlay is not None:
        if Path(overlay).exists():
            raise UserError(f"{overlay} already exists; pass a new file to --overlay")
        if Path(overlay).suffix.lower() not in (".mp4", ".webm"):
            raise UserError(f"overlay {overlay} must end in .mp4 (H.264) or .webm (VP9)")
