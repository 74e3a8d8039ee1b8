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


def check_points(point_coords: object, point_labels: object) -> tuple[np.ndarray, np.ndarray]:
    """-> (coords Nx2 float32, labels N float32), N >= 1; labels in ``LABELS``, one per point, all finite."""
    if point_labels is None:
        raise InputError("point_labels must be supplied if point_coords is supplied (1 object, 0 background)")
    p = _float_array("point_coords", point_coords)
    if p.size == 0 or p.size % 2 or (p.ndim >= 1 and p.shape[-1] != 2):
        raise InputError(f"point_coords must be Nx2 (X, Y) with N >= 1, got shape {p.shape}")
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
