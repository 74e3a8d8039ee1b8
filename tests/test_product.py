"""The product surface: the lazy top-level API, ``--version``, measured tables rendered from records, and no
work-log references in the tracked files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sam2edge.cards.report import load_records, markdown
from sam2edge.checks.bench.records import make_record, write_record
from sam2edge.cli.main import main
from sam2edge.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
# work-log wording: a numbered session or issue, a "(#N)" / "PR #N" reference, or a link into the old notes
# (each word spelled with a character class, so this line does not match itself)
WORK_LOG = re.compile(
    r"sessio[n] [0-9]|\bissu[e][- ]?[0-9]|(?<![\w &])#[0-9]+\b|\b(?:PR|pull|fixes) #[0-9]|note[s]/", re.I
)
BINARY = {".png", ".jpg", ".jpeg", ".mp4", ".webm", ".tflite", ".pte", ".onnx", ".safetensors", ".pt", ".ico"}


def test_import_is_lazy_and_light():
    code = (
        "import sys, sam2edge; heavy = [m for m in ('torch', 'numpy', 'ai_edge_litert', 'executorch', "
        "'onnxruntime', 'sam2edge.runtime', 'sam2edge.model') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_top_level_api():
    import sam2edge
    from sam2edge.runtime.automatic import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.runtime.video_predictor import Sam2VideoPredictor

    assert sam2edge.Sam2Predictor is Sam2Predictor
    assert sam2edge.Sam2VideoPredictor is Sam2VideoPredictor
    assert sam2edge.Sam2AutomaticMaskGenerator is Sam2AutomaticMaskGenerator
    with pytest.raises(AttributeError):
        sam2edge.NotAThing  # noqa: B018


def test_version(capsys):
    import sam2edge

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"sam2edge {sam2edge.__version__}"
    meta = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{sam2edge.__version__}"' in meta


def _records(tmp_path: Path) -> list[Path]:
    recs = [
        make_record("CPU, 2 threads", "bundle A", {"encoder_ms": 1913.0, "click_ms": 39.04, "vs_upstream_x": 0.581}),
        make_record("CPU, 2 threads", "bundle B", {"encoder_ms": 1150.0, "size_mb": 54.2}, command="bench B"),
        make_record("GPU", "bundle C", {"click_ms": 7.25, "mask_iou_worst": 0.9931}, command="bench C"),
    ]
    return [write_record(r, tmp_path / "rec") for r in recs]


def test_record_schema(tmp_path):
    rec = json.loads(_records(tmp_path)[0].read_text())
    for key in ("machine", "date", "command", "figures", "table", "row"):
        assert rec[key]
    assert rec["sam2edge"]["version"] and rec["sam2edge"]["commit"]
    assert "vector_extensions" in rec["machine"] and "cpu" in rec["machine"]


def test_report_table_matches_records(tmp_path):
    paths = _records(tmp_path)
    out = tmp_path / "docs" / "benchmarks.md"
    assert main(["report", str(tmp_path / "rec"), "--out", str(out)]) == 0
    page = out.read_text()
    assert (tmp_path / "docs" / "benchmarks_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recs = load_records(paths)
    # parse every Markdown table back: heading -> {row: {column: cell}}
    tables, name, header = {}, None, None
    for line in page.splitlines():
        if line.startswith("## "):
            name, header = line[3:], None
        elif line.startswith("| ") and name:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            else:
                tables.setdefault(name, {})[cells[0]] = dict(zip(header[1:], cells[1:]))
    assert set(tables) == {"CPU, 2 threads", "GPU"}
    a, b = tables["CPU, 2 threads"]["bundle A"], tables["CPU, 2 threads"]["bundle B"]
    assert a["encoder (ms)"] == "1913" and a["click (ms)"] == "39.0" and a["vs upstream (x)"] == "0.58x"
    assert a["size (MB)"] == "-" and b["size (MB)"] == "54.2" and b["click (ms)"] == "-"
    assert tables["GPU"]["bundle C"] == {"click (ms)": "7.2", "mask iou worst": "0.9931"} or tables["GPU"][
        "bundle C"
    ] == {"click (ms)": "7.3", "mask iou worst": "0.9931"}
    for r in recs:  # every row's provenance is printed
        assert f"`{r['command']}`" in page and r["date"] in page
    # regenerating in place is allowed; a page not written by the report is never overwritten
    assert main(["report", *map(str, paths), "--out", str(out)]) == 0
    assert page == out.read_text()
    mine = tmp_path / "mine.md"
    mine.write_text("my notes")
    assert main(["report", str(tmp_path / "rec"), "--out", str(mine)]) == 2
    assert mine.read_text() == "my notes"


def test_report_refuses_bad_records(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"row": "x"}))
    with pytest.raises(UserError, match="not a sam2edge.record/1 record"):
        load_records([bad])
    with pytest.raises(UserError, match="no such record"):
        load_records([tmp_path / "missing.json"])


def test_published_records_render():
    recs = load_records([ROOT / "benchmarks" / "records"])
    page = markdown(recs)
    for r in recs:
        assert r["row"] in page and r["command"] in page


def test_no_work_log_references():
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    hits = []
    for f in files:
        p = ROOT / f
        if p.suffix.lower() in BINARY or not p.is_file() or p.name in ("package-lock.json",):
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if WORK_LOG.search(line):
                hits.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not hits, "work-log references (write decisions as decisions):\n" + "\n".join(hits[:50])


def test_bench_records_render(tmp_path, capsys):
    """A ``sam2edge bench`` run's records name their command and commit and render as a table row each."""
    recs, page = tmp_path / "records", tmp_path / "bench.md"
    args = ["bench", "--upstream", "--config", "test-small", "--runs", "1", "--warmup", "0", "--clicks", "1"]
    assert main([*args, "--threads", "1", "--records", str(recs)]) == 0
    raw = [json.loads(p.read_text()) for p in recs.rglob("*.json")]
    assert raw and all(r["command"] and r["commit"] for r in raw)
    assert main(["report", str(recs), "--out", str(page)]) == 0
    text = page.read_text()
    for r in raw:
        row = next(line for line in text.splitlines() if line.startswith(f"| {r['subject']} |"))
        assert f"| {r['encoder_ms']['median']:.1f} |" in row or f"| {r['encoder_ms']['median']:.0f} |" in row
        assert f"`{r['command']}`" in text


def test_readme_bundle_table_matches_the_records():
    """Every figure of the README's "Which bundle should I ship" table is a figure of the record of that row."""
    recs = {r["row"]: r["figures"] for r in load_records([ROOT / "benchmarks" / "records"])}
    text = (ROOT / "README.md").read_text().split("## Which bundle should I ship", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip().strip("*") for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
    rows = [r for r in rows if len(r) == 7 and r[0] not in ("bundle", "---")]
    assert len(rows) >= 6
    for label, files, enc, enc_x, click, click_x, iou in rows:
        f = recs[label]  # a row without a record fails here
        expect = {
            files: f"{f['encoder_file_mb']:.1f} + {f['decoder_file_mb']:.1f} MB" if "encoder_file_mb" in f else "",
            enc: f"{f['encoder_ms']:.0f} ms",
            enc_x: f"{f['encoder_vs_upstream_x']:.2f}x" if "encoder_vs_upstream_x" in f else "",
            click: f"{f['click_ms']:.1f} ms",
            click_x: f"{f['click_vs_upstream_x']:.2f}x" if "click_vs_upstream_x" in f else "",
        }
        for shown, want in expect.items():
            assert shown == want, (label, shown, want)
        if iou:
            worst, median = iou.rstrip(")").split(" (")
            assert float(worst) == f["mask_iou_worst"] and float(median) == f["mask_iou_median"], label
        else:
            assert "mask_iou_worst" not in f, label
