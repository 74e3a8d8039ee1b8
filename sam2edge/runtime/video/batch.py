"""Objects in one batch: every object tracked on a frame goes through memory attention, the decoder and the
memory encoder as one call of B rows (the frame's encoder run is shared already).

Upstream ``SAM2VideoPredictor.propagate_in_video`` runs each object separately (``batch_size=1``) through
these stages; objects never read each other's state, so stacking them on the batch dimension is exact: row b
of every stage is object b's single-object call. Each object keeps its own memory slots and pointers, with
validity masks where objects hold different numbers of memories (``memory_bank``). Shapes (K memory slots,
P pointer slots, C = d_model, e = S/16):

  stack_memory([MemoryInputs] * B) -> mem_feats (B*K, ...), mem_tpos / mem_valid (B, K), ptrs (B*P, C),
                                      ptr_pos / ptr_valid (B, P)
  track_objects(...)                -> one ``FrameOutput`` per object, as the single-object step would give
"""

from __future__ import annotations

import numpy as np

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.runtime.video.backend import MemoryInputs, VideoDecoded
from sam2edge.runtime.video.masks import fill_holes, stable_single_mask
from sam2edge.runtime.video.memory_bank import FrameOutput, select_memory


def stack_memory(inputs: list[MemoryInputs]) -> MemoryInputs:
    """B objects' slot layouts -> one batched ``MemoryInputs`` (object b's rows contiguous, in list order)."""
    fields = vars(inputs[0]).keys()
    return MemoryInputs(**{f: np.concatenate([getattr(m, f) for m in inputs], axis=0) for f in fields})


def decoded_row(dec: VideoDecoded, b: int) -> VideoDecoded:
    """Row b of a batched decoder answer (every field keeps its leading dimension of 1)."""
    return VideoDecoded(*(getattr(dec, f)[b : b + 1] for f in ("masks", "iou", "score", "ptrs")))


def select_output(dec: VideoDecoded, multimask: bool, cfg: Sam2Config, vcfg: Sam2VideoConfig) -> FrameOutput:
    """One object's frame output from its decoder row: upstream's multimask rule (the best of tokens 1-3 for
    0 or 1 prompt points, else the dynamic single mask) and no-object masking (score <= 0)."""
    if multimask:
        k = 1 + int(np.argmax(dec.iou[0, 1:]))
        mask, ptr = dec.masks[:, k : k + 1], dec.ptrs[:, k]
    else:
        mask, ptr = stable_single_mask(dec.masks, dec.iou, cfg), dec.ptrs[:, 0]
    if not dec.score[0, 0] > 0:
        mask = np.full_like(mask, vcfg.no_obj_score)
    return FrameOutput(mask.astype(np.float32), ptr.astype(np.float32), dec.score.astype(np.float32))


def track_objects(predictor, state, objects: list[int], frame_idx: int, reverse: bool) -> list[FrameOutput]:
    """Upstream ``track_step`` on one frame for the objects ``objects`` (indices) that have no prompt on it:
    memory attention, the SAM heads (no prompt: one padding point) and the memory encoder, each once with
    B = len(objects) rows; then hole filling per object. Returns their outputs in ``objects`` order."""
    backend, cfg, vcfg = predictor.backend, predictor.cfg, predictor.vcfg
    feats = predictor.frame_features(state, frame_idx)
    sels = [select_memory(state.memory[i], frame_idx, state.num_frames, cfg, vcfg, reverse) for i in objects]
    state.dropped_slots += sum(s.dropped for s in sels)
    pix = backend.memory_attention(feats.vision, stack_memory([s.inputs for s in sels]))  # (B, C, e, e)
    n = len(objects)
    coords = np.zeros((n, 2, 2), np.float32)  # upstream's padding point, then the prompt encoder's pad
    labels = np.full((n, 2), -1.0, np.float32)
    dec = backend.decode(pix, feats, coords, labels, None)
    outs = [select_output(decoded_row(dec, b), True, cfg, vcfg) for b in range(n)]
    low = np.concatenate([o.pred_masks for o in outs])  # (B, 1, 4e, 4e)
    scores = np.concatenate([o.score for o in outs])  # (B, 1)
    memory = backend.encode_memory(feats.vision, low, False, scores)  # (B, M, e, e) or (B, N, M)
    for b, out in enumerate(outs):
        out.maskmem = memory[b : b + 1]
        if predictor.fill_hole_area > 0:  # after the memory encoder, as upstream
            out.pred_masks = fill_holes(out.pred_masks, predictor.fill_hole_area)
    return outs
