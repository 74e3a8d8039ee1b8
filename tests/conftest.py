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
