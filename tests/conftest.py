"""Shared fixtures: upstream oracles with perturbed random weights, and sam2edge models loaded from them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
# transformers decides once, at import, whether torchvision exists; decide it before any test registers the
# torchvision stand-in of the upstream oracles (its __spec__ None would make that check raise)
import transformers.utils.import_utils  # noqa: E402,F401

os.environ.setdefault("SAM2EDGE_GPU_CHECK_CACHE", "off")  # every test runs its GPU check (test_perf turns it on)

from once import WORKER, built_once  # noqa: E402
from oracles import hf_sam2_model, meta_sam2base  # noqa: E402

from sam2edge.config import HIERA_TINY  # noqa: E402
from sam2edge.weights.load import expected_shapes, to_sam2edge  # noqa: E402

torch.set_num_threads(int(os.environ.get("SAM2EDGE_TEST_THREADS", "1" if WORKER else "2")))  # 1: cores shared


@pytest.fixture(scope="session")
def upstream_meta():
    """Meta's SAM2Base (Hiera-Tiny, video parts included), perturbed random weights."""
    with torch.no_grad():
        return meta_sam2base(seed=0)


@pytest.fixture(scope="session")
def meta_state_dict(upstream_meta):
    """The full 471-key Meta state dict, as it would sit in sam2.1_hiera_tiny.pt under "model"."""
    return {k: v.clone() for k, v in upstream_meta.state_dict().items()}


@pytest.fixture(scope="session")
def sam2edge_sd_from_meta(meta_state_dict):
    return to_sam2edge(meta_state_dict, "meta", expected_shapes(HIERA_TINY), "fixture")


@pytest.fixture(scope="session")
def upstream_hf():
    with torch.no_grad():
        return hf_sam2_model(seed=0)


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory):
    """target -> a test-small fp32 bundle with the synthetic weights, exported once per test run
    (``sam2edge export --config test-small``); tests that only read a bundle can share it."""
    from sam2edge.cli.main import main

    def get(target: str) -> Path:
        def build(out: Path) -> None:
            argv = ["export", "--target", target, "--config", "test-small", "--precision", "fp32", "--out", str(out)]
            assert main(argv) == 0

        return built_once(tmp_path_factory, f"small-{target}", build)

    return get


def _save_video_checkpoint(path: Path) -> None:
    from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
    from sam2edge.weights.load import save_checkpoint
    from sam2edge.weights.video import synthetic_video_state_dict
    from tests.video_oracles import OBJ_SCORE_LIFT

    sd = synthetic_video_state_dict(TEST_SMALL, VIDEO_TEST_SMALL, seed=3)
    sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += OBJ_SCORE_LIFT  # objects stay present
    path.mkdir()
    save_checkpoint(sd, "meta", path / "video_small.pt")


@pytest.fixture(scope="session")
def video_checkpoint(tmp_path_factory) -> Path:
    """Perturbed synthetic test-small video weights (object-score head lifted), saved as a Meta checkpoint."""
    return built_once(tmp_path_factory, "video-checkpoint", _save_video_checkpoint) / "video_small.pt"


@pytest.fixture(scope="session")
def video_bundle_dir(tmp_path_factory, video_checkpoint):
    """target -> a test-small fp32 ``--video`` bundle of ``video_checkpoint``, exported once per test run."""
    from sam2edge.export.pipeline import run_export

    def get(target: str) -> Path:
        def build(out: Path) -> None:
            run_export(  # batch 0: no batched decoder (segment everything is not under test here)
                target,
                "test-small",
                "fp32",
                out,
                checkpoint=str(video_checkpoint),
                clicks=4,
                video=True,
                options={"batch": 0},
            )

        return built_once(tmp_path_factory, f"video-{target}", build)

    return get


def edgetam_small_video_weights() -> dict:
    """Perturbed synthetic test-small-edgetam video weights, the object-score head lifted (objects stay present)."""
    from sam2edge.config import get_config, get_video_config
    from sam2edge.weights.video import synthetic_video_state_dict

    sd = synthetic_video_state_dict(get_config("test-small-edgetam"), get_video_config("test-small-edgetam"), seed=3)
    sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += 10.0
    return sd


@pytest.fixture(scope="session")
def edgetam_video_bundle_dir(tmp_path_factory):
    """target -> a test-small-edgetam fp32 ``--video`` bundle of ``edgetam_small_video_weights()``, exported once
    per test run (the EdgeTAM export test and the page's tracking test share it)."""
    from sam2edge.export.pipeline import run_export

    def get(target: str) -> Path:
        def build(out: Path) -> None:
            source = {"checkpoint": "synthetic test-small-edgetam", "format": "meta", "sha256": None}
            # batch 0: no batched decoder (segment everything is not under test here). The ONNX bundle has the
            # batched video graphs (tests/test_edgetam_video.py tracks through them); LiteRT's are left out
            # (video_batch 1: the page's tracker runs one object per call; 85 s of conversion)
            options = {"batch": 0} | ({"video_batch": 1} if target == "litert" else {})
            run_export(
                target,
                "test-small-edgetam",
                "fp32",
                out,
                weights=(edgetam_small_video_weights(), source),
                clicks=4,
                video=True,
                options=options,
            )

        return built_once(tmp_path_factory, f"video-{target}-edgetam", build)

    return get


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium (Python playwright) with WebGPU on SwiftShader, one per test module."""
    from playwright.sync_api import sync_playwright

    from sam2edge.serve.assets import node_modules
    from sam2edge.serve.chromium import chromium_path, launch

    chromium_path()  # raises (test error, not skip) when chromium is missing
    assert node_modules() is not None, "LiteRT.js is not installed: run `npm ci` at the repo root"
    with sync_playwright() as pw:
        b = launch(pw, webgpu=True)
        yield b
        b.close()
