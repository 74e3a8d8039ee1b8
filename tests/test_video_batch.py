"""Objects in one batch vs upstream SAM2VideoPredictor (which runs them one at a time): four objects prompted on
different frames (a click, a box, a mask on a later frame, a two-point prompt later still), a correction on a
tracked frame, forward then reverse, two seeds, test-small widths. Per frame and object: IoU >= 0.999, logits
cosine >= 0.9999; and the memory attention / decoder / memory encoder really ran with several objects per call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from tests.test_video_parity import COS_MIN, IOU_MIN, _compare, _ours_from
from tests.video_oracles import drifting_clip, upstream_video_predictor

FRAMES, SIZE = 5, (160, 120)


def _four_objects(pred, folder, w, h, n):
    """[(step, frame, obj_ids, masks)] of a four-object session (objects join on frames 0, 0, 1 and 3)."""
    out = []
    state = pred.init_state(video_path=str(folder))
    record = lambda step, r: out.append((step, r[0], list(r[1]), torch.as_tensor(r[2]).float().clone()))  # noqa: E731
    with torch.inference_mode():
        record("click", pred.add_new_points_or_box(state, 0, 1, points=[[0.45 * w, 0.4 * h]], labels=[1]))
        record("box", pred.add_new_points_or_box(state, 0, 2, box=[0.1 * w, 0.5 * h, 0.5 * w, 0.95 * h]))
        mask = np.zeros((h, w), bool)
        mask[int(0.1 * h) : int(0.45 * h), int(0.55 * w) : int(0.9 * w)] = True
        record("mask", pred.add_new_mask(state, 1, 3, mask))
        pts = [[0.7 * w, 0.7 * h], [0.2 * w, 0.2 * h]]
        record("points", pred.add_new_points_or_box(state, 3, 4, points=pts, labels=[1, 0]))
        for r in pred.propagate_in_video(state):
            record("forward", r)
        record("correct", pred.add_new_points_or_box(state, 2, 2, points=[[0.3 * w, 0.6 * h]], labels=[1]))
        for r in pred.propagate_in_video(state, start_frame_idx=n - 1, reverse=True):
            record("reverse", r)
    return out


def _count_rows(backend) -> dict[str, list[int]]:
    """Record the objects (rows) of every memory-attention, decoder and memory-encoder call of ``backend``."""
    seen: dict[str, list[int]] = {"memory_attention": [], "decode": [], "encode_memory": []}
    rows = {"memory_attention": lambda a: a[1].mem_tpos.shape[0], "decode": lambda a: a[0].shape[0]}
    rows["encode_memory"] = lambda a: a[1].shape[0]
    for name, count in rows.items():
        call = getattr(backend, name)

        def wrapped(*args, call=call, name=name, count=count):
            seen[name].append(count(args))
            return call(*args)

        setattr(backend, name, wrapped)
    return seen


@pytest.mark.parametrize("seed", [0, 2])
def test_objects_batched_match_upstream(tmp_path, seed):
    w, h = SIZE
    drifting_clip(tmp_path / "clip", FRAMES, SIZE)
    upstream = upstream_video_predictor(TEST_SMALL, VIDEO_TEST_SMALL, seed=seed)
    ours = _ours_from(upstream, TEST_SMALL, VIDEO_TEST_SMALL)
    rows_per_call = _count_rows(ours.backend)
    mine = _four_objects(ours, tmp_path / "clip", w, h, FRAMES)
    rows = _compare(mine, _four_objects(upstream, tmp_path / "clip", w, h, FRAMES))
    bad = [r for r in rows if r[3] < IOU_MIN or r[4] < COS_MIN]
    assert not bad, f"{len(bad)} of {len(rows)} (step, frame, obj, iou, cos) below bounds: {bad[:6]}"
    assert {obj for _, _, obj, _, _ in rows} == {1, 2, 3, 4}
    fg = [(m[i, 0] > 0).float().mean().item() for s, _, ids, m in mine if s != "mask" for i in range(len(ids))]
    assert 0.02 < float(np.median(fg)) < 0.98, f"median foreground {np.median(fg)}"
    # forward from frame 0: frame 4 tracks all four objects in one call of each stage; reverse: frames 1-4
    for name, sizes in rows_per_call.items():
        assert max(sizes) == 4, (name, sizes)
