"""One validation layer for user input, checked before any backend sees it.

Every entry point (``Sam2Predictor``, ``sam2edge segment``, ``sam2edge serve``) calls these functions,
so a bad image, prompt, number or output path is refused the same way everywhere: ``InputError`` (a
``UserError``, hence a ``ValueError``) with one line naming the problem and the fix.

Frames: point coordinates are Nx2 (X, Y), boxes (4,) XYXY, both in whatever frame the caller uses
(original-image pixels for the API, model-input pixels for the server); only their form is checked here.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from sam2edge.errors import UserError

LABELS = (-1, 0, 1, 2, 3)  # -1 pad, 0 background, 1 object, 2 / 3 box top-left / bottom-right


class InputError(UserError):
    """An image, prompt, number or output path that cannot be used; the message names the fix."""


# ---- images ---------------------------------------------------------------------------------------
def check_image_array(image: object) -> np.ndarray:
    """An HxWx3 uint8 RGB array with H, W >= 1, returned as is, else InputError."""
    if not isinstance(image, np.ndarray):
        raise InputError(f"image must be a numpy HxWx3 uint8 array or a PIL image, got {type(image).__name__}")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise InputError(
            f"image array must be HxWx3 uint8 RGB, got shape {image.shape} dtype {image.dtype}; "
            "convert it with np.asarray(pil_image.convert('RGB'))"
        )
    h, w = image.shape[:2]
    if h < 1 or w < 1:
        raise InputError(f"image is {w}x{h} pixels (empty); pass a photo with at least one pixel")
    return image


# ---- prompts --------------------------------------------------------------------------------------
def _float_array(name: str, value: object, dtype: type = np.float32) -> np.ndarray:
    try:
        with np.errstate(over="ignore"):
            a = np.asarray(value, dtype=dtype)  # float32 as the model: 1e39 is inf
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InputError(f"{name} is not an array of numbers ({type(value).__name__}); pass a numpy array") from None
    if not np.isfinite(a).all():
        raise InputError(f"{name} holds NaN or infinity; pass finite numbers")
    return a


def _has_bool(value: object) -> bool:
    """Whether ``value`` (a scalar, array or nested list) holds a boolean, which numpy would take as 0 / 1."""
    if isinstance(value, bool | np.bool_):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype == np.bool_ or (value.dtype == object and any(_has_bool(v) for v in value.flat))
    return isinstance(value, list | tuple) and any(_has_bool(v) for v in value)


def check_points(point_coords: object, point_labels: object) -> tuple[np.ndarray, np.ndarray]:
    """-> (coords Nx2 float32, labels N float32), N >= 1; labels in ``LABELS``, one per point, all finite."""
    if point_labels is None:
        raise InputError("point_labels must be supplied if point_coords is supplied (1 object, 0 background)")
    p = _float_array("point_coords", point_coords)
    if p.size == 0 or p.size % 2 or (p.ndim >= 1 and p.shape[-1] != 2):
        raise InputError(f"point_coords must be Nx2 (X, Y) with N >= 1, got shape {p.shape}")
    if _has_bool(point_labels):
        raise InputError("point_labels holds true / false; use the numbers 1 (object) or 0 (background)")
    lab = _float_array("point_labels", point_labels, np.float64).reshape(-1)
    p = p.reshape(-1, 2)
    if len(p) != len(lab):
        raise InputError(f"{len(p)} points but {len(lab)} labels; give one label per point")
    bad = [float(v) for v in lab if v not in LABELS]
    if bad:
        shown = int(bad[0]) if bad[0].is_integer() else bad[0]
        raise InputError(f"point label {shown} is not one of -1, 0, 1, 2, 3; use 1 (object) or 0 (background)")
    return p.astype(np.float32), lab.astype(np.float32)


def check_box(box: object) -> np.ndarray:
    """-> (4,) float32 X0, Y0, X1, Y1, all finite."""
    b = _float_array("box", box)
    if b.size != 4:
        raise InputError(f"box must have 4 numbers X0,Y0,X1,Y1, got shape {b.shape}")
    return b.reshape(4).astype(np.float32)


def check_mask_input(mask_input: object, side: int) -> np.ndarray:
    """-> 1x1xSxS float32 low-res logits (S = ``side``), all finite."""
    m = _float_array("mask_input", mask_input)
    if m.size != side * side:
        raise InputError(f"mask_input must be 1x{side}x{side} low-res logits (from a previous predict), got {m.shape}")
    return m.reshape(1, 1, side, side).astype(np.float32)


def check_prompt(point_coords, point_labels, box, mask_input, mask_side: int) -> tuple:
    """The predictor's prompt arguments, checked -> (coords | None, labels | None, box | None, mask | None)."""
    if point_coords is None and point_labels is not None:
        raise InputError("point_labels given without point_coords; pass both or neither")
    coords, labels = check_points(point_coords, point_labels) if point_coords is not None else (None, None)
    b = check_box(box) if box is not None else None
    m = check_mask_input(mask_input, mask_side) if mask_input is not None else None
    return coords, labels, b, m


# ---- numbers --------------------------------------------------------------------------------------
def check_positive(name: str, value: float) -> float:
    """A finite number > 0 (an option such as ``--max-upload-mb``), else InputError."""
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} {value} must be a finite number above 0")
    return value


# ---- output paths ---------------------------------------------------------------------------------
def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _writable_folder(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` if files cannot be created there, else None. Probed with a
    real (hidden, removed) file: ``os.access`` says yes to root even on a read-only mount."""
    folder = path.resolve().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return folder
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".sam2edge-probe.")
    except OSError:
        return folder
    os.close(fd)
    os.unlink(probe)
    return None


def check_outputs(outputs: dict[str, str | Path], inputs: tuple[str | Path, ...] = ()) -> None:
    """Refuse output paths (option name -> path) that would write over an input, each other, a folder,
    or into a folder that cannot be written."""
    seen: dict[str, Path] = {}
    for opt, raw in outputs.items():
        path = Path(raw)
        if str(raw) == "" or path.is_dir():
            raise InputError(f"{opt} {raw} is a folder; give a file name such as {Path(raw) / 'mask.png'}")
        for src in inputs:
            if _same_file(path, Path(src)):
                raise InputError(f"{opt} {raw} is the input {src}; write to another file, never over the input")
        for other, p in seen.items():
            if _same_file(path, p):
                raise InputError(f"{opt} and {other} are the same file {raw}; give two different file names")
        seen[opt] = path
        blocked = _writable_folder(path)
        if blocked is not None:
            why = "is a file, not a folder" if blocked.exists() and not blocked.is_dir() else "is not writable"
            raise InputError(f"{opt} {raw}: {blocked} {why}; pass a path in a writable folder")


# ---- numbers, indices and ranges ------------------------------------------------------------------
def check_number(name: str, value: object, lo: float | None = None, hi: float | None = None) -> float:
    """A finite real number (bool refused) with ``lo <= value <= hi`` where given, else InputError."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InputError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise InputError(f"{name} is {value}; pass a finite number")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = (
            f"{lo:g}..{hi:g}" if lo is not None and hi is not None else (f">= {lo:g}" if hi is None else f"<= {hi:g}")
        )
        raise InputError(f"{name} {float(value):g} is out of range; use a value in {span}")
    return float(value)


def check_fraction(name: str, value: object) -> float:
    """A threshold or ratio in [0, 1] (NaN would silently switch a filter off), else InputError."""
    return check_number(name, value, 0.0, 1.0)


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (Python or numpy; bool and 1.5 refused) with ``lo <= value <= hi`` where given."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"{lo}..{hi}" if lo is not None and hi is not None else (f">= {lo}" if hi is None else f"<= {hi}")
        raise InputError(f"{name} {v} is out of range; use {span}")
    return v


def check_index(name: str, value: object, count: int) -> int:
    """An integer index into ``count`` items (a frame number), else InputError naming the valid span."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"{name} must be an integer frame number, got {value!r} ({type(value).__name__})")
    if not 0 <= int(value) < count:
        raise InputError(f"{name} {int(value)} is out of range; the video has frames 0..{count - 1}")
    return int(value)


def check_propagation(start: object, max_frames: object, count: int) -> int:
    """``propagate_in_video``'s start frame (an index) and frame budget (an integer >= 0, or None) -> start."""
    if max_frames is not None:
        check_int("max_frame_num_to_track", max_frames, 0)
    return check_index("start_frame_idx", start, count)


def parse_index(name: str, text: str, count: int) -> int:
    """A frame number written in ASCII digits (a URL segment) -> int, else InputError. ``str.isdigit``
    accepts '١' and '²', which ``int`` then refuses or reads as another number."""
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise InputError(f"{name} {text[:20]!r} is not a frame number; write it in digits 0-9")
    return check_index(name, int(text), count)


# ---- frames and masks ------------------------------------------------------------------------------
def check_frames(frames: list, where: str = "frame") -> list[np.ndarray]:
    """A non-empty list of HxWx3 uint8 RGB arrays of one size, H, W >= 1, else InputError naming the frame."""
    if not frames:
        raise InputError("the video holds no frames; pass a video with at least one frame")
    for i, f in enumerate(frames):
        if not isinstance(f, np.ndarray) or f.dtype != np.uint8 or f.ndim != 3 or f.shape[2] != 3:
            shape = getattr(f, "shape", type(f).__name__)
            raise InputError(f"{where} {i} is not an HxWx3 uint8 RGB array ({shape}); pass uint8 RGB frames")
        if f.shape[0] < 1 or f.shape[1] < 1:
            raise InputError(f"{where} {i} is {f.shape[1]}x{f.shape[0]} pixels (empty); pass frames with pixels")
        if f.shape != frames[0].shape:
            h, w = frames[0].shape[:2]
            raise InputError(f"{where} {i} is {f.shape[1]}x{f.shape[0]}, frame 0 is {w}x{h}; pass frames of one size")
    return frames


def check_mask_2d(name: str, mask: object) -> np.ndarray:
    """A binary HxW mask (bool or finite numbers, H, W >= 1) -> bool array, else InputError."""
    if isinstance(mask, np.ndarray) and mask.dtype == bool:
        m = mask
    else:
        m = _float_array(name, mask, np.float64) != 0
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise InputError(f"{name} must be a 2-D (H, W) array with pixels, got shape {m.shape}")
    return m


def check_video_prompt(
    frame_idx: object, num_frames: int, obj_id: object, points: object, labels: object, box: object
) -> tuple[int, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``Sam2VideoPredictor.add_new_points_or_box`` arguments -> (frame, coords Nx2, labels N, box (4,))."""
    frame = check_index("frame_idx", frame_idx, num_frames)
    check_int("obj_id", obj_id)
    if (points is None) != (labels is None):
        raise InputError("points and labels must be provided together (labels 1 object, 0 background)")
    if points is None and box is None:
        raise InputError("at least one of points or box must be provided as input")
    coords, labs = check_points(points, labels) if points is not None else (None, None)
    return frame, coords, labs, check_box(box) if box is not None else None


# ---- automatic mask generation: grid sizes bounded by memory ---------------------------------------
# held for the whole run per grid point: up to 3 kept masks as uncompressed RLE, ~2 runs per column of a
# 1024-px image as Python ints (3 x 2 x 1024 x 8 B = 48 KiB), rounded up for the record's other fields
BYTES_PER_PROMPT = 64 << 10
BYTES_PER_CROP = 256  # per crop box, listed for all layers up front (box, layer, Python list overhead)


def memory_bytes() -> int:
    """Physical memory of this machine (bytes); 8 GiB where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def max_crop_layers() -> int:
    """The most crop layers whose crop boxes (4^i per layer i, ``BYTES_PER_CROP`` each) fit in memory."""
    layers = 0
    while sum(4**i for i in range(layers + 2)) * BYTES_PER_CROP <= memory_bytes():
        layers += 1
    return layers


def grid_prompts(points_per_side: int, crop_layers: int, downscale: int) -> int:
    """Point prompts of a whole run: layer i has 4^i crops of (points_per_side / downscale^i)^2 points each."""
    return sum((2**i) ** 2 * int(points_per_side / downscale**i) ** 2 for i in range(crop_layers + 1))


def check_grid(points_per_side: int | None, crop_layers: object, downscale: object, points_per_batch: object) -> None:
    """Grid, crop-layer and batch sizes of segment-everything: integers >= 1 (crop layers >= 0), with the
    whole run's prompts bounded by memory (``BYTES_PER_PROMPT`` each, at most this machine's memory)."""
    layers = check_int("crop_n_layers (--crop-layers)", crop_layers, 0)
    scale = check_int("crop_n_points_downscale_factor", downscale, 1)
    check_int("points_per_batch (--points-per-batch)", points_per_batch, 1)
    limit = memory_bytes() // BYTES_PER_PROMPT
    max_layers = max_crop_layers()
    if layers > max_layers:
        gib = memory_bytes() / (1 << 30)
        raise InputError(
            f"crop_n_layers (--crop-layers) {layers} is out of range: layer i adds 4^i crops, and {gib:.0f} GiB of "
            f"memory lists at most {max_layers} layers ({BYTES_PER_CROP} B per crop); use 0..{max_layers}"
        )
    if points_per_side is None:
        return
    side = check_int("points_per_side (--points-per-side)", points_per_side, 1)
    n = grid_prompts(min(side, 1 << 20), layers, scale)
    if n > limit:
        gib = memory_bytes() / (1 << 30)
        raise InputError(
            f"--points-per-side {side} with --crop-layers {layers} is {n} prompts, over the {limit} that "
            f"{gib:.0f} GiB of memory holds ({BYTES_PER_PROMPT // 1024} KiB each); use a smaller grid or fewer layers"
        )


# ---- output paths that must not nest ----------------------------------------------------------------
def _nested(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are one path, or one lies inside the other (resolved, so ``x/../x`` counts)."""
    ra, rb = a.resolve(), b.resolve()
    return ra == rb or ra in rb.parents or rb in ra.parents or _same_file(a, b)


def check_disjoint(outputs: dict[str, str | Path | None], inputs: tuple[str | Path, ...] = ()) -> None:
    """Refuse an output (file or folder, option name -> path) equal to, inside, or containing another
    output or an input: the later write would replace or delete the earlier one."""
    seen: dict[str, Path] = {}
    for opt, raw in outputs.items():
        if raw is None:
            continue
        path = Path(raw)
        for src in inputs:
            if _nested(path, Path(src)):
                raise InputError(f"{opt} {raw} overlaps the input {src}; write outside the input")
        for other, p in seen.items():
            if _nested(path, p):
                raise InputError(
                    f"{opt} {raw} and {other} {p} overlap (one is, or is inside, the other); "
                    "give paths apart from each other"
                )
        seen[opt] = path


# segment-everything option -> (check, command-line flag or "" where the CLI has none)
AMG_FRACTIONS = {
    "pred_iou_thresh": "--pred-iou-thresh",
    "stability_score_thresh": "--stability-thresh",
    "box_nms_thresh": "--box-nms-thresh",
    "crop_nms_thresh": "",
    "crop_overlap_ratio": "",
}


def check_amg_options(opts: dict) -> None:
    """``Sam2AutomaticMaskGenerator`` keyword arguments (the CLI passes its options through the same call):
    thresholds and ratios in [0, 1], offsets finite, areas and grid sizes integers (see ``check_grid``)."""

    def label(name: str, flag: str) -> str:
        return f"{name} ({flag})" if flag else name

    check_grid(
        opts.get("points_per_side"),
        opts.get("crop_n_layers", 0),
        opts.get("crop_n_points_downscale_factor", 1),
        opts.get("points_per_batch", 64),
    )
    for name, flag in AMG_FRACTIONS.items():
        if name in opts:
            check_fraction(label(name, flag), opts[name])
    for name in ("stability_score_offset", "mask_threshold"):
        if name in opts:
            check_number(name, opts[name])
    if "min_mask_region_area" in opts:
        check_int("min_mask_region_area (--min-region-area)", opts["min_mask_region_area"], 0)
