"""``sam2edge track`` end to end at test-small, and its bad-input contract (one line, exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from sam2edge.runtime.video_io import read_frames
from sam2edge.weights.video import synthetic_video_state_dict
from tests.video_oracles import OBJ_SCORE_LIFT, drifting_clip

W, H, N = 200, 150, 5


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("track")
    drifting_clip(root / "clip", N, (W, H))
    sd = synthetic_video_state_dict(TEST_SMALL, VIDEO_TEST_SMALL)
    sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += OBJ_SCORE_LIFT  # objects present
    torch.save({"model": sd}, root / "lifted.pt")
    return root


def _track(clip: Path, *extra: str) -> int:
    ckpt = str(clip / "lifted.pt")
    return main(["track", str(clip / "clip"), "--config", "test-small", "--checkpoint", ckpt, *extra])


def test_track_writes_masks_and_overlay(clip, tmp_path, capsys):
    out, overlay = tmp_path / "masks", tmp_path / "overlay.mp4"
    rc = _track(clip, "--point", "2:90,60", "--box", "2:20,75,100,140@2", "--reverse", "--out", str(out))
    assert rc == 0
    prompts = ["--point", "1:90,60", "--box", "1:20,75,100,140@2"]
    rc = _track(clip, *prompts, "--out", str(tmp_path / "m2"), "--overlay", str(overlay))
    assert rc == 0
    pngs = sorted(out.iterdir())
    assert [p.name for p in pngs] == [f"{i:05d}.png" for i in range(N)]
    ids = set()
    for p in pngs:
        with Image.open(p) as im:
            assert im.mode == "P" and im.size == (W, H)
            ids |= set(np.unique(np.asarray(im)).tolist())
    assert {1, 2} <= ids <= {0, 1, 2}
    with Image.open(tmp_path / "m2" / "00000.png") as im:  # before the first prompt, without --reverse: empty
        assert not np.asarray(im).any()
    frames = read_frames(overlay)
    assert len(frames) == N and frames[0].shape == (H, W, 3)
    assert "frame/s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--point", "9:10,10"], "frame 9 is out of range"),
        (["--point", "0:500,10"], "outside the 200x150 frame"),
        (["--box", "0:10,10,5,20"], "is empty or leaves"),
        (["--point", "0:10,10@0"], "object 0 is not a valid id"),
        ([], "no prompt given"),
    ],
)
def test_track_bad_prompts(clip, tmp_path, capsys, args, message):
    out = tmp_path / "masks"
    assert _track(clip, *args, "--out", str(out), "--overlay", str(tmp_path / "o.mp4")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists() and not (tmp_path / "o.mp4").exists()
    assert list(tmp_path.iterdir()) == []


def test_track_bad_video_and_existing_out(clip, tmp_path, capsys):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video at all")
    assert main(["track", str(bad), "--config", "test-small", "--point", "0:1,1", "--out", str(tmp_path / "m")]) == 2
    assert "cannot read video" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    (tmp_path / "taken").mkdir()
    assert _track(clip, "--point", "0:10,10", "--out", str(tmp_path / "taken")) == 2
    assert "already exists" in capsys.readouterr().err
