"""The product around the code: the top-level API, the version, generated benchmark docs, no work-log history in
the tracked files, and a wheel that installs and runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sam2edge.cards.report import RecordError, read_record, render, table

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "records"


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def test_top_level_api_is_lazy(tmp_path):
    """``import sam2edge`` loads no runtime (nor torch); the three predictors come from the top level."""
    code = (
        "import sys, sam2edge; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert not any(m.startswith('sam2edge.runtime') for m in sys.modules); "
        "from sam2edge import Sam2Predictor, Sam2VideoPredictor, Sam2AutomaticMaskGenerator; "
        "print(Sam2Predictor.__module__, Sam2VideoPredictor.__module__, Sam2AutomaticMaskGenerator.__module__)"
    )
    r = _run([sys.executable, "-c", code], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        "sam2edge.runtime.predictor",
        "sam2edge.runtime.video.predictor",
        "sam2edge.runtime.automatic.generator",
    ]
    import sam2edge

    with pytest.raises(AttributeError, match="no attribute 'Sam3Predictor'"):
        sam2edge.Sam3Predictor  # noqa: B018


def test_version_flag_matches_package_metadata():
    import sam2edge

    r = _run([sys.executable, "-m", "sam2edge", "--version"], cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == f"sam2edge {sam2edge.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", sam2edge.__version__)
    assert f"## [{sam2edge.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def _record(**over) -> dict:
    rec = {
        "schema": "sam2edge.table/1",
        "id": "demo",
        "title": "Demo run",
        "date": "2026-01-02",
        "command": "python benchmarks/bench_demo.py --runs 3",
        "machine": {"cpu": "Test CPU", "cores": 2, "vector_extensions": ["avx2"]},
        "columns": [["bundle", "bundle"], ["ms", "p50 (ms)"], ["ratio", "vs upstream"]],
        "rows": [{"bundle": "a", "ms": 12.5, "ratio": "0.50x"}, {"bundle": "b", "ms": 2500.0, "ratio": "1.00x"}],
        "chart": {"label": "bundle", "value": "ms"},
    }
    rec.update(over)
    return rec


def test_report_renders_the_records_cells_and_chart(tmp_path):
    rec = _record()
    files = render([rec], stem="bench")
    md = files["bench.md"].decode()
    assert table(rec)[2] == "| a | 12.5 | 0.50x |" and table(rec)[3] == "| b | 2500 | 1.00x |"
    for line in table(rec):
        assert line in md.splitlines()
    assert "2026-01-02" in md and "`python benchmarks/bench_demo.py --runs 3`" in md and "Test CPU" in md
    assert files["bench-demo.png"].startswith(b"\x89PNG")
    assert render([rec], stem="bench") == files  # same records -> same bytes


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"schema": "other"}, "schema"),
        ({"date": 20260102}, "date"),
        ({"rows": [{"bundle": "a", "unknown": 1}]}, "row 0"),
        ({"columns": [["bundle"]]}, "columns"),
    ],
)
def test_report_refuses_a_malformed_record(tmp_path, bad, field):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(_record(**bad)))
    with pytest.raises(RecordError, match=field):
        read_record(p)


def test_report_cli_never_writes_over_a_users_file(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(_record()))
    mine = tmp_path / "notes.md"
    mine.write_text("my own notes\n")
    r = _run([sys.executable, "-m", "sam2edge", "report", str(tmp_path / "r.json"), "--out", str(mine)], cwd=ROOT)
    assert r.returncode == 2 and "not written by sam2edge report" in r.stderr and "Traceback" not in r.stderr
    assert mine.read_text() == "my own notes\n"
    out = tmp_path / "docs" / "b.md"
    for _ in range(2):  # a second render replaces the first (its own document)
        r = _run([sys.executable, "-m", "sam2edge", "report", str(tmp_path), "--out", str(out)], cwd=ROOT)
        assert r.returncode == 0, r.stderr
    assert "| a | 12.5 | 0.50x |" in out.read_text() and (tmp_path / "docs" / "b-demo.png").is_file()


def test_published_benchmark_page_is_generated_from_the_records():
    """docs/benchmarks.md (and its charts) are exactly what ``sam2edge report benchmarks/records`` renders."""
    records = [read_record(p) for p in sorted(RECORDS.glob("*.json"))]
    assert records, "no published records"
    for name, data in render(records, stem="benchmarks").items():
        assert (ROOT / "docs" / name).read_bytes() == data, f"docs/{name} is stale: run sam2edge report"


def _tracked_text_files() -> list[Path]:
    r = _run(["git", "ls-files", "-z"], cwd=ROOT)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    files = []
    for name in r.stdout.split("\0"):
        p = ROOT / name
        if name and p.is_file() and p.suffix not in {".png", ".jpg", ".mp4", ".webm", ".bin", ".tflite", ".pte"}:
            files.append(p)
    return files


WORK_LOG = re.compile(r"\bsession [0-9]|\bsessions [0-9]|\bissue[- ]?#?[0-9]|notes/issue|notes/session", re.I)


def test_no_work_log_references_in_tracked_files():
    hits = []
    for p in _tracked_text_files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if WORK_LOG.search(line) and p.name != "test_product.py":
                hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "work-log references:\n" + "\n".join(hits[:40])


def test_wheel_installs_and_segments(tmp_path):
    """The wheel holds the package, its web assets and sample photo access; installed on its own (no source
    tree on the path) it answers --version and segments a bundled photo."""
    src, dist = tmp_path / "src", tmp_path / "dist"  # built from a copy: setuptools writes build/ beside the source
    shutil.copytree(ROOT / "sam2edge", src / "sam2edge", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    r = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = dist.glob("sam2edge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sam2edge/cli/main.py" in names and any(n.startswith("sam2edge/serve/static/") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Project-URL" in meta
    site = tmp_path / "site"
    r = _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    code = "import sam2edge, sys; print(sam2edge.__file__); sys.exit(__import__('sam2edge.cli.main').cli.main.main())"
    r = _run([sys.executable, "-c", code, "--version"], cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith(str(site)), r.stdout + r.stderr
    out = tmp_path / "mask.png"
    args = ["segment", "sample:astronaut.png", "--config", "test-small", "--point", "270,180", "--out", str(out)]
    r = _run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert out.is_file() and out.read_bytes().startswith(b"\x89PNG")


def test_ship_table_rows_are_their_source_records_figures():
    """The "which bundle to ship" record only assembles: each row's figures equal its source record's row."""
    records = {r["id"]: r for r in (read_record(p) for p in RECORDS.glob("*.json"))}
    ship = records["ship-tiny-1024"]
    for row in ship["rows"]:
        rec_id, name = row["source"].split(": ", 1)
        (src,) = [r for r in records[rec_id]["rows"] if r.get("bundle") == name]
        shared = set(row) & set(src) - {"bundle", "source"}
        assert shared, row
        assert {k: row[k] for k in shared} == {k: src[k] for k in shared}, row["bundle"]


def test_readme_ship_table_is_the_record():
    """README.md shows the ship record's table exactly as ``sam2edge report`` renders it."""
    ship = read_record(RECORDS / "00-ship-tiny-1024.json")
    readme = (ROOT / "README.md").read_text().splitlines()
    for line in table(ship):
        assert line in readme, line
