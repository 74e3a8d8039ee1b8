"""Host-side memory bank: per-object frame outputs and the fixed slot layout of one tracking step.

Frame selection is upstream ``SAM2Base._prepare_memory_conditioned_features`` at eval
(``max_cond_frames_in_attn=-1``, temporal stride 1, pointers only from the past of the tracking
direction): every conditioning frame (t_pos 0) and the previous ``num_maskmem - 1`` frames in the
tracking direction that have non-conditioning outputs; object pointers from those conditioning
frames and up to ``min(num_frames, max_obj_ptrs) - 1`` previous frames. They fill the graph's fixed
slots; the rest are marked empty. Upstream has no bound on conditioning frames: when more frames
are selected than there are slots, the conditioning frames farthest in time are left out first
(``Selection.dropped`` counts them), the one place where this differs from upstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.runtime.video.backend import MemoryInputs


@dataclass
class FrameOutput:
    """One object's result on one frame (upstream's compact ``current_out``)."""

    pred_masks: np.ndarray  # 1x1x4ex4e low-res logits
    obj_ptr: np.ndarray  # 1xC
    score: np.ndarray  # 1x1 object-score logit
    maskmem: np.ndarray | None = None  # 1xMxexe spatial memory, or 1xNxM perceiver tokens (None until encoded)


@dataclass
class ObjectMemory:
    """Outputs of one object, keyed by frame index, as upstream's ``output_dict_per_obj``."""

    cond: dict[int, FrameOutput] = field(default_factory=dict)
    non_cond: dict[int, FrameOutput] = field(default_factory=dict)
    temp_cond: dict[int, FrameOutput] = field(default_factory=dict)
    temp_non_cond: dict[int, FrameOutput] = field(default_factory=dict)

    def lookup(self, frame_idx: int, is_cond: bool) -> FrameOutput | None:
        """Upstream's order: temporary output of this kind, then conditioning, then non-conditioning."""
        temp = self.temp_cond if is_cond else self.temp_non_cond
        for store in (temp, self.cond, self.non_cond):
            if frame_idx in store:
                return store[frame_idx]
        return None

    def clear(self) -> None:
        for store in (self.cond, self.non_cond, self.temp_cond, self.temp_non_cond):
            store.clear()


@dataclass
class Selection:
    inputs: MemoryInputs
    spatial: list[int]  # frame indices in the spatial slots, slot order
    pointers: list[int]  # frame indices of the pointer slots, slot order
    dropped: int  # frames selected by upstream's rule that found no slot


def _spatial_entries(mem: ObjectMemory, frame_idx: int, vcfg: Sam2VideoConfig, reverse: bool) -> list:
    """[(t_pos, frame, output)]: conditioning frames (t_pos 0, nearest first), then previous frames."""
    cond = sorted(mem.cond.items(), key=lambda kv: abs(kv[0] - frame_idx))
    entries = [(0, t, out) for t, out in cond]
    for t_pos in range(1, vcfg.num_maskmem):
        t_rel = vcfg.num_maskmem - t_pos
        prev = frame_idx + t_rel if reverse else frame_idx - t_rel
        if prev in mem.non_cond:
            entries.append((t_pos, prev, mem.non_cond[prev]))
    return entries


def _pointer_entries(mem: ObjectMemory, frame_idx: int, num_frames: int, vcfg: Sam2VideoConfig, reverse: bool):
    """[(signed distance, frame, output)] and t_max, as upstream's ``pos_and_ptrs``."""
    max_ptrs = min(num_frames, vcfg.max_obj_ptrs)
    sign = -1 if reverse else 1
    past = [(t, o) for t, o in mem.cond.items() if (t >= frame_idx if reverse else t <= frame_idx)]
    past.sort(key=lambda kv: abs(kv[0] - frame_idx))
    entries = [((frame_idx - t) * sign, t, o) for t, o in past]
    for t_diff in range(1, max_ptrs):
        t = frame_idx + t_diff if reverse else frame_idx - t_diff
        if t < 0 or t >= num_frames:
            break
        if t in mem.non_cond:
            entries.append((t_diff, t, mem.non_cond[t]))
    return entries, max(1, max_ptrs - 1)


def _fit(entries: list, slots: int) -> tuple[list, int]:
    """Keep at most ``slots`` entries: conditioning entries (first, nearest first) give way from the far end."""
    if len(entries) <= slots:
        return entries, 0
    n_cond = sum(1 for e in entries if e[0] == 0)
    others = entries[n_cond:]
    keep_cond = max(1, slots - len(others)) if n_cond else 0
    kept = (entries[:keep_cond] + others)[:slots]
    return kept, len(entries) - len(kept)


def select_memory(
    mem: ObjectMemory, frame_idx: int, num_frames: int, cfg: Sam2Config, vcfg: Sam2VideoConfig, reverse: bool
) -> Selection:
    """The fixed-shape memory-attention inputs for one object on one frame."""
    e, C = cfg.image_embedding_size, cfg.d_model
    K, P = vcfg.memory_slots, vcfg.max_obj_ptrs
    spatial, drop_s = _fit(_spatial_entries(mem, frame_idx, vcfg, reverse), K)
    ptr_entries, t_max = _pointer_entries(mem, frame_idx, num_frames, vcfg, reverse)
    # pointer entries: conditioning ones are those with a frame in mem.cond; mark them for _fit
    tagged = [(0 if t in mem.cond else 1, d, t, o) for d, t, o in ptr_entries]
    kept, drop_p = _fit(tagged, P)
    inputs = MemoryInputs(
        mem_feats=np.zeros((K, *vcfg.memory_frame_shape(e)), np.float32),
        mem_tpos=np.zeros((1, K), np.float32),
        mem_valid=np.zeros((1, K), np.float32),
        ptrs=np.zeros((P, C), np.float32),
        ptr_pos=np.zeros((1, P), np.float32),
        ptr_valid=np.zeros((1, P), np.float32),
    )
    for i, (t_pos, _, out) in enumerate(spatial):
        inputs.mem_feats[i] = out.maskmem[0]
        inputs.mem_tpos[0, i] = vcfg.num_maskmem - t_pos - 1
        inputs.mem_valid[0, i] = 1.0
    for i, (_, d, _, out) in enumerate(kept):
        inputs.ptrs[i] = out.obj_ptr[0]
        inputs.ptr_pos[0, i] = np.float32(d) / np.float32(t_max)
        inputs.ptr_valid[0, i] = 1.0
    return Selection(inputs, [t for _, t, _ in spatial], [t for _, _, t, _ in kept], drop_s + drop_p)
