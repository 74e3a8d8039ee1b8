"""The tracking job behind ``sam2edge track``: prompts -> per-frame label maps -> PNG masks (or COCO RLE per frame
and object in a JSON file) and an overlay video.

Prompts are in video pixels. Tracking runs forward from ``start`` (default: the earliest prompted frame) and, with
``reverse``, also backward from it; ``max_frames`` bounds each pass as upstream's ``propagate_in_video``
``max_frame_num_to_track`` does (frames start..start+K forward, start..start-K backward, clipped to the clip).
Frames never reached get an empty label map in the PNG folder and no entry in the JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sam2edge.errors import UserError
from sam2edge.io import atomic_dir, atomic_path
from sam2edge.runtime.automatic.amg_utils import area_from_rle, coco_encode_rle, mask_to_rle
from sam2edge.runtime.video.io import (
    MAX_OBJECT_ID,
    close_writer,
    label_map,
    open_writer,
    overlay_frame,
    write_frame,
    write_mask_png,
)
from sam2edge.runtime.video.predictor import Sam2VideoPredictor


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


def check_span(start: int | None, max_frames: int | None, num_frames: int) -> None:
    """One-line UserError for a start frame outside the clip or a negative frame budget."""
    if start is not None and not 0 <= start < num_frames:
        raise UserError(f"--start-frame {start} is out of range; the video has frames 0..{num_frames - 1}")
    if max_frames is not None and max_frames < 0:
        raise UserError(f"--max-frames {max_frames} is negative; give 0 or more (0: the start frame only)")


def track(
    predictor: Sam2VideoPredictor,
    frames: list[np.ndarray],
    prompts: list[Prompt],
    reverse: bool,
    on_frame: Callable[[int], None] = lambda _: None,
    start: int | None = None,
    max_frames: int | None = None,
    on_masks: Callable[[int, list[int], np.ndarray], None] | None = None,
) -> list[np.ndarray]:
    """Label maps (HxW uint8, pixel = object id) for every frame; ``on_frame`` is called per tracked frame and
    ``on_masks(frame, obj_ids, masks)`` with its (num_objects, H, W) bool masks (objects may overlap there).
    ``start`` None: the earliest prompted frame; ``max_frames`` as upstream's ``max_frame_num_to_track``."""
    h, w = frames[0].shape[:2]
    check_prompts(prompts, len(frames), w, h)
    check_span(start, max_frames, len(frames))
    state = predictor.init_state(frames)
    add_prompts(predictor, state, prompts)
    labels = [np.zeros((h, w), np.uint8) for _ in frames]
    start = min(p.frame for p in prompts) if start is None else start
    passes = [False, True] if reverse else [False]
    for backwards in passes:
        for f, obj_ids, masks in predictor.propagate_in_video(state, start, max_frames, reverse=backwards):
            binary = (masks[:, 0] > 0).numpy()  # (num_objects, H, W)
            labels[f] = label_map(binary, obj_ids)
            if on_masks is not None:
                on_masks(f, list(obj_ids), binary)
            on_frame(f)
    return labels


def propagation_order(num_frames: int, start: int, max_frames: int | None, reverse: bool) -> range:
    """The frames one ``propagate_in_video`` pass visits, as upstream: forward start..min(start+K, n-1), backward
    start..max(start-K, 0), none backward from frame 0."""
    k = num_frames if max_frames is None else max_frames
    if reverse:
        return range(start, max(start - k, 0) - 1, -1) if start > 0 else range(0)
    return range(start, min(start + k, num_frames - 1) + 1)


def frames_to_track(
    num_frames: int, prompts: list[Prompt], reverse: bool, start: int | None = None, max_frames: int | None = None
) -> int:
    """How many frame steps ``track`` makes (for a progress bar)."""
    start = min(p.frame for p in prompts) if start is None else start
    passes = (False, True) if reverse else (False,)
    return sum(len(propagation_order(num_frames, start, max_frames, r)) for r in passes)


def coco_masks(obj_ids: list[int], masks: np.ndarray) -> list[dict]:
    """(num_objects, H, W) bool -> [{"object", "segmentation" (COCO compressed RLE), "area", "bbox" XYWH}], with
    the RLE code of ``sam2edge everything`` (``amg_utils``) and pycocotools' box."""
    from pycocotools import mask as mask_utils

    out = []
    for obj, rle in zip(obj_ids, mask_to_rle(torch.from_numpy(np.ascontiguousarray(masks)))):
        coco = coco_encode_rle(rle)
        box = mask_utils.toBbox({**coco, "counts": coco["counts"].encode()}).tolist()
        out.append({"object": int(obj), "segmentation": coco, "area": area_from_rle(rle), "bbox": box})
    return out


def load_predictor(checkpoint: str | None, model: str | None, config: str | None) -> Sam2VideoPredictor:
    """The predictor of an export bundle (``model``, made with ``--video``) or of a checkpoint (eager); ``config``
    None: the model the checkpoint's tensors (or the bundle's card) name. One-line UserError for a bundle of
    another config than ``config`` or a bundle and a checkpoint together."""
    from sam2edge.bundle import load_card
    from sam2edge.config import get_config, get_video_config

    if model is not None:
        if checkpoint is not None:
            raise UserError("pass --model (an export bundle) or --checkpoint (weights), not both")
        held = load_card(Path(model)).get("config")
        if config is not None and held != config:
            raise UserError(
                f"{model} is a {held} bundle but --config is {config}; drop --config or pass --config {held}"
            )
        return Sam2VideoPredictor.from_export(model)
    configs = (get_config(config), get_video_config(config)) if config else ()
    return Sam2VideoPredictor.from_checkpoint(checkpoint, *configs)


def is_json(out: str | Path) -> bool:
    """``--out`` names a JSON file of COCO RLE masks (else a folder of palette PNGs)."""
    return Path(out).suffix.lower() == ".json"


def write_json(doc: dict, dest: str | Path, frames: list[np.ndarray], labels, overlay, fps: float) -> None:
    """The masks document (``coco_masks`` per tracked frame) and the overlay video; each atomic, both or neither."""
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(doc))
        if overlay is not None:
            _write_overlay(frames, labels, Path(overlay), fps)


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
        kind = "file" if is_json(out_dir) else "folder"
        raise UserError(f"{out_dir} already exists; pass a new {kind} to --out")
    if overlay is not None:
        if Path(overlay).exists():
            raise UserError(f"{overlay} already exists; pass a new file to --overlay")
        if Path(overlay).suffix.lower() not in (".mp4", ".webm"):
            raise UserError(f"overlay {overlay} must end in .mp4 (H.264) or .webm (VP9)")
