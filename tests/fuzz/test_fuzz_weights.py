"""Checkpoints: NaN/inf tensors are named at load; the default checkpoint is the official one from the hub
when reachable (checksum verified) and synthetic with one warning line offline. Nothing is downloaded:
the hub call is replaced by generated files."""

from __future__ import annotations

import time

import pytest
import torch

from sam2edge.config import TEST_SMALL
from sam2edge.weights import load as wl
from sam2edge.weights.load import (
    SYNTHETIC,
    WeightsError,
    load_weights,
    save_checkpoint,
    sha256_file,
    synthetic_state_dict,
)

DEFAULT_CHECKPOINT = "default"  # sam2edge.weights.DEFAULT_CHECKPOINT (spelled out: the tests also run on older code)


@pytest.fixture(scope="module")
def small_sd():
    return synthetic_state_dict(TEST_SMALL)


def _poisoned(sd: dict, keys: list[str], value: float) -> dict:
    out = {k: v.clone() for k, v in sd.items()}
    for k in keys:
        out[k].view(-1)[min(3, out[k].numel() - 1)] = value
    return out


@pytest.mark.parametrize("fmt", ["hf", "meta"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_tensor_is_named(tmp_path, small_sd, fmt, value):
    key = next(k for k in small_sd if "mask_decoder" in k and small_sd[k].is_floating_point())
    path = tmp_path / ("w.safetensors" if fmt == "hf" else "w.pt")
    save_checkpoint(_poisoned(small_sd, [key], value), fmt, path)
    with pytest.raises(WeightsError) as e:
        load_weights(str(path), TEST_SMALL)
    msg = str(e.value)
    assert "NaN or infinite values in 1 tensors" in msg and key in msg and "\n" not in msg


def test_many_non_finite_tensors_are_summarised(tmp_path, small_sd):
    keys = [k for k in small_sd if small_sd[k].is_floating_point()][:6]
    path = tmp_path / "w.safetensors"
    save_checkpoint(_poisoned(small_sd, keys, float("nan")), "hf", path)
    with pytest.raises(WeightsError, match=r"NaN or infinite values in 6 tensors \(.*, \+2 more\)"):
        load_weights(str(path), TEST_SMALL)


def test_finite_safetensors_round_trip(tmp_path, small_sd):
    path = tmp_path / "model.safetensors"
    save_checkpoint(small_sd, "hf", path)
    sd, prov = load_weights(str(path), TEST_SMALL)
    assert prov["format"] == "hf" and prov["sha256"] == sha256_file(path)
    assert all(torch.equal(sd[k], small_sd[k]) for k in small_sd)


def test_offline_default_is_synthetic_with_one_warning_line(monkeypatch, capsys):
    from sam2edge.runtime.predictor import Sam2Predictor

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pred = Sam2Predictor.from_checkpoint(DEFAULT_CHECKPOINT, TEST_SMALL)
    assert pred.provenance["checkpoint"] == SYNTHETIC
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("WARNING: the official weights are not available (HF_HUB_OFFLINE")
    assert "SYNTHETIC" in err[0]


def test_unreachable_hub_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    t0 = time.monotonic()
    reason = wl.hub_reachable(timeout_s=2.0)
    assert reason is not None and "127.0.0.1 unreachable" in reason
    assert time.monotonic() - t0 < 2.5


def test_unresolvable_hub_fails_within_the_timeout(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://sam2edge-no-such-host.invalid")
    t0 = time.monotonic()
    assert wl.hub_reachable(timeout_s=1.0) is not None
    assert time.monotonic() - t0 < 1.5


def _fake_hub(monkeypatch, path, digest: str | None):
    import huggingface_hub

    calls = []

    def download(repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(path)

    monkeypatch.setattr(wl, "hub_reachable", lambda timeout_s=wl.HUB_TIMEOUT_S: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setitem(wl.OFFICIAL_SHA256, wl.HUB_FILE, digest or sha256_file(path))
    return calls


def test_online_default_downloads_and_verifies_the_official_file(tmp_path, monkeypatch, small_sd):
    path = tmp_path / "model.safetensors"
    save_checkpoint(small_sd, "hf", path)
    calls = _fake_hub(monkeypatch, path, None)
    sd, prov = load_weights(DEFAULT_CHECKPOINT, TEST_SMALL)
    assert calls == [("facebook/sam2.1-hiera-tiny", "model.safetensors")]
    assert prov["checkpoint"] == str(path) and prov["format"] == "hf"
    assert all(torch.equal(sd[k], small_sd[k]) for k in small_sd)


def test_online_default_refuses_a_wrong_checksum(tmp_path, monkeypatch, small_sd):
    path = tmp_path / "model.safetensors"
    save_checkpoint(small_sd, "hf", path)
    _fake_hub(monkeypatch, path, "0" * 64)
    with pytest.raises(WeightsError, match="not the official 000000000000...; delete it from the hub cache"):
        load_weights(DEFAULT_CHECKPOINT, TEST_SMALL)


def test_hub_failure_mid_download_falls_back_with_the_reason(monkeypatch):
    import huggingface_hub

    def broken(*a, **kw):
        raise OSError("connection reset by peer")

    monkeypatch.setattr(wl, "hub_reachable", lambda timeout_s=wl.HUB_TIMEOUT_S: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", broken)
    _, prov = load_weights(DEFAULT_CHECKPOINT, TEST_SMALL)
    assert prov["checkpoint"] == SYNTHETIC and "connection reset by peer" in prov["note"]


def test_missing_hub_package_falls_back_naming_the_extra(monkeypatch):
    import sys

    monkeypatch.setattr(wl, "hub_reachable", lambda timeout_s=wl.HUB_TIMEOUT_S: None)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    _, prov = load_weights(DEFAULT_CHECKPOINT, TEST_SMALL)
    assert prov["checkpoint"] == SYNTHETIC and "pip install 'sam2edge[hub]'" in prov["note"]
