"""``Sam2VideoPredictor``: upstream ``SAM2VideoPredictor``'s API over a ``VideoBackend``.

Coordinate frames: ``points`` Nx2 (X, Y) and ``box`` XYXY are in video pixels
(``normalize_coords=True``) or in [0, 1] (``normalize_coords=False``), as upstream. Returned
``video_res_masks`` are (num_objects, 1, H, W) logits at video resolution (torch tensors, as upstream);
``> 0`` is the mask. Objects tracked on a frame go through memory attention, the decoder and the memory
encoder as one batch (``batch``; upstream runs them one at a time, and batching them is exact).

Differences from upstream: frames are uint8 at model resolution, normalised when encoded; the memory graph has
fixed slots (``memory_bank``). Hole filling: the predictor fills small background holes (``fill_hole_area = 8``
low-resolution pixels, 8-connected, on the host with scipy; 0 turns it off) as upstream's video predictor does on
CUDA, while upstream on a CPU skips that step with a warning (its connected components are a CUDA kernel), so on
a CPU upstream's masks can keep holes that ours fill (``tests/test_video_parity.py::test_hole_filling_end_to_end``
compares a whole session with upstream given a CPU stand-in for its connected components).
``from_export``: the same API over an export bundle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.errors import UserError
from sam2edge.runtime.video.backend import EagerVideoBackend, FrameFeatures, VideoBackend
from sam2edge.runtime.video.batch import select_output, track_objects
from sam2edge.runtime.video.io import read_frames
from sam2edge.runtime.video.masks import fill_holes
from sam2edge.runtime.video.memory_bank import FrameOutput, ObjectMemory, select_memory
from sam2edge.validate import check_index, check_int, check_mask_2d, check_propagation, check_video_prompt

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
MASK_OUT_SCALE, MASK_OUT_BIAS = 20.0, -10.0  # mask prompt as output: logits = mask * 20 - 10


class TrackingError(UserError):
    """Bad prompt or state; the message names the problem and the fix."""


@dataclass
class VideoState:
    """Upstream's ``inference_state``; ``state["num_frames"]`` style access works for its public keys."""

    frames: list[np.ndarray]  # SxSx3 uint8, resized as upstream (PIL bicubic)
    video_height: int
    video_width: int
    obj_ids: list[int] = field(default_factory=list)
    points: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)  # obj_idx -> frame
    masks: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # obj_idx -> frame -> 1x1xSxS
    memory: dict[int, ObjectMemory] = field(default_factory=dict)  # obj_idx -> outputs
    tracked: dict[int, dict[int, bool]] = field(default_factory=dict)  # obj_idx -> frame -> reverse
    cache: dict[int, FrameFeatures] = field(default_factory=dict)  # the most recent frame's features
    dropped_slots: int = 0  # frames upstream would attend to that found no slot (see memory_bank)

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    def __getitem__(self, key: str):
        return getattr(self, key)


class Sam2VideoPredictor:
    """Upstream ``SAM2VideoPredictor``'s API over the eager model or a ``--video`` bundle: ``init_state``, prompts on
    any frame, then ``propagate_in_video``. Coordinates are (x, y) pixels of the original frames (H x W), origin
    at the top-left corner, unless ``normalize_coords=False`` (then in the model's ``image_size`` square frame)."""

    def __init__(self, backend: VideoBackend, provenance: dict | None = None, fill_hole_area: int = 8) -> None:
        self.backend = backend
        self.fill_hole_area = fill_hole_area  # fill background holes of <= this many low-res pixels (0: off)
        self.cfg: Sam2Config = backend.cfg
        self.vcfg: Sam2VideoConfig = backend.vcfg
        self.image_size = self.cfg.image_size
        self.provenance = provenance or {}

    @classmethod
    def from_checkpoint(
        cls,
        path_or_id: str | None = None,
        cfg: Sam2Config | None = None,
        vcfg: Sam2VideoConfig | None = None,
        fill_hole_area: int = 8,
    ) -> Sam2VideoPredictor:
        """Eager fp32 predictor from a .pt / .safetensors path, hub id or None (synthetic); model: the checkpoint's."""
        from sam2edge.weights.video import load_video_weights, video_configs

        sd, prov = load_video_weights(path_or_id, *(configs := video_configs(path_or_id, cfg, vcfg)))
        return cls(EagerVideoBackend.from_state_dict(sd, *configs), prov, fill_hole_area)

    @classmethod
    def from_export(cls, folder, threads: int | None = None, fill_hole_area: int = 8) -> Sam2VideoPredictor:
        """Track from a bundle of ``sam2edge export --video`` (LiteRT, ONNX or ExecuTorch); same API."""
        from sam2edge.runtime.video.bundle import open_video_bundle

        backend, card = open_video_bundle(folder, threads=threads)
        return cls(backend, {**card.get("source", {}), "bundle": str(folder)}, fill_hole_area)

    def init_state(
        self,
        video_path,
        offload_video_to_cpu: bool = False,
        offload_state_to_cpu: bool = False,
        async_loading_frames: bool = False,
    ) -> VideoState:
        """Read a JPEG or PNG frame folder, a video file (PyAV) or a list of HxWx3 uint8 frames.

        The offload / async flags are upstream's; on the CPU they change nothing and are accepted as no-ops.
        """
        frames = read_frames(video_path)
        h, w = frames[0].shape[:2]
        s = self.image_size
        small = [np.asarray(Image.fromarray(f).resize((s, s))) for f in frames]  # upstream: PIL resize
        return VideoState(small, h, w)

    def reset_state(self, state: VideoState) -> None:
        state.obj_ids.clear()
        for d in (state.points, state.masks, state.memory, state.tracked):
            d.clear()

    def _obj_idx(self, state: VideoState, obj_id: int) -> int:
        if obj_id in state.obj_ids:
            return state.obj_ids.index(obj_id)
        state.obj_ids.append(obj_id)
        idx = len(state.obj_ids) - 1
        state.points[idx], state.masks[idx], state.tracked[idx] = {}, {}, {}
        state.memory[idx] = ObjectMemory()
        return idx

    def _check_frame(self, state: VideoState, frame_idx: int) -> None:
        check_index("frame_idx", frame_idx, state.num_frames)

    # ---- prompts ------------------------------------------------------------------------
    def add_new_points_or_box(
        self,
        inference_state: VideoState,
        frame_idx: int,
        obj_id: int,
        points=None,
        labels=None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box=None,
    ):
        """Points and/or a box for object ``obj_id`` (any int) on frame ``frame_idx`` -> (frame_idx, obj_ids, masks).

        points: (N, 2) float (x, y) pixels; labels: (N,) int, 1 object / 0 background; box: (4,) float X0, Y0, X1,
        Y1 pixels. masks: float32 tensor (num_objects, 1, H, W) logits at the video's size, > 0 is the object."""
        state = inference_state
        frame_idx, points, labels, box = check_video_prompt(frame_idx, state.num_frames, obj_id, points, labels, box)
        coords, labs = self._prompt_points(state, points, labels, box, clear_old_points, normalize_coords)
        idx = self._obj_idx(state, obj_id)
        if not clear_old_points and frame_idx in state.points[idx]:
            old_c, old_l = state.points[idx][frame_idx]
            coords, labs = np.concatenate([old_c, coords]), np.concatenate([old_l, labs])
        state.points[idx][frame_idx] = (coords, labs)
        state.masks[idx].pop(frame_idx, None)
        return self._add_prompt(state, idx, frame_idx, (coords, labs), None)

    def add_new_points(self, *args, **kwargs):
        return self.add_new_points_or_box(*args, **kwargs)

    def add_new_mask(self, inference_state: VideoState, frame_idx: int, obj_id: int, mask):
        """A binary (H, W) mask (bool or 0/1, the video's size) for ``obj_id`` on one frame (used as that frame's
        output, as upstream) -> (frame_idx, obj_ids, masks (num_objects, 1, H, W) logits)."""
        state = inference_state
        frame_idx, _ = check_index("frame_idx", frame_idx, state.num_frames), check_int("obj_id", obj_id)
        m = torch.as_tensor(check_mask_2d("mask", mask))
        if m.dim() != 2:
            raise TrackingError(f"mask must be 2-D (H, W), got shape {tuple(m.shape)}")
        s = self.image_size
        x = m[None, None].float()
        if tuple(m.shape) != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False, antialias=True)
            x = (x >= 0.5).float()
        idx = self._obj_idx(state, obj_id)
        state.masks[idx][frame_idx] = x.numpy()
        state.points[idx].pop(frame_idx, None)
        return self._add_prompt(state, idx, frame_idx, None, x.numpy())

    def _prompt_points(self, state, points, labels, box, clear_old_points, normalize_coords):
        """Upstream's layout: box corners (labels 2, 3) then points, in model-input pixels (float32)."""
        if (points is None) != (labels is None):
            raise TrackingError("points and labels must be provided together")
        if points is None and box is None:
            raise TrackingError("at least one of points or box must be provided as input")
        p = np.zeros((0, 2), np.float32) if points is None else np.asarray(points, np.float32).reshape(-1, 2)
        lab = np.zeros(0, np.int32) if labels is None else np.asarray(labels, np.int32).reshape(-1)
        if len(p) != len(lab):
            raise TrackingError(f"{len(p)} points but {len(lab)} labels; give one label per point")
        if box is not None:
            if not clear_old_points:
                raise TrackingError("cannot add a box without clearing old points; pass clear_old_points=True")
            p = np.concatenate([np.asarray(box, np.float32).reshape(2, 2), p])
            lab = np.concatenate([np.array([2, 3], np.int32), lab])
        if normalize_coords:
            p = p / np.array([state.video_width, state.video_height], np.float32)
        return p * np.float32(self.image_size), lab

    def _add_prompt(self, state: VideoState, idx: int, frame_idx: int, points, mask):
        mem = state.memory[idx]
        is_init = frame_idx not in state.tracked[idx]
        reverse = False if is_init else state.tracked[idx][frame_idx]
        prev = None
        if points is not None:
            prior = mem.lookup(frame_idx, is_init)
            if prior is not None:
                prev = np.clip(prior.pred_masks, -32.0, 32.0)
        out = self._infer(state, idx, frame_idx, is_init, points, mask, reverse, False, prev)
        (mem.temp_cond if is_init else mem.temp_non_cond)[frame_idx] = out
        return frame_idx, list(state.obj_ids), self._consolidate(state, frame_idx, is_init)

    def clear_all_prompts_in_frame(self, inference_state: VideoState, frame_idx: int, obj_id: int, need_output=True):
        state = inference_state
        idx = self._obj_idx(state, obj_id)
        state.points[idx].pop(frame_idx, None)
        state.masks[idx].pop(frame_idx, None)
        mem = state.memory[idx]
        mem.temp_cond.pop(frame_idx, None)
        mem.temp_non_cond.pop(frame_idx, None)
        out = mem.cond.pop(frame_idx, None)
        if out is not None:
            mem.non_cond[frame_idx] = out
            state.tracked[idx].pop(frame_idx, None)
        if not need_output:
            return None
        is_cond = any(frame_idx in m.temp_cond for m in state.memory.values())
        return frame_idx, list(state.obj_ids), self._consolidate(state, frame_idx, is_cond)

    def remove_object(self, inference_state: VideoState, obj_id: int, strict: bool = False, need_output=True):
        state = inference_state
        if obj_id not in state.obj_ids:
            if strict:
                raise TrackingError(f"object {obj_id} does not exist; known objects: {state.obj_ids}")
            return list(state.obj_ids), []
        if len(state.obj_ids) == 1:
            self.reset_state(state)
            return list(state.obj_ids), []
        old = state.obj_ids.index(obj_id)
        frames = sorted(set(state.points[old]) | set(state.masks[old]))
        for f in frames:
            self.clear_all_prompts_in_frame(state, f, obj_id, need_output=False)
        state.obj_ids.pop(old)
        for d in (state.points, state.masks, state.memory, state.tracked):
            items = [d[i] for i in sorted(d) if i != old]
            d.clear()
            d.update(enumerate(items))
        updated = []
        if need_output:
            for f in frames:
                is_cond = any(f in m.temp_cond for m in state.memory.values())
                updated.append((f, self._consolidate(state, f, is_cond)))
        return list(state.obj_ids), updated

    # ---- propagation ----------------------------------------------------------------------
    def propagate_in_video_preflight(self, state: VideoState) -> None:
        if not state.obj_ids:
            raise TrackingError("no points, box or mask given for any object; add a prompt first")
        for idx, mem in state.memory.items():
            for temp, store in ((mem.temp_non_cond, mem.non_cond), (mem.temp_cond, mem.cond)):
                for f, out in temp.items():
                    if out.maskmem is None:
                        feats = self.frame_features(state, f)
                        out.maskmem = self.backend.encode_memory(feats.vision, out.pred_masks, True, out.score)
                    store[f] = out
                temp.clear()
            if not mem.cond:
                raise TrackingError(f"object {state.obj_ids[idx]} has no prompt; add points, a box or a mask first")
            for f in mem.cond:
                mem.non_cond.pop(f, None)

    def propagate_in_video(
        self,
        inference_state: VideoState,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, list[int], torch.Tensor]]:
        """Yield (frame_idx, obj_ids, video_res_masks) frame by frame: masks a float32 tensor (num_objects, 1, H, W)
        of logits at the video's size (> 0 is the object), objects in ``obj_ids`` order; ``reverse`` runs backwards
        from ``start_frame_idx`` (default: the first prompted frame)."""
        state = inference_state
        self.propagate_in_video_preflight(state)
        n = state.num_frames
        if start_frame_idx is None:
            start_frame_idx = min(t for m in state.memory.values() for t in m.cond)
        start_frame_idx = check_propagation(start_frame_idx, max_frame_num_to_track, n)
        span = n if max_frame_num_to_track is None else max_frame_num_to_track
        if reverse:
            end = max(start_frame_idx - span, 0)
            order = range(start_frame_idx, end - 1, -1) if start_frame_idx > 0 else range(0)
        else:
            end = min(start_frame_idx + span, n - 1)
            order = range(start_frame_idx, end + 1)
        for f in order:
            todo = [idx for idx, mem in state.memory.items() if f not in mem.cond]  # the rest: their prompt
            for idx, out in zip(todo, track_objects(self, state, todo, f, reverse) if todo else []):
                state.memory[idx].non_cond[f] = out
            for idx in state.memory:
                state.tracked[idx][f] = reverse
            per_obj = [mem.cond[f] if f in mem.cond else mem.non_cond[f] for mem in state.memory.values()]
            low = torch.from_numpy(np.concatenate([o.pred_masks for o in per_obj], axis=0))
            yield f, list(state.obj_ids), self._to_video(state, low)

    # ---- one object on one frame ------------------------------------------------------------
    def frame_features(self, state: VideoState, frame_idx: int) -> FrameFeatures:
        if frame_idx not in state.cache:
            x = (state.frames[frame_idx].astype(np.float64) / 255.0).astype(np.float32)
            x = ((x - MEAN) / STD).transpose(2, 0, 1)[None]  # (1, 3, S, S)
            state.cache.clear()
            state.cache[frame_idx] = self.backend.encode_frame(np.ascontiguousarray(x))
        return state.cache[frame_idx]

    def _infer(self, state, idx, frame_idx, is_init, points, mask, reverse, run_mem, prev) -> FrameOutput:
        """Upstream ``track_step`` for one object: mask-as-output, or memory + SAM heads; then memory."""
        feats = self.frame_features(state, frame_idx)
        if mask is not None:
            out = self._mask_as_output(feats, mask)
        else:
            if is_init:
                pix = self.backend.no_memory(feats.vision)
            else:
                sel = select_memory(state.memory[idx], frame_idx, state.num_frames, self.cfg, self.vcfg, reverse)
                state.dropped_slots += sel.dropped
                pix = self.backend.memory_attention(feats.vision, sel.inputs)
            out = self._sam_heads(pix, feats, points, prev)
        if run_mem:
            binarize = points is not None
            out.maskmem = self.backend.encode_memory(feats.vision, out.pred_masks, binarize, out.score)
        if self.fill_hole_area > 0:  # after the memory encoder, as upstream
            out.pred_masks = fill_holes(out.pred_masks, self.fill_hole_area)
        return out

    def _sam_heads(self, pix: np.ndarray, feats: FrameFeatures, points, prev) -> FrameOutput:
        """Decode with upstream's multimask rule (0 or 1 prompt points) and mask selection."""
        coords = np.zeros((0, 2), np.float32) if points is None else points[0]
        labels = np.zeros(0, np.float32) if points is None else points[1].astype(np.float32)
        multimask = len(labels) <= 1
        if points is None:  # upstream feeds one padding point, and the prompt encoder adds another
            coords, labels = np.zeros((1, 2), np.float32), np.full(1, -1.0, np.float32)
        coords = np.concatenate([coords, np.zeros((1, 2), np.float32)])[None]
        labels = np.concatenate([labels, np.full(1, -1.0, np.float32)])[None]
        return select_output(self.backend.decode(pix, feats, coords, labels, prev), multimask, self.cfg, self.vcfg)

    def _mask_as_output(self, feats: FrameFeatures, mask: np.ndarray) -> FrameOutput:
        """Upstream ``_use_mask_as_output``: the mask itself is the output; the pointer comes from SAM heads."""
        s4 = self.image_size // 4
        hi = torch.from_numpy(mask) * MASK_OUT_SCALE + MASK_OUT_BIAS
        low = F.interpolate(hi, size=(s4, s4), mode="bilinear", align_corners=False, antialias=True).numpy()
        coords, labels = np.zeros((1, 2, 2), np.float32), np.full((1, 2), -1.0, np.float32)
        dec = self.backend.decode(feats.vision, feats, coords, labels, self.backend.downsample_mask(mask))
        present = bool((mask > 0).any())
        ptr = dec.ptrs[:, 0] if present else self.backend.no_obj_ptr
        score = np.full((1, 1), MASK_OUT_SCALE * float(present) + MASK_OUT_BIAS, np.float32)
        return FrameOutput(low.astype(np.float32), ptr.astype(np.float32).copy(), score)

    # ---- outputs ------------------------------------------------------------------------------
    def _consolidate(self, state: VideoState, frame_idx: int, is_cond: bool) -> torch.Tensor:
        """Every object's mask on one frame at video resolution (absent objects: no-object logits)."""
        h, w = state.video_height, state.video_width
        out = torch.full((len(state.obj_ids), 1, h, w), self.vcfg.no_obj_score)
        for idx, mem in state.memory.items():
            o = mem.lookup(frame_idx, is_cond)
            if o is not None:
                out[idx : idx + 1] = F.interpolate(
                    torch.from_numpy(o.pred_masks), size=(h, w), mode="bilinear", align_corners=False
                )
        return out

    def _to_video(self, state: VideoState, low: torch.Tensor) -> torch.Tensor:
        h, w = state.video_height, state.video_width
        if tuple(low.shape[-2:]) == (h, w):
            return low
        return F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
