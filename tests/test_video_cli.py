"""``sam2edge track`` end to end at test-small, and its bad-input contract (one line, exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from sam2edge.runtime.video.io import read_frames
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


def _rle_masks(path: Path) -> dict[int, dict[int, np.ndarray]]:
    """masks.json -> {frame: {object: HxW bool}} (pycocotools decode)."""
    import json

    from pycocotools import mask as mask_utils

    doc = json.loads(path.read_text())
    out = {}
    for entry in doc["frames"]:
        out[entry["frame"]] = {}
        for m in entry["masks"]:
            rle = {**m["segmentation"], "counts": m["segmentation"]["counts"].encode()}
            mask = mask_utils.decode(rle).astype(bool)
            assert m["area"] == int(mask.sum()) and len(m["bbox"]) == 4
            out[entry["frame"]][m["object"]] = mask
    return out


def test_track_json_is_the_png_masks_as_coco_rle(clip, tmp_path):
    """--out masks.json holds, per frame and object, the masks the PNG folder paints (objects apart)."""
    prompts = ["--point", "1:90,60", "--box", "1:20,75,100,140@2", "--reverse"]
    assert _track(clip, *prompts, "--out", str(tmp_path / "masks.json")) == 0
    assert _track(clip, *prompts, "--out", str(tmp_path / "pngs")) == 0
    rle = _rle_masks(tmp_path / "masks.json")
    assert sorted(rle) == list(range(N)) and all(sorted(objs) == [1, 2] for objs in rle.values())
    for f in range(N):
        with Image.open(tmp_path / "pngs" / f"{f:05d}.png") as im:
            png = np.asarray(im)
        for obj, mask in rle[f].items():
            assert np.array_equal(png == obj, mask & ~(png == 3 - obj)), (f, obj)  # the other object may cover it
    assert any(m.any() for objs in rle.values() for m in objs.values())
    assert _track(clip, *prompts, "--out", str(tmp_path / "masks.json")) == 2  # never written over


def test_track_start_and_max_frames_as_upstream_propagate(clip, tmp_path):
    """--start-frame 2 --max-frames 1 --reverse visits frames 2, 3 then 2, 1 (propagate_in_video's
    start_frame_idx / max_frame_num_to_track); the masks are the Python API's on the same calls."""
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor

    out = tmp_path / "masks.json"
    argv = ["--point", "1:90,60", "--box", "1:20,75,100,140@2", "--reverse", "--start-frame", "2", "--max-frames", "1"]
    assert _track(clip, *argv, "--out", str(out)) == 0
    got = _rle_masks(out)
    assert sorted(got) == [1, 2, 3]  # frames 0 and 4 not reached
    pred = Sam2VideoPredictor.from_checkpoint(str(clip / "lifted.pt"), TEST_SMALL, VIDEO_TEST_SMALL)
    state = pred.init_state(str(clip / "clip"))
    pred.add_new_points_or_box(state, 1, 1, points=np.array([[90.0, 60.0]]), labels=np.array([1]))
    pred.add_new_points_or_box(state, 1, 2, box=np.array([20.0, 75.0, 100.0, 140.0]))
    want = {}
    for reverse in (False, True):
        for f, ids, masks in pred.propagate_in_video(state, 2, 1, reverse=reverse):
            want[f] = dict(zip(ids, (masks[:, 0] > 0).numpy()))
    assert sorted(want) == sorted(got)
    for f in want:
        for obj in (1, 2):
            assert np.array_equal(got[f][obj], want[f][obj]), (f, obj)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start-frame", "5"], "--start-frame 5 is out of range; the video has frames 0..4"),
        (["--max-frames", "-1"], "--max-frames -1 is negative"),
        (["--point", "7:10,10"], "frame 7 is out of range"),
    ],
)
def test_track_bad_span(clip, tmp_path, capsys, args, message):
    base = ["--point", "0:10,10"] if "--point" not in args else []
    assert _track(clip, *base, *args, "--out", str(tmp_path / "m.json"), "--overlay", str(tmp_path / "o.mp4")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_track_from_a_video_bundle(clip, tmp_path, video_bundle_dir, video_checkpoint):
    """--model BUNDLE (an ONNX --video export) tracks as the eager model on the bundle's checkpoint."""
    bundle = video_bundle_dir("onnx")
    prompts = ["--point", "1:90,60", "--box", "1:20,75,100,140@2", "--reverse"]
    assert main(["track", str(clip / "clip"), "--model", str(bundle), *prompts, "--out", str(tmp_path / "b.json")]) == 0
    eager = ["--checkpoint", str(video_checkpoint), "--config", "test-small", "--out", str(tmp_path / "e.json")]
    assert main(["track", str(clip / "clip"), *prompts, *eager]) == 0
    got, want = _rle_masks(tmp_path / "b.json"), _rle_masks(tmp_path / "e.json")
    assert sorted(got) == sorted(want) == list(range(N))
    for f in want:
        for obj, ref in want[f].items():
            union = (ref | got[f][obj]).sum()
            iou = 1.0 if union == 0 else (ref & got[f][obj]).sum() / union
            assert iou >= 0.999, (f, obj, iou)
    assert any(m.any() for objs in want.values() for m in objs.values())


def test_track_bundle_refusals(clip, tmp_path, capsys, small_bundle, video_bundle_dir):
    """A bundle without video graphs, of another config than --config, or beside --checkpoint: one line, exit 2."""
    plain, video = small_bundle("onnx"), video_bundle_dir("onnx")  # built (or reused) before reading stderr
    capsys.readouterr()
    cases = [
        (
            ["--model", str(plain)],
            "has no video graphs; re-export it with `sam2edge export ... --video`",
        ),
        (["--model", str(video), "--config", "test-small-s"], "is a test-small bundle but"),
        (["--model", str(video), "--checkpoint", str(clip / "lifted.pt")], "not both"),
    ]
    out = tmp_path / "out"
    for extra, message in cases:
        assert main(["track", str(clip / "clip"), "--point", "0:10,10", *extra, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert not out.exists()


def test_track_frames_of_two_sizes(clip, tmp_path, capsys):
    """A clip whose frames change size: one line, exit 2, nothing written."""
    import shutil

    folder = tmp_path / "clip"
    shutil.copytree(clip / "clip", folder)
    with Image.open(folder / "00002.jpg") as im:
        im.resize((W // 2, H // 2)).save(folder / "00002.jpg")
    out = tmp_path / "m.json"
    assert main(["track", str(folder), "--config", "test-small", "--point", "0:10,10", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the first frame" in err[0] and "pass frames of one size" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip"]


def test_png_frame_folders_read_as_jpeg_ones_and_mixed_ones_are_refused(clip, tmp_path, capsys):
    """``<int>.png`` frames read in frame order, pixel for pixel as the same frames' JPEG folder decodes; a folder
    of both kinds, or of PNGs not named by number, is one line, exit 2, nothing written."""
    want = read_frames(clip / "clip")
    pngs = tmp_path / "png"
    pngs.mkdir()
    for i, frame in enumerate(want):
        Image.fromarray(frame).save(pngs / f"{i}.png")  # unpadded numbers sort as numbers, not as text
    got = read_frames(pngs)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    out = tmp_path / "m.json"
    assert main(["track", str(pngs), "--config", "test-small", "--point", "0:10,10", "--out", str(out)]) == 0
    capsys.readouterr()
    mixed, named = tmp_path / "mixed", tmp_path / "named"
    mixed.mkdir()
    named.mkdir()
    Image.fromarray(want[0]).save(mixed / "00000.png")
    Image.fromarray(want[1]).save(mixed / "00001.jpg")
    Image.fromarray(want[0]).save(named / "first.png")
    for folder, words in ((mixed, "holds both JPEG and PNG frames"), (named, "PNG files not named by frame number")):
        dest = tmp_path / f"out_{folder.name}.json"
        assert main(["track", str(folder), "--config", "test-small", "--point", "0:10,10", "--out", str(dest)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not dest.exists()
