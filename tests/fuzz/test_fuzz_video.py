"""Hostile input to tracking: ``Sam2VideoPredictor`` (Python API), ``sam2edge track`` (CLI), frame folders and
the video server's frame index. Each is refused with one line (UserError / exit 2 / HTTP 4xx) before any model
runs, and nothing is written."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.runtime.video.predictor import Sam2VideoPredictor

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
W, H, N = 40, 30, 3
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf, 1e39])  # 1e39 is inf in float32


class CountingBackend:
    """Wraps a video backend; counts calls so a test proves the refusal came before any model work."""

    def __init__(self, inner) -> None:
        self.inner, self.cfg, self.vcfg = inner, inner.cfg, inner.vcfg
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if callable(attr):

            def counted(*a, **k):
                self.calls += 1
                return attr(*a, **k)

            return counted
        return attr


@pytest.fixture(scope="module")
def video():
    eager = Sam2VideoPredictor.from_checkpoint(None, TEST_SMALL, VIDEO_TEST_SMALL)
    spy = CountingBackend(eager.backend)
    pred = Sam2VideoPredictor(spy, eager.provenance)
    frames = [np.random.default_rng(i).integers(0, 256, (H, W, 3), dtype=np.uint8) for i in range(N)]
    return pred, spy, pred.init_state(frames)


def refused_before_model(video, call, words: str) -> None:
    pred, spy, state = video
    before = spy.calls
    with pytest.raises(UserError) as e:
        call(pred, state)
    msg = str(e.value)
    assert "\n" not in msg and words in msg, msg
    assert spy.calls == before, "the model ran before the refusal"


BAD_VIDEO_CALLS = {
    "frame 1.5": (lambda p, s: p.add_new_points_or_box(s, 1.5, 1, [[5, 5]], [1]), "frame_idx must be an integer"),
    "frame '1'": (lambda p, s: p.add_new_points_or_box(s, "1", 1, [[5, 5]], [1]), "frame_idx must be an integer"),
    "frame True": (lambda p, s: p.add_new_points_or_box(s, True, 1, [[5, 5]], [1]), "frame_idx must be an integer"),
    "frame -1": (lambda p, s: p.add_new_points_or_box(s, -1, 1, [[5, 5]], [1]), "out of range"),
    "frame N": (lambda p, s: p.add_new_points_or_box(s, N, 1, [[5, 5]], [1]), "out of range"),
    "obj id 1.5": (lambda p, s: p.add_new_points_or_box(s, 0, 1.5, [[5, 5]], [1]), "obj_id must be an integer"),
    "box of 3": (lambda p, s: p.add_new_points_or_box(s, 0, 1, box=[1, 2, 3]), "box must have 4 numbers"),
    "box of strings": (lambda p, s: p.add_new_points_or_box(s, 0, 1, box=["a", "b", "c", "d"]), "not an array"),
    "nan box": (lambda p, s: p.add_new_points_or_box(s, 0, 1, box=[np.nan, 0, 5, 5]), "NaN or infinity"),
    "nan point": (lambda p, s: p.add_new_points_or_box(s, 0, 1, [[np.nan, 5]], [1]), "NaN or infinity"),
    "inf label": (lambda p, s: p.add_new_points_or_box(s, 0, 1, [[5, 5]], [np.inf]), "NaN or infinity"),
    "label 7": (lambda p, s: p.add_new_points_or_box(s, 0, 1, [[5, 5]], [7]), "is not one of"),
    "points without labels": (lambda p, s: p.add_new_points_or_box(s, 0, 1, [[5, 5]]), "together"),
    "3 points 2 labels": (lambda p, s: p.add_new_points_or_box(s, 0, 1, [[1, 1]] * 3, [1, 1]), "3 points but 2"),
    "mask of strings": (lambda p, s: p.add_new_mask(s, 0, 1, [["a", "b"], ["c", "d"]]), "not an array"),
    "mask 3-D": (lambda p, s: p.add_new_mask(s, 0, 1, np.ones((2, 2, 2))), "2-D"),
    "mask 0x0": (lambda p, s: p.add_new_mask(s, 0, 1, np.ones((0, 0))), "2-D"),
    "nan mask": (lambda p, s: p.add_new_mask(s, 0, 1, np.full((4, 4), np.nan)), "NaN or infinity"),
    "mask frame 2.0": (lambda p, s: p.add_new_mask(s, 2.0, 1, np.ones((4, 4), bool)), "must be an integer"),
}


@pytest.mark.parametrize("name", list(BAD_VIDEO_CALLS))
def test_bad_video_prompt_refused_before_model(video, name):
    call, words = BAD_VIDEO_CALLS[name]
    refused_before_model(video, call, words)


@FUZZ
@given(bad=NON_FINITE, where=st.integers(0, 3), as_point=st.booleans())
def test_any_non_finite_video_prompt_is_refused(video, bad, where, as_point):
    box = [2.0, 2.0, 20.0, 20.0]
    if as_point:
        pt = [5.0, 5.0]
        pt[where % 2] = bad
        refused_before_model(video, lambda p, s: p.add_new_points_or_box(s, 0, 1, [pt], [1]), "NaN or infinity")
    else:
        box[where] = bad
        refused_before_model(video, lambda p, s: p.add_new_points_or_box(s, 0, 1, box=box), "NaN or infinity")


@FUZZ
@given(frame=st.one_of(st.floats(allow_nan=True), st.integers(-(2**70), -1), st.integers(N, 2**70)))
def test_any_frame_index_outside_the_video_is_refused(video, frame):
    refused_before_model(video, lambda p, s: p.add_new_points_or_box(s, frame, 1, [[5, 5]], [1]), "frame_idx")


BAD_FRAME_LISTS = {
    "0x0 frame": ([np.zeros((0, 0, 3), np.uint8)], "0x0 pixels (empty)"),
    "mixed sizes": ([np.zeros((4, 4, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)], "frame 1 is 5x4"),
    "float frame": ([np.zeros((4, 4, 3), np.float32)], "not an HxWx3 uint8"),
    "gray frame": ([np.zeros((4, 4), np.uint8)], "not an HxWx3 uint8"),
    "no frames": ([], "no frames"),
    "not a list": (5, "pass a path or a list"),
}


@pytest.mark.parametrize("name", list(BAD_FRAME_LISTS))
def test_bad_frames_refused(video, name):
    frames, words = BAD_FRAME_LISTS[name]
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        video[0].init_state(frames)


@pytest.mark.parametrize("kwargs", [{"start_frame_idx": 1.5}, {"max_frame_num_to_track": -1}])
def test_bad_propagation_arguments(kwargs):
    pred = Sam2VideoPredictor.from_checkpoint(None, TEST_SMALL, VIDEO_TEST_SMALL)
    state = pred.init_state([np.zeros((8, 8, 3), np.uint8)] * 2)
    pred.add_new_points_or_box(state, 0, 1, [[3, 3]], [1])
    with pytest.raises(UserError, match="must be an integer|out of range"):
        next(iter(pred.propagate_in_video(state, **kwargs)))


# ---- frame folders: a damaged frame is one line naming the file ------------------------------------------
def _folder(tmp_path: Path, damage: str) -> Path:
    d = tmp_path / "clip"
    d.mkdir()
    for i in range(3):
        Image.fromarray(np.full((H, W, 3), 40 * i, np.uint8)).save(d / f"{i:05d}.jpg", quality=90)
    target = d / "00001.jpg"
    if damage == "truncated":
        target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])
    elif damage == "garbage":
        target.write_bytes(b"\xff\xd8\xff" + b"not a jpeg" * 20)
    elif damage == "mixed sizes":
        Image.fromarray(np.zeros((H + 2, W, 3), np.uint8)).save(target)
    elif damage == "empty file":
        target.write_bytes(b"")
    return d


@pytest.mark.parametrize("damage", ["truncated", "garbage", "mixed sizes", "empty file"])
def test_damaged_frame_named_in_one_line(tmp_path, capsys, damage):
    clip = _folder(tmp_path, damage)
    before = tree_state(tmp_path)
    out = tmp_path / "masks"
    rc = main(["track", str(clip), "--config", "test-small", "--point", "0:5,5", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "00001.jpg" in err[0], err
    assert tree_state(tmp_path) == before and not out.exists()


# ---- track command line: non-finite prompts and outputs that nest ----------------------------------------
TRACK_CASES = {
    "nan box": (["--box", "0:nan,0,5,5"], "NaN or infinity"),
    "inf box": (["--box", "0:0,0,inf,5"], "NaN or infinity"),
    "inf label": (["--point", "0:5,5,inf"], "NaN or infinity"),
    "nan point": (["--point", "0:nan,5"], "NaN or infinity"),
    "overlay inside out": (["--point", "0:5,5", "--out", "{d}/m", "--overlay", "{d}/m/o.mp4"], "overlap"),
    "out == overlay": (["--point", "0:5,5", "--out", "{d}/x.mp4", "--overlay", "{d}/x.mp4"], "overlap"),
    "out inside the frames": (["--point", "0:5,5", "--out", "{d}/clip/masks"], "overlaps the input"),
    "out contains the frames": (["--point", "0:5,5", "--out", "{d}"], "overlaps the input"),
}


@pytest.mark.parametrize("name", list(TRACK_CASES))
def test_track_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, name):
    clip = _folder(tmp_path, "none")
    args, words = TRACK_CASES[name]
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "masks")]
    before = tree_state(tmp_path)
    try:
        rc = main(["track", str(clip), "--config", "test-small", *args])
    except SystemExit as e:  # a prompt argparse refuses: its usage lines, then one error line
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "error: " in ln]
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert tree_state(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip"]


# ---- the video server's frame index ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,status", [("١", 400), ("²", 400), ("1.5", 400), ("-1", 400), ("", 400), ("9" * 40, 404), ("7", 404)]
)
def test_server_frame_index(text, status):
    from types import SimpleNamespace

    from sam2edge.serve.clips import Clips
    from sam2edge.serve.web import HttpError

    clip = SimpleNamespace(state=SimpleNamespace(num_frames=3))
    with pytest.raises(HttpError) as e:
        Clips.frame_index(None, clip, text)
    assert e.value.status == status and "\n" not in str(e.value)
    assert Clips.frame_index(None, clip, "2") == 2
