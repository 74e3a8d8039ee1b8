"""Hostile command lines: every refusal is exit 2 with one ``error:`` line, and no file anywhere changes.

The refusals come before the model loads, so these cost no inference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_state
from PIL import Image

from sam2edge.cli.main import main


@pytest.fixture
def photo_dir(tmp_path):
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(tmp_path / "p.png")
    (tmp_path / "folder").mkdir()
    (tmp_path / "old_mask.png").write_bytes(b"keep me")
    os.link(tmp_path / "p.png", tmp_path / "hardlink.png")
    os.symlink(tmp_path / "p.png", tmp_path / "symlink.png")
    return tmp_path


def refused(capsys, argv: list[str], words: str) -> None:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


# (extra segment arguments with {d} = the folder, words the error must contain)
SEGMENT_CASES = {
    "out is the input": (["--out", "{d}/p.png"], "is the input"),
    "overlay is the input": (["--overlay", "{d}/p.png"], "is the input"),
    "out is the input, other spelling": (["--out", "{d}/folder/../p.png"], "is the input"),
    "out is a symlink to the input": (["--out", "{d}/symlink.png"], "is the input"),
    "out is a hard link to the input": (["--out", "{d}/hardlink.png"], "is the input"),
    "out == overlay": (["--out", "{d}/x.png", "--overlay", "{d}/x.png"], "are the same file"),
    "out == overlay, other spelling": (["--out", "{d}/x.png", "--overlay", "{d}/folder/../x.png"], "same file"),
    "out is a folder": (["--out", "{d}/folder"], "is a folder"),
    "overlay is a folder": (["--overlay", "{d}/folder"], "is a folder"),
    "out is the working folder": (["--out", "."], "is a folder"),
    "out below a file": (["--out", "{d}/old_mask.png/m.png"], "is a file, not a folder"),
    "out in a read-only folder": (["--out", "/sys/m.png"], "is not writable"),
    "overlay in a missing folder of a read-only one": (["--overlay", "/proc/none/o.png"], "is not writable"),
    "nan box": (["--box", "nan,0,5,5"], "box holds NaN or infinity"),
    "inf box": (["--box", "0,0,inf,5"], "box holds NaN or infinity"),
    "-inf box": (["--box=-inf,0,5,5"], "box holds NaN or infinity"),
    "float32-overflow box": (["--box", "0,0,5,1e39"], "box holds NaN or infinity"),
    "nan point": (["--point", "nan,3"], "point_coords holds NaN or infinity"),
    "inf point": (["--point", "3,inf"], "point_coords holds NaN or infinity"),
    "nan point with box": (["--point", "nan,3", "--box", "0,0,5,5"], "NaN or infinity"),
}


@pytest.mark.parametrize("name", list(SEGMENT_CASES))
def test_segment_refuses_and_changes_nothing(photo_dir, capsys, monkeypatch, name):
    extra, words = SEGMENT_CASES[name]
    monkeypatch.chdir(photo_dir)
    argv = ["segment", str(photo_dir / "p.png"), "--out", str(photo_dir / "m.png")]
    argv += ["--overlay", str(photo_dir / "o.png")] + [a.format(d=photo_dir) for a in extra]
    if "--point" not in extra:
        argv += ["--point", "3,4"]
    before = tree_state(photo_dir)
    refused(capsys, argv, words)
    assert tree_state(photo_dir) == before


SERVE_CASES = {
    "upload nan": (["--max-upload-mb", "nan"], "--max-upload-mb nan must be a finite number above 0"),
    "upload inf": (["--max-upload-mb", "inf"], "--max-upload-mb inf must be a finite number above 0"),
    "upload -inf": (["--max-upload-mb=-inf"], "must be a finite number above 0"),
    "upload 0": (["--max-upload-mb", "0"], "must be a finite number above 0"),
    "upload negative": (["--max-upload-mb=-5"], "must be a finite number above 0"),
    "upload 1e400": (["--max-upload-mb", "1e400"], "must be a finite number above 0"),
    "upload absurd": (["--max-upload-mb", "1e12"], "at or below 10000"),
    "pixels nan": (["--max-megapixels", "nan"], "--max-megapixels nan must be a finite number above 0"),
    "pixels inf": (["--max-megapixels", "inf"], "--max-megapixels inf must be a finite number above 0"),
    "pixels 0": (["--max-megapixels", "0"], "must be a finite number above 0"),
    "port out of range": (["--port", "70000"], "must lie in 0..65535"),
}


def test_segment_never_writes_over_a_bundled_sample(tmp_path, capsys):
    from sam2edge.checks.fidelity import photo_path

    sample = photo_path("astronaut.png")
    before = sample.read_bytes()
    argv = ["segment", "sample:astronaut.png", "--point", "3,4", "--out", str(sample)]
    refused(capsys, argv + ["--overlay", str(tmp_path / "o.png")], "is the input")
    assert sample.read_bytes() == before and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", list(SERVE_CASES))
def test_serve_refuses_bad_limits(capsys, name):
    extra, words = SERVE_CASES[name]
    refused(capsys, ["serve", "--port", "0", *extra], words)


def test_sweep_without_playwright_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright", None)  # as if `pip install sam2edge` without [browser]
    refused(capsys, ["sweep", str(tmp_path)], "pip install 'sam2edge[browser]'")


@pytest.mark.parametrize("module", ["litert_torch", "ai_edge_litert"])
def test_export_without_its_runtime_names_the_extra(tmp_path, capsys, monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "bundle"
    argv = ["export", "--target", "litert", "--precision", "fp32", "--config", "test-small", "--out", str(out)]
    refused(
        capsys, argv, f"{module} is not installed (needed for export --target litert); pip install 'sam2edge[export]'"
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bundle_without_its_runtime_names_the_extra(tmp_path, monkeypatch):
    from sam2edge.extras import MissingExtraError
    from sam2edge.runtime.predictor import Sam2Predictor

    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    card = {
        "schema": 1,
        "model_id": "sam2.1-hiera-tiny",
        "target": "litert",
        "precision": "fp32",
        "resolution": 256,
        "config": "test-small",
        "status": "shippable",
        "source": {"checkpoint": "synthetic", "format": "synthetic", "sha256": None},
        "artifacts": [],
    }
    (tmp_path / "card.json").write_text(json.dumps(card))
    with pytest.raises(MissingExtraError, match=r"ai_edge_litert is not installed .*sam2edge\[export\]"):
        Sam2Predictor.from_export(tmp_path)


@pytest.mark.parametrize(
    ("module", "extra"),
    [("playwright", "browser"), ("av", "video"), ("ray", "distributed"), ("pycocotools", "everything")]
    + [("huggingface_hub", "hub"), ("onnxruntime", "export"), ("executorch.runtime", "export")],
)
def test_require_names_the_extra(monkeypatch, module, extra):
    from sam2edge.extras import MissingExtraError, require

    monkeypatch.setitem(sys.modules, module.split(".")[0], None)
    with pytest.raises(MissingExtraError) as e:
        require(module, "a test")
    top = module.split(".")[0]
    assert str(e.value) == f"{top} is not installed (needed for a test); pip install 'sam2edge[{extra}]'"


def test_litertjs_missing_says_npm_ci(monkeypatch, tmp_path):
    from sam2edge.serve import assets

    monkeypatch.setenv("SAM2EDGE_NODE_MODULES", str(tmp_path))
    monkeypatch.setattr(assets.Path, "cwd", lambda: Path(tmp_path))
    monkeypatch.setattr(assets, "__file__", str(tmp_path / "a" / "assets.py"))
    from sam2edge.config import TEST_SMALL
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.serve.app import App
    from sam2edge.serve.assets import BrowserDecoder

    pred = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    app = App(pred.backend, BrowserDecoder(tmp_path, "decoder.tflite", {}))
    assert app.nm is None and "npm ci" in app.decoder_note
