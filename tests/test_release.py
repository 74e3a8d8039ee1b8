"""The release: ``python -m build`` makes an sdist and a wheel with the package metadata, and the wheel installed
into a fresh virtual environment runs ``sam2edge --version`` and ``sam2edge segment`` on a bundled photo.

The fresh environment reuses this environment's installed dependencies through a ``.pth`` line (torch and the
extras are not downloaded again); the wheel itself is installed with ``--no-deps`` and must be what imports.
"""

from __future__ import annotations

import email
import os
import site
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import sam2edge

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built from this checkout (no build isolation: the build backend installed here is used)."""
    out = tmp_path_factory.mktemp("dist")
    work = tmp_path_factory.mktemp("src")
    # build from a copy of the tracked files, so the checkout gets no build/ or egg-info folders
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src, dst = ROOT / name, work / name
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(work)],
        check=True,
        capture_output=True,
    )
    return out


def test_build_makes_sdist_and_wheel_with_metadata(dist):
    v = sam2edge.__version__
    wheel, sdist = dist / f"sam2edge-{v}-py3-none-any.whl", dist / f"sam2edge-{v}.tar.gz"
    assert wheel.is_file() and sdist.is_file()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(f"sam2edge-{v}.dist-info/METADATA"))
        entry = z.read(f"sam2edge-{v}.dist-info/entry_points.txt").decode()
    assert meta["Version"] == v and meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "sam2edge/serve/static/index.html" in names and "sam2edge/cli/report.py" in names
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Changelog"} <= set(urls)
    assert "github.com/facebookresearch/sam2" in " ".join(urls.values())
    assert set(meta.get_all("Provides-Extra")) >= {"export", "video", "everything", "distributed", "browser", "hub"}
    assert "sam2edge = sam2edge.cli.main:main" in entry
    body = meta.get_payload()  # the README: citations of the upstream models
    assert "SAM 2: Segment Anything in Images and Videos" in body and "EdgeTAM: On-Device Track Anything Model" in body
    with tarfile.open(sdist) as t:
        assert f"sam2edge-{v}/pyproject.toml" in t.getnames() and f"sam2edge-{v}/LICENSE" in t.getnames()


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (``--no-deps``, no index); returns its folder."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    # dependencies (torch, numpy, scikit-image, ...) from this environment, after the fresh one's own packages
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = dist / f"sam2edge-{sam2edge.__version__}-py3-none-any.whl"
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    return env_dir


def _run(env_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    return subprocess.run([env_dir / "bin" / "sam2edge", *args], cwd=cwd, capture_output=True, text=True, env=env)


def _segment(env_dir: Path, cwd: Path, *extra: str) -> np.ndarray:
    seg = _run(env_dir, cwd, "segment", "sample:astronaut.png", "--point", "250,150", "--out", "mask.png",
               "--overlay", "overlay.png", *extra)  # fmt: skip
    assert seg.returncode == 0, seg.stderr
    assert Image.open(cwd / "overlay.png").size == (512, 512)
    return np.asarray(Image.open(cwd / "mask.png"))


def test_wheel_runs_version_and_segment_in_a_fresh_venv(installed, tmp_path, monkeypatch):
    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import sam2edge; print(sam2edge.__file__)"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout  # the wheel, not this checkout
    version = _run(installed, tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"sam2edge {sam2edge.__version__}"
    mask = _segment(installed, tmp_path, "--config", "test-small")
    # the same command in this checkout's process writes the same mask (deterministic synthetic weights)
    (tmp_path / "here").mkdir()
    here = tmp_path / "here"
    monkeypatch.chdir(here)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sam2edge.cli.main import main

    assert main(["segment", "sample:astronaut.png", "--point", "250,150", "--config", "test-small"]) == 0
    assert mask.shape[:2] == (512, 512)
    assert np.array_equal(mask, np.asarray(Image.open(here / "mask.png")))


@pytest.mark.slow
def test_wheel_segments_at_full_size_in_a_fresh_venv(installed, tmp_path):
    """The default model (Hiera-Tiny at 1024 px; synthetic weights offline) from the installed wheel."""
    mask = _segment(installed, tmp_path)
    assert mask.shape[:2] == (512, 512) and set(np.unique(mask)) <= {0, 1, 255}
