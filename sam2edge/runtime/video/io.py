"""Video input and output with PyAV: frames in (frame folder, video file, list), overlay video and masks out.

Frames are HxWx3 uint8 RGB numpy arrays. A frame folder is read as upstream's predictor reads a JPEG folder
(``<int>.jpg`` names, sorted by number); ``<int>.png`` frames are read the same way (one kind per folder). Mask
PNGs are palette images whose pixel value is the object id (0 background), as DAVIS stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from sam2edge.errors import UserError
from sam2edge.validate import check_frames

FRAME_SUFFIXES = {"JPEG": (".jpg", ".jpeg", ".JPG", ".JPEG"), "PNG": (".png", ".PNG")}  # one kind per folder
VIDEO_SUFFIXES = (".mp4", ".MP4", ".webm", ".mov", ".MOV", ".mkv", ".avi", ".m4v")
# overlay container suffix -> encoders to try, first that the installed FFmpeg has
ENCODERS: dict[str, tuple[str, ...]] = {".mp4": ("libx264", "h264", "mpeg4"), ".webm": ("libvpx-vp9", "libvpx")}
MAX_OBJECT_ID = 255  # palette PNG: one byte per pixel


class VideoError(UserError):
    """A video that cannot be read or written; the message names the problem and the fix."""


def _av():
    """PyAV (the ``video`` extra), or a one-line UserError naming the install."""
    try:
        import av
    except ImportError:
        raise VideoError("video files need PyAV: pip install 'sam2edge[video]' (or pip install av)") from None
    return av


def frame_paths(folder: Path) -> list[Path]:
    """``<int>.jpg`` (upstream's naming rule) or ``<int>.png`` files of a folder, in frame order."""
    kinds = {kind: [p for p in folder.iterdir() if p.suffix in suffixes] for kind, suffixes in FRAME_SUFFIXES.items()}
    found = [kind for kind, paths in kinds.items() if paths]
    if not found:
        raise VideoError(f"no frames in {folder}; pass a folder of 00000.jpg, 00001.jpg, ... (or .png) or a video file")
    if len(found) > 1:
        raise VideoError(f"{folder} holds both JPEG and PNG frames; keep one kind of frame in the folder")
    paths = kinds[found[0]]
    try:
        paths.sort(key=lambda p: int(p.stem))
    except ValueError:
        raise VideoError(
            f"{folder} holds {found[0]} files not named by frame number; name them 00000{paths[0].suffix}, ..."
        ) from None
    return paths


def decode_frames(path: Path) -> Iterator[np.ndarray]:
    """The frames of a video file, one HxWx3 uint8 RGB array at a time (PyAV), or VideoError."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path} has no video stream; pass an .mp4/.webm/.mov file or a folder of frames")
            for frame in container.decode(video=0):
                yield frame.to_ndarray(format="rgb24")
    except (av.error.FFmpegError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise VideoError(f"cannot read video {path}: {reason}; pass a valid .mp4/.webm/.mov file") from None


def read_frames(video: str | Path | Iterable) -> list[np.ndarray]:
    """All frames of a JPEG or PNG frame folder, a video file, or a list of HxWx3 uint8 arrays / PIL images."""
    if not isinstance(video, (str, Path)):
        try:
            frames = [np.asarray(f.convert("RGB")) if isinstance(f, Image.Image) else f for f in video]
        except TypeError:
            raise VideoError(f"video is a {type(video).__name__}; pass a path or a list of frames") from None
        return check_frames(frames)
    path, names = Path(video), None
    if path.is_dir():
        names = frame_paths(path)
        frames = [_read_frame(p) for p in names]
    elif path.is_file():
        frames = list(decode_frames(path))
    else:
        raise VideoError(f"video {path} does not exist; pass a frame folder or an .mp4/.webm/.mov file")
    if not frames:
        raise VideoError(f"{video} holds no frames; pass a video with at least one frame")
    for i, f in enumerate(frames):
        if f.shape != frames[0].shape:
            where = f"{names[i]}" if names else f"{video} frame {i}"
            h, w = frames[0].shape[:2]
            raise VideoError(f"{where} is {f.shape[1]}x{f.shape[0]}, the first frame {w}x{h}; pass frames of one size")
    return check_frames(frames)


def _read_frame(path: Path) -> np.ndarray:
    """One JPEG / PNG frame -> HxWx3 uint8 RGB, or VideoError naming the file (truncated, not an image, unreadable)."""
    from PIL import UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            return np.asarray(im.convert("RGB"))
    except UnidentifiedImageError:
        raise VideoError(f"frame {path} is not an image PIL can read; replace or remove it") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise VideoError(f"frame {path} cannot be decoded ({reason}); replace or remove it") from None


def video_fps(video: str | Path) -> float:
    """Frames per second of a video file (24 for a folder or list)."""
    path = Path(video) if isinstance(video, (str, Path)) else None
    if path is None or not path.is_file():
        return 24.0
    with _av().open(str(path)) as container:
        rate = container.streams.video[0].average_rate
    return float(rate) if rate else 24.0


def palette() -> list[int]:
    """256-colour palette: 0 black, then distinct hues (DAVIS-like), flattened RGB."""
    rng = np.random.default_rng(0)
    colours = rng.integers(64, 256, size=(256, 3))
    colours[0] = 0
    fixed = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180)]
    colours[1 : 1 + len(fixed)] = fixed
    return colours.astype(np.uint8).reshape(-1).tolist()


def label_map(masks: np.ndarray, obj_ids: list[int]) -> np.ndarray:
    """Boolean masks (N, H, W) -> HxW uint8 of object ids; later objects win overlaps."""
    out = np.zeros(masks.shape[1:], np.uint8)
    for m, obj_id in zip(masks, obj_ids):
        out[m] = obj_id
    return out


def write_mask_png(path: Path, labels: np.ndarray) -> None:
    im = Image.fromarray(labels, mode="P")
    im.putpalette(palette())
    im.save(path)


def overlay_frame(frame: np.ndarray, labels: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Blend each object's palette colour over its pixels: HxWx3 uint8."""
    colours = np.asarray(palette(), np.float32).reshape(256, 3)
    out = frame.astype(np.float32)
    hit = labels > 0
    out[hit] = (1 - alpha) * out[hit] + alpha * colours[labels[hit]]
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def open_writer(path: Path, suffix: str, width: int, height: int, fps: float):
    """(container, stream) writing ``path`` as a ``suffix`` (.mp4: H.264, .webm: VP9) video."""
    av = _av()
    encoders = ENCODERS.get(suffix.lower())
    if encoders is None:
        raise VideoError(f"overlay suffix {suffix!r} is not supported; use .mp4 or .webm")
    container = av.open(str(path), mode="w", format=suffix.lower().lstrip("."))
    for name in encoders:
        try:
            stream = container.add_stream(name, rate=round(fps) or 24)
        except (av.error.FFmpegError, ValueError):
            continue
        stream.width, stream.height = width + width % 2, height + height % 2  # yuv420p needs even sides
        stream.pix_fmt = "yuv420p"
        return container, stream
    container.close()
    raise VideoError(f"this FFmpeg build has none of {encoders} for {suffix} video; write a .webm overlay instead")


def write_frame(container, stream, rgb: np.ndarray) -> None:
    av = _av()
    h, w = stream.height, stream.width
    if rgb.shape[:2] != (h, w):
        rgb = np.pad(rgb, ((0, h - rgb.shape[0]), (0, w - rgb.shape[1]), (0, 0)), mode="edge")
    for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")):
        container.mux(packet)


def close_writer(container, stream) -> None:
    for packet in stream.encode():
        container.mux(packet)
    container.close()
