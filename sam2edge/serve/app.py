"""``sam2edge serve``: the tap-to-segment web app (server side).

With a LiteRT bundle every model stage runs in the page (LiteRT.js, see ``static/``): the image encoder on each
photo and clip frame, the decoder per tap, the video graphs while tracking; the server decodes uploads and
keeps the photos and clips. It encodes (``/features.bin``) and decodes (``/decode``) only as the fallback: a
bundle without a LiteRT encoder or decoder, a browser that cannot run them, or ``?encode=server`` /
``?decoder=server`` on the page. Coordinates sent to ``/decode`` are model-input pixels (X, Y) in [0, S), labels
as the backend contract (1 fg, 0 bg, 2/3 box corners, -1 pad), in upstream's order (box corners, points, one pad).

API (JSON errors ``{"error": ...}`` with a 4xx status):
  GET  /api/info                         model facts, browser decoder assets, limits, samples
  POST /api/session                      -> {"session": token}; send it as ``X-Session`` on every call below
  POST /api/images[?sample=NAME][&encode=page]  body = photo file -> {"id", "width", "height", "features",
                                         "encode_ms"}; encode=page: no encoder run here (features on demand)
  GET  /api/images/ID/photo.png          the photo as encoded (orientation applied)
  GET  /api/images/ID/features.bin       image_embed | feat_s0 | feat_s1, float32 little-endian, C order
  POST /api/images/ID/decode             {"coords": [[x, y], ...], "labels": [...]} -> masks | iou | single_mask
                                         | single_iou | object_score, float32 little-endian
  POST /api/images/ID/everything[?points_per_side=N]  segment everything (``serve.everything``; offered when
                                         /api/info says ``everything``) -> overlay PNG, header X-Masks
  POST /api/videos, GET /api/videos/ID/{frame,pixels,features}/N   tracking in the page (``serve.clips``; offered when
                                         /api/info has ``video``: a LiteRT bundle exported with --video)
Isolation: image ids are ``secrets.token_urlsafe(16)`` and belong to the session that opened them; any
other session gets 404 for them, as for an id that never existed.
"""

from __future__ import annotations

import io
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.checks.fidelity import PHOTOS, photo_path
from sam2edge.config import config_name
from sam2edge.errors import UserError
from sam2edge.extras import NPM_FIX
from sam2edge.runtime.backends import Backend, Features, has_batched_decoder
from sam2edge.runtime.preprocess import load_image, preprocess
from sam2edge.serve import everything
from sam2edge.serve.assets import (
    STATIC_DIR,
    BrowserDecoder,
    BrowserEncoder,
    BrowserTracker,
    litertjs_version,
    node_modules,
    vendor_mounts,
)
from sam2edge.serve.clips import Clips
from sam2edge.serve.uploads import MAX_PROMPT_POINTS, decode_upload, encode_png, parse_prompt
from sam2edge.serve.web import Handler, HttpError, Mounts, WebServer

FEATURE_ORDER = ("image_embed", "feat_s0", "feat_s1")
BUSY_WAIT_S = 20.0  # an upload waits this long for a decode slot, then gets 503


@dataclass
class Limits:
    max_upload_bytes: int = 25_000_000
    max_pixels: int = 50_000_000
    max_images: int = 16  # photos kept in memory, all sessions together (oldest dropped first)
    max_sessions: int = 1000
    max_decodes: int = 2  # uploads read + decoded at once (each can hold ~0.5 GB at 50 MP); others wait


@dataclass
class Photo:
    session: str
    png: bytes  # the photo as encoded (orientation applied), PNG
    hw: tuple[int, int]
    features: Features | None  # None until the server encodes it (the page encodes with encode=page)
    features_bin: bytes  # image_embed | feat_s0 | feat_s1, float32 little-endian (b"" while features is None)


class App:
    """State of one server: the encoder backend, the browser decoder (or None), photos per session."""

    def __init__(
        self,
        backend: Backend,
        decoder: BrowserDecoder | None,
        decoder_note: str = "",
        limits: Limits | None = None,
        provenance: dict | None = None,
    ) -> None:
        self.backend, self.decoder, self.decoder_note = backend, decoder, decoder_note
        self.limits = limits or Limits()
        self.provenance = provenance or {}
        self.nm = node_modules()
        if self.nm is None and decoder is not None:
            self.decoder_note = f"LiteRT.js is not installed; {NPM_FIX}"
        self._photos: OrderedDict[str, Photo] = OrderedDict()
        self._sessions: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()  # guards the dicts
        self._model_lock = threading.Lock()  # one encode / decode at a time (2 cores; backends are not re-entrant)
        self.stored = None  # serve.stored.StoredImages when serving a store of embeddings (--embeddings)
        self.encoder: BrowserEncoder | None = None  # the encoder the page runs (a LiteRT bundle's)
        self.encoder_note = "serve a LiteRT bundle (serve --model DIR) to encode in the page"
        self.tracker: BrowserTracker | None = None  # the video graphs the page tracks with (enable_tracking)
        self.clips: Clips | None = None
        self.tracker_note = "serve a LiteRT bundle exported with --video to track videos in the page"
        self._decode_slots = threading.BoundedSemaphore(self.limits.max_decodes)

    def enable_tracking(self, predictor, tracker: BrowserTracker) -> None:
        """Offer tracking in the page: ``predictor`` (a ``Sam2VideoPredictor`` of the same bundle) encodes the
        uploaded clips' frames; the page runs ``tracker``'s graphs."""
        self.tracker, self.clips = tracker, Clips(predictor, self._model_lock)

    # ---- server ---------------------------------------------------------------------------
    def make_server(self, host: str = "127.0.0.1", port: int = 0, verbose: bool = False) -> WebServer:
        mounts = {"/static/": STATIC_DIR}
        if self.nm is not None:
            mounts.update(vendor_mounts(self.nm))
        routes = {
            ("GET", "/"): lambda h, p, q: h.send_file(STATIC_DIR / "index.html"),
            ("GET", "/api/info"): lambda h, p, q: h.send_json(self.info()),
            ("POST", "/api/session"): lambda h, p, q: h.send_json({"session": self.new_session()}),
            ("POST", "/api/images"): self._post_image,
            ("GET", "/api/images/*"): self._get_image_part,
            ("POST", "/api/images/*"): self._post_decode,
            ("POST", "/api/videos"): self._post_video,
            ("GET", "/api/videos/*"): self._get_video_part,
            ("GET", "/model/*"): self._get_model_file,
        }
        return WebServer(host, port, Mounts(mounts), routes, verbose)

    def info(self) -> dict:
        cfg = self.backend.cfg
        e = cfg.image_embedding_size
        source = self.provenance.get("source") or self.provenance
        synthetic = source.get("checkpoint") == "synthetic"
        return {
            "resolution": cfg.image_size,
            "model": str(self.provenance.get("config") or config_name(cfg)),  # the page's title
            "embed_size": e,
            "mask_side": 4 * e,
            "d_model": cfg.d_model,
            "encoder_backend": self.backend.name,
            "server_prompt_slots": getattr(self.backend, "num_tokens", MAX_PROMPT_POINTS),
            "synthetic_weights": synthetic,
            "decoder": self.decoder.describe("/model/") if (self.decoder and self.nm) else None,
            "decoder_note": self.decoder_note,
            "encoder": self.encoder.describe("/model/") if (self.encoder and self.nm) else None,
            "encoder_note": self.encoder_note,
            "litertjs_version": litertjs_version(self.nm) if self.nm else None,
            "limits": {
                "max_upload_mb": self.limits.max_upload_bytes / 1e6,
                "max_megapixels": self.limits.max_pixels / 1e6,
            },
            "everything": has_batched_decoder(self.backend),  # the "segment everything" button
            "samples": list(PHOTOS),
            "stored": self.stored.names() if self.stored else [],
            "video": self._video_info(),
            "video_note": self.tracker_note,
        }

    def _video_info(self) -> dict | None:
        if self.tracker is None or self.clips is None or self.nm is None:
            return None
        return {
            **self.tracker.describe("/model/"),
            "fill_hole_area": self.clips.predictor.fill_hole_area,
            "stability": {"delta": self.backend.cfg.stability_delta, "thresh": self.backend.cfg.stability_thresh},
            "max_frames": self.clips.limits.max_frames,
            "features": self.clips.shapes(),
        }

    # ---- sessions and photos --------------------------------------------------------------
    def new_session(self) -> str:
        token = secrets.token_urlsafe(16)
        with self._lock:
            self._sessions[token] = time.time()
            while len(self._sessions) > self.limits.max_sessions:
                old, _ = self._sessions.popitem(last=False)
                for k in [k for k, p in self._photos.items() if p.session == old]:
                    del self._photos[k]
        return token

    def _session(self, h: Handler) -> str:
        token = h.headers.get("X-Session", "")
        with self._lock:
            if token not in self._sessions:
                raise HttpError(401, "no valid session; reload the page to start a new one")
        return token

    def _photo(self, h: Handler, image_id: str) -> Photo:
        session = self._session(h)
        with self._lock:
            photo = self._photos.get(image_id)
        if photo is None or not secrets.compare_digest(photo.session, session):
            raise HttpError(404, "no such image (it may have expired); open the photo again")
        return photo

    def add_photo(
        self, session: str, rgb: np.ndarray, feats: Features | None = None, encode: bool = True
    ) -> tuple[str, Photo, float]:
        """Encode ``rgb`` (HxWx3 uint8; or take its stored ``feats``: no encoder run; ``encode`` False: the page
        encodes it, the server only when asked) and keep it under a fresh id -> (id, photo, encode milliseconds)."""
        t0 = time.perf_counter()
        photo = Photo(session, encode_png(rgb), rgb.shape[:2], feats, b"")
        if feats is not None or encode:
            self._features(photo, rgb)
        ms = (time.perf_counter() - t0) * 1e3
        image_id = secrets.token_urlsafe(16)
        with self._lock:
            self._photos[image_id] = photo
            while len(self._photos) > self.limits.max_images:
                self._photos.popitem(last=False)
        return image_id, photo, ms

    def _features(self, photo: Photo, rgb: np.ndarray | None = None) -> Features:
        """The photo's features, encoded here on first use (``rgb``: its pixels, else read back from the PNG)."""
        if photo.features is None:
            if rgb is None:
                from PIL import Image

                rgb = np.asarray(Image.open(io.BytesIO(photo.png)).convert("RGB"))
            x = preprocess(rgb, self.backend.cfg.image_size).numpy()  # 1x3xSxS
            with self._model_lock:
                photo.features = self.backend.encode(x)
        if not photo.features_bin:
            parts = [np.ascontiguousarray(getattr(photo.features, k), dtype="<f4").tobytes() for k in FEATURE_ORDER]
            photo.features_bin = b"".join(parts)
        return photo.features

    # ---- routes ---------------------------------------------------------------------------
    def _post_image(self, h: Handler, path: str, query: dict) -> None:
        session = self._session(h)
        sample, stored, feats = (query.get("sample") or [None])[0], (query.get("stored") or [None])[0], None
        where = (query.get("encode") or ["server"])[0]
        if where not in ("server", "page"):
            raise HttpError(400, f"encode={where[:40]!r}: use encode=server (the default) or encode=page")
        encode = where == "server"  # page: the page runs the encoder
        if stored is not None and self.stored is not None:
            rgb, feats = self.stored.load(stored)
            image_id, photo, ms = self.add_photo(session, rgb, feats)
        elif sample is not None:
            if sample not in PHOTOS:
                raise HttpError(404, f"no sample {sample[:40]!r}; pick one of {', '.join(PHOTOS)}")
            if int(h.headers.get("Content-Length") or 0):
                h.read_body(1024)
            rgb = load_image(photo_path(sample))
            image_id, photo, ms = self.add_photo(session, rgb, encode=encode)
        else:
            if not self._decode_slots.acquire(timeout=BUSY_WAIT_S):
                raise HttpError(503, "the server is busy decoding other photos; try again in a moment")
            try:  # the upload, its pixels and their encoding: at most max_decodes at once
                rgb = decode_upload(h.read_body(self.limits.max_upload_bytes), self.limits.max_pixels)
                image_id, photo, ms = self.add_photo(session, rgb, encode=encode)
            finally:
                self._decode_slots.release()
        h.send_json(
            {
                "id": image_id,
                "width": int(rgb.shape[1]),
                "height": int(rgb.shape[0]),
                "features": {k: list(getattr(photo.features, k).shape) for k in FEATURE_ORDER}
                if photo.features is not None
                else None,
                "encode_ms": round(ms, 1) if photo.features is not None else None,
            }
        )

    def _split(self, path: str) -> tuple[str, str]:
        parts = path[len("/api/images/") :].split("/")
        if len(parts) != 2:
            raise HttpError(404, f"no such page: {path[:80]}")
        return parts[0], parts[1]

    def _get_image_part(self, h: Handler, path: str, query: dict) -> None:
        image_id, part = self._split(path)
        photo = self._photo(h, image_id)
        if part == "photo.png":
            h.send_body(200, photo.png, "image/png")
        elif part == "features.bin":
            self._features(photo)
            h.send_body(200, photo.features_bin, "application/octet-stream")
        else:
            raise HttpError(404, f"no such image part {part[:40]!r}; use photo.png or features.bin")

    def _post_decode(self, h: Handler, path: str, query: dict) -> None:
        image_id, part = self._split(path)
        if part not in ("decode", "everything"):
            raise HttpError(404, f"no such action {part[:40]!r}; POST .../decode or .../everything")
        photo = self._photo(h, image_id)
        if part == "everything":
            return self._everything(h, photo, query)
        coords, labels = parse_prompt(h.read_body(64_000), self.backend.cfg.image_size)
        feats = self._features(photo)  # before the model lock: encoding takes it
        try:
            with self._model_lock:
                out = self.backend.decode(feats, coords, labels, None)
        except (UserError, ValueError) as e:  # e.g. more points than the bundle's prompt slots
            raise HttpError(400, str(e).splitlines()[0][:200]) from None
        arrays = (out.masks, out.iou, out.single_mask, out.single_iou, out.object_score)
        h.send_body(
            200, b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrays), "application/octet-stream"
        )

    def _everything(self, h: Handler, photo: Photo, query: dict) -> None:
        from PIL import Image

        try:
            side = everything.points_per_side(query)
            rgb = np.asarray(Image.open(io.BytesIO(photo.png)).convert("RGB"))
            feats = self._features(photo, rgb)  # before the model lock: encoding takes it
            with self._model_lock:
                png, count = everything.segment_everything(self.backend, rgb, feats, side)
        except (UserError, ValueError) as e:
            raise HttpError(400, str(e).splitlines()[0][:200]) from None
        h.send_body(200, png, "image/png", {"X-Masks": str(count)})

    def _post_video(self, h: Handler, path: str, query: dict) -> None:
        session = self._session(h)
        if self.clips is None:
            raise HttpError(404, f"tracking is not offered here; {self.tracker_note}")
        if not self._decode_slots.acquire(timeout=BUSY_WAIT_S):
            raise HttpError(503, "the server is busy decoding other uploads; try again in a moment")
        try:
            clip_id, clip = self.clips.add(session, h.read_body(self.limits.max_upload_bytes), self.limits.max_pixels)
        finally:
            self._decode_slots.release()
        st = clip.state
        info = {"width": st.video_width, "height": st.video_height, "num_frames": st.num_frames, "fps": clip.fps}
        h.send_json({"id": clip_id, **info})

    def _get_video_part(self, h: Handler, path: str, query: dict) -> None:
        parts = path[len("/api/videos/") :].split("/")
        if self.clips is None or len(parts) != 3 or parts[1] not in ("frame", "pixels", "features"):
            use = "/api/videos/ID/frame/N, .../pixels/N or .../features/N"
            raise HttpError(404, f"no such page: {path[:80]}; use {use}")
        clip = self.clips.get(self._session(h), parts[0])
        index = self.clips.frame_index(clip, parts[2])
        if parts[1] == "frame":
            h.send_body(200, clip.jpegs[index], "image/jpeg")
        elif parts[1] == "pixels":
            h.send_body(200, self.clips.pixels(clip, index), "application/octet-stream")
        else:
            h.send_body(200, self.clips.features(clip, index), "application/octet-stream")

    def _get_model_file(self, h: Handler, path: str, query: dict) -> None:
        name = path[len("/model/") :]
        assets = (self.encoder, self.decoder, self.tracker)
        owner = next((a for a in assets if a is not None and name in a.files), None)
        if owner is None:
            raise HttpError(404, f"no such model file {name[:60]!r}")
        h.send_file(owner.folder / name)


def serve_forever(app: App, host: str, port: int, open_message: bool = True) -> None:
    server = app.make_server(host, port, verbose=False)
    if open_message:
        print(f"sam2edge serve: open {server.url}/ (Ctrl+C to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def default_app_from_args(model: str | None, checkpoint: str | None, config: str | None) -> App:
    """--model DIR (encoder from the bundle's runtime, decoder in the browser) or eager weights (server decode)."""
    from sam2edge.config import CONFIGS
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.serve.assets import browser_decoder, browser_encoder

    if model:
        pred = Sam2Predictor.from_export(Path(model))
        decoder, note = browser_decoder(Path(model))
        app = App(pred.backend, decoder, note, provenance=pred.provenance)
        app.encoder, app.encoder_note = browser_encoder(Path(model))
        if app.encoder is not None and app.nm is None:
            app.encoder_note = app.decoder_note  # LiteRT.js is not installed
        enable_bundle_tracking(app, Path(model))
        return app
    pred = Sam2Predictor.from_checkpoint(checkpoint, CONFIGS[config] if config else None)  # None: size from weights
    return App(pred.backend, None, "no LiteRT bundle given (serve --model DIR)", provenance=pred.provenance)


def enable_bundle_tracking(app: App, bundle: Path) -> None:
    """Offer tracking in the page when ``bundle`` has LiteRT video graphs (its image backend encodes frames)."""
    from sam2edge.runtime.video.bundle import open_video_bundle
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor
    from sam2edge.serve.assets import browser_tracker

    tracker, note = browser_tracker(bundle)
    if tracker is None:
        app.tracker_note = note
        return
    backend, card = open_video_bundle(bundle, image=app.backend)
    app.enable_tracking(Sam2VideoPredictor(backend, card.get("source", {})), tracker)
