"""Checkpoint loading: both official formats through one key map, strictly, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sam2edge.cli.main import main
from sam2edge.config import HIERA_TINY, TEST_SMALL
from sam2edge.model import build_sam2
from sam2edge.weights import (
    WeightsError,
    load_weights,
    read_checkpoint,
    save_checkpoint,
    synthetic_state_dict,
    to_sam2edge,
)
from sam2edge.weights.keymap import META_VIDEO_ONLY
from sam2edge.weights.load import expected_shapes, from_sam2edge


@pytest.fixture(scope="module")
def small_sd():
    return synthetic_state_dict(TEST_SMALL, seed=11)


@pytest.fixture(scope="module")
def ckpt_files(small_sd, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ckpt")
    files = {"meta": d / "sam2.1_hiera_small_test.pt", "hf": d / "model.safetensors"}
    for fmt, path in files.items():
        save_checkpoint(small_sd, fmt, path)
    return files


def test_both_formats_load_to_identical_outputs(small_sd, ckpt_files):
    image = torch.randn(1, 3, 256, 256)
    outs = []
    for fmt, path in ckpt_files.items():
        sd, prov = load_weights(str(path), TEST_SMALL)
        assert prov["format"] == fmt and len(prov["sha256"]) == 64
        model = build_sam2(TEST_SMALL)
        model.load_state_dict(sd)
        with torch.no_grad():
            outs.append(model.encode_image(image))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_hf_names_are_those_of_transformers(upstream_hf):
    """Every HF name our table produces exists in transformers' Sam2Model, with the same shape."""
    hf_sd = upstream_hf.state_dict()
    ours = from_sam2edge({k: torch.zeros(s) for k, s in expected_shapes(HIERA_TINY).items()}, "hf")
    assert set(ours) == set(hf_sd), set(ours) ^ set(hf_sd)
    for k, t in ours.items():
        assert t.shape == hf_sd[k].shape, k


def test_full_meta_checkpoint_skips_video_parts_only(meta_state_dict):
    """The official .pt holds the video model too: video-only keys are known-unused, the rest map 1:1."""
    video = [k for k in meta_state_dict if k.startswith(META_VIDEO_ONLY)]
    assert len(meta_state_dict) == 471 and len(video) > 150
    mapped = to_sam2edge(meta_state_dict, "meta", expected_shapes(HIERA_TINY), "meta")
    assert len(mapped) == len(meta_state_dict) - len(video)
    for k, v in mapped.items():
        assert torch.equal(v, meta_state_dict[k]), k


def test_missing_unexpected_and_misshaped_keys_are_listed(small_sd):
    sd = from_sam2edge(small_sd, "meta")
    del sd["sam_mask_decoder.iou_token.weight"]
    sd["sam_mask_decoder.extra.weight"] = torch.zeros(3)
    sd["no_mem_embed"] = torch.zeros(1, 1, 7)
    with pytest.raises(WeightsError) as e:
        to_sam2edge(sd, "meta", expected_shapes(TEST_SMALL), "x.pt")
    msg = str(e.value)
    assert "\n" not in msg
    assert "1 missing (sam_mask_decoder.iou_token.weight)" in msg
    assert "1 unexpected (sam_mask_decoder.extra.weight)" in msg
    assert "no_mem_embed (1, 1, 7) != (1, 1, 32)" in msg


def _cli_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


@pytest.mark.parametrize("kind", ["truncated", "wrong-file", "missing-key"])
def test_bad_checkpoints_give_one_line_errors(kind, small_sd, ckpt_files, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    if kind == "truncated":
        data = ckpt_files["meta"].read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "wrong-file":
        bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    else:
        sd = from_sam2edge(synthetic_state_dict(HIERA_TINY), "meta")
        del sd["sam_prompt_encoder.no_mask_embed.weight"]
        torch.save({"model": sd}, bad)
    out = tmp_path / "mask.png"
    msg = _cli_error(
        capsys, ["segment", "sample:astronaut.png", "--point", "100,100", "--checkpoint", str(bad), "--out", str(out)]
    )
    assert str(bad) in msg
    if kind == "missing-key":
        assert "sam_prompt_encoder.no_mask_embed.weight" in msg
    assert not out.exists()


def test_hub_id_offline_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = _cli_error(
        capsys, ["segment", "sample:astronaut.png", "--point", "100,100", "--checkpoint", "facebook/sam2.1-hiera-tiny"]
    )
    assert "cannot fetch facebook/sam2.1-hiera-tiny" in msg and "--checkpoint" in msg


def test_verify_official(small_sd, tmp_path, capsys):
    sd = synthetic_state_dict(HIERA_TINY, seed=2)
    pt, st = tmp_path / "sam2.1_hiera_tiny.pt", tmp_path / "model.safetensors"
    save_checkpoint(sd, "meta", pt)
    save_checkpoint(sd, "hf", st)
    assert main(["verify-official", str(pt), str(st)]) == 0
    out = capsys.readouterr().out
    assert out.count("sha256 ") == 2 and "NOT the official" in out and "bit-identical" in out
    tampered = dict(sd)
    tampered["no_mem_embed"] = sd["no_mem_embed"] + 1e-7
    save_checkpoint(tampered, "hf", st)
    assert main(["verify-official", str(pt), str(st)]) == 1
    assert "no_mem_embed" in capsys.readouterr().out


def test_read_checkpoint_detects_format(ckpt_files):
    assert read_checkpoint(ckpt_files["meta"])[1] == "meta"
    assert read_checkpoint(ckpt_files["hf"])[1] == "hf"
