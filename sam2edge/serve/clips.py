"""Uploaded clips for tracking in the page (``serve`` with a LiteRT bundle exported with ``--video``).

The page runs the memory attention, the video decoder and the memory encoder itself (LiteRT.js,
``static/tracker.js``: the port of ``memory_bank`` and ``Sam2VideoPredictor``). The server decodes the
upload once (PyAV), keeps its frames as ``Sam2VideoPredictor.init_state`` resizes them, and runs the frame
encoder when the page asks for a frame (``Sam2VideoPredictor.frame_features``: the same code path as
tracking in Python, so the page and ``Sam2VideoPredictor.from_export`` see the same features).

API (X-Session as for photos):
  POST /api/videos                    body = video file -> {"id", "width", "height", "num_frames", "fps"}
  GET  /api/videos/ID/frame/N         frame N as a JPEG at video resolution (for display)
  GET  /api/videos/ID/pixels/N        frame N at model resolution, S x S x 3 uint8 RGB (as init_state resizes it:
                                      the page's frame encoder input, before /255 and the ImageNet mean/std)
  GET  /api/videos/ID/features/N      vision | feat_s0 | feat_s1 of frame N, float32 little-endian, C order
                                      (vision without no_mem_embed, as ``VideoBackend.encode_frame``)
"""

from __future__ import annotations

import io
import secrets
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from sam2edge.errors import UserError
from sam2edge.runtime.video.io import VideoError, decode_frames, video_fps
from sam2edge.runtime.video.predictor import Sam2VideoPredictor, VideoState
from sam2edge.serve.web import HttpError
from sam2edge.validate import InputError, parse_index

FEATURES = ("vision", "feat_s0", "feat_s1")


@dataclass(frozen=True)
class ClipLimits:
    max_frames: int = 150  # frames per clip (the page keeps every tracked frame's memory, ~1 MB per object)
    max_clips: int = 2  # clips kept in memory, all sessions together (oldest dropped first)


@dataclass
class Clip:
    session: str
    state: VideoState  # the frames at model resolution, as Sam2VideoPredictor.init_state makes them
    jpegs: list[bytes]  # each frame at video resolution, for display
    fps: float


class Clips:
    """The clips of one server: decode an upload, answer a frame's JPEG or its encoded features."""

    def __init__(self, predictor: Sam2VideoPredictor, model_lock: threading.Lock, limits: ClipLimits | None = None):
        self.predictor, self.model_lock = predictor, model_lock
        self.limits = limits or ClipLimits()
        self._clips: OrderedDict[str, Clip] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, session: str, data: bytes, max_pixels: int) -> tuple[str, Clip]:
        """Decode ``data`` (a video file) -> (fresh id, clip), or HttpError naming the problem and the fix."""
        frames, fps = self._decode(data, max_pixels)
        try:
            state = self.predictor.init_state(frames)
        except UserError as e:  # e.g. a 0x0 frame
            raise HttpError(400, str(e).splitlines()[0][:200]) from None
        jpegs = [_jpeg(f) for f in frames]
        clip_id = secrets.token_urlsafe(16)
        with self._lock:
            self._clips[clip_id] = Clip(session, state, jpegs, fps)
            while len(self._clips) > self.limits.max_clips:
                self._clips.popitem(last=False)
        return clip_id, self._clips[clip_id]

    def _decode(self, data: bytes, max_pixels: int) -> tuple[list[np.ndarray], float]:
        if not data:
            raise HttpError(400, "the upload is empty; send an .mp4/.webm/.mov video as the request body")
        cap = self.limits.max_frames
        with tempfile.TemporaryDirectory(prefix="sam2edge-clip-") as tmp:
            path = Path(tmp) / "upload"
            path.write_bytes(data)
            frames: list[np.ndarray] = []
            try:
                for f in decode_frames(path):
                    if f.shape[0] * f.shape[1] > max_pixels:
                        raise HttpError(
                            413,
                            f"frames are {f.shape[1]}x{f.shape[0]}; the limit is "
                            f"{max_pixels / 1e6:.0f} MP per frame; downscale the video",
                        )
                    if len(frames) == cap:
                        raise HttpError(413, f"the video has more than {cap} frames; trim it to {cap} frames")
                    if frames and f.shape != frames[0].shape:
                        raise HttpError(400, "the video's frames differ in size; re-encode it at one size")
                    frames.append(f)
                fps = video_fps(path)
            except VideoError as e:
                raise HttpError(415, str(e).replace(str(path), "the upload")) from None
        if not frames:
            raise HttpError(400, "the video holds no frames; send a video with at least one frame")
        return frames, fps

    def get(self, session: str, clip_id: str) -> Clip:
        with self._lock:
            clip = self._clips.get(clip_id)
        if clip is None or not secrets.compare_digest(clip.session, session):
            raise HttpError(404, "no such video (it may have expired); open the video again")
        return clip

    def frame_index(self, clip: Clip, text: str) -> int:
        n = clip.state.num_frames
        if not (text.isascii() and text.isdigit()):  # str.isdigit alone takes '١' and '²'
            raise HttpError(400, f"frame {text[:20]!r} is not a frame number; write it in digits 0-9")
        try:
            return parse_index("frame", text, n)
        except InputError:
            raise HttpError(404, f"no frame {text[:20]!r}; the video has frames 0..{n - 1}") from None

    def pixels(self, clip: Clip, index: int) -> bytes:
        """Frame ``index`` as the frame encoder sees it before normalisation: S x S x 3 uint8 RGB bytes."""
        return np.ascontiguousarray(clip.state.frames[index], dtype=np.uint8).tobytes()

    def features(self, clip: Clip, index: int) -> bytes:
        """Frame ``index`` through the bundle's frame encoder: vision | feat_s0 | feat_s1 as float32 LE bytes."""
        with self.model_lock:
            feats = self.predictor.frame_features(clip.state, index)
        return b"".join(np.ascontiguousarray(getattr(feats, k), dtype="<f4").tobytes() for k in FEATURES)

    def shapes(self) -> dict[str, list[int]]:
        cfg, e = self.predictor.cfg, self.predictor.cfg.image_embedding_size
        c = cfg.d_model
        return {"vision": [1, c, e, e], "feat_s0": [1, c // 8, 4 * e, 4 * e], "feat_s1": [1, c // 4, 2 * e, 2 * e]}


def _jpeg(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=90)
    return buf.getvalue()
