"""Evidence: cards rendered from records, manifests, malformed cards, verify, bench, byte-identical re-export.

The card and manifest tests use a hand-made bundle (no model); verify / bench / re-export use a real
``test-small`` export of the fastest available target.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from sam2edge.bundle import finalize_bundle, load_card, verify_manifest, write_manifest
from sam2edge.cards.render import render_bundle
from sam2edge.cli.export import TARGETS
from sam2edge.cli.main import main
from sam2edge.weights import save_checkpoint, synthetic_state_dict

SHA_A = "a" * 64


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models on a shared 2-core box: one thread per runtime avoids spin-wait thrash."""
    mp, old = pytest.MonkeyPatch(), torch.get_num_threads()
    mp.setenv("SAM2EDGE_ORT_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
    mp.undo()


FIDELITY = {
    "verify": {
        "date": "2026-11-01",
        "command": "sam2edge verify b",
        "reference": "eager fp32",
        "precision": "fp16",
        "outputs": {
            "encoder.image_embed": {
                "cosine": 0.9999871,
                "correlation": 0.9999862,
                "max_abs": 0.0123,
                "max_rel": 0.0021,
            },
            "decoder.masks": {"cosine": 0.9998765, "correlation": 0.9998701, "max_abs": 0.25, "max_rel": 0.0075},
        },
        "end_to_end": {
            "clicks": 40,
            "photos": ["a", "b", "c", "d", "e"],
            "iou_median": 0.99931,
            "iou_worst": 0.99213,
            "selection_agreement": 0.975,
            "iou_score_max_abs_diff": 0.0042,
        },
        "bars": {"min_iou_worst": 0.99},
        "passed": True,
        "failures": [],
    }
}


def _stats(median: float, lo: float, hi: float) -> dict:
    return {"median": median, "min": lo, "max": hi, "mean": (lo + hi + median) / 3, "n": 5, "samples": []}


def _record(subject: str, runtime: str, artifacts: dict | None, enc: float, dec: float, session: str = "S1") -> dict:
    return {
        "schema": 1,
        "kind": "bench",
        "provenance": "measured",
        "subject": subject,
        "runtime": runtime,
        "runtime_version": "onnxruntime 1.0",
        "version": "sam2edge 0.1.0",
        "precision": "fp16",
        "resolution": 256,
        "bundle": None if artifacts is None else {"artifacts": artifacts},
        "threads": 2,
        "date": "2026-11-02",
        "session": session,
        "machine": {"cpu": "TestCPU", "cores": 2, "os": "Linux"},
        "load_s": 0.51,
        "peak_rss_mb": 432.0,
        "encoder_ms": _stats(enc, enc - 5, enc + 9),
        "decoder_ms": _stats(dec, dec - 1, dec + 2),
        "first_click_ms": _stats(enc + dec, enc + dec - 6, enc + dec + 11),
    }


@pytest.fixture
def fixture_bundle(tmp_path: Path) -> Path:
    """A bundle with two fake artifacts, fidelity.json, bench records (one foreign) and a sweep record."""
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "encoder.onnx").write_bytes(b"enc" * 1000)
    (b / "decoder.onnx").write_bytes(b"dec" * 500)
    finalize_bundle(
        b,
        target="onnx",
        precision="fp16",
        resolution=256,
        config="test-small",
        source={"checkpoint": "synthetic", "format": "synthetic", "sha256": None},
        command="sam2edge export --target onnx",
        fidelity=FIDELITY,
        artifacts={"encoder.onnx": "encoder", "decoder.onnx": "decoder"},
    )
    card = load_card(b)
    arts = {a["file"]: a["sha256"] for a in card["artifacts"]}
    recs = tmp_path / "records"
    recs.mkdir()
    for name, rec in {
        "mine.json": _record("onnx fp16 256", "onnx", arts, 812.25, 23.5),
        "up.json": _record("upstream-eager fp32 256", "upstream-eager", None, 1624.5, 47.0),
        "foreign.json": _record("onnx fp16 256", "onnx", {"encoder.onnx": SHA_A}, 999.0, 99.0, session="S2"),
        "up_other_session.json": _record("upstream-eager fp32 256", "upstream-eager", None, 5555.0, 55.0, "S2"),
    }.items():
        (recs / name).write_text(json.dumps(rec))
    sweep = b / "sweep" / "2.5.3" / "2026-11-03"
    sweep.mkdir(parents=True)
    (sweep / "decoder.json").write_text(
        json.dumps(
            {  # the layout `sam2edge sweep` writes
                "schema": 1,
                "file": "decoder.tflite",
                "date": "2026-11-03",
                "provenance": "measured",
                "environment": {"label": "x86_64 2 cores · chromium 156 · @litertjs/core 2.5.3"},
                "results": [
                    {
                        "backend": "wasm",
                        "status": "pass",
                        "full_delegation": None,
                        "max_rel_diff": 2.5e-07,
                        "latency_p50_ms": 396.69,
                    },
                    {
                        "backend": "webgpu",
                        "status": "output_mismatch",
                        "full_delegation": True,
                        "max_rel_diff": 1.0,
                        "latency_p50_ms": 8.33,
                    },
                ],
            }
        )
    )
    write_manifest(b)  # as the sweep does after adding records
    return b


def _table(text: str, heading: str) -> list[list[str]]:
    """Rows (cells) of the first markdown table after ``heading``."""
    section = text.split(heading, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    out = []
    for line in rows[2:]:
        out.append([c.strip() for c in line.strip("|").split("|")])
        if not section.split(line, 1)[1].lstrip(" ").startswith("\n|"):
            break
    return out


def test_card_rendered_from_fixture_records(fixture_bundle: Path, tmp_path: Path) -> None:
    out = render_bundle(fixture_bundle, [tmp_path / "records"])
    text = (fixture_bundle / "README.md").read_text()
    front = text.split("---\n")[1]
    for line in (
        "license: apache-2.0",
        "base_model: facebook/sam2.1-hiera-tiny",
        "pipeline_tag: mask-generation",
        "library_name: onnx",
    ):
        assert line in front
    for heading in (
        "## Conversion",
        "## Artifacts",
        "## Fidelity",
        "## Performance",
        "## Browser (LiteRT.js)",
        "## Pitfalls",
    ):
        assert heading in text
    card = load_card(fixture_bundle)
    arts = {r[0].strip("`"): r for r in _table(text, "## Artifacts")}
    for a in card["artifacts"]:
        assert arts[a["file"]][2] == f"`{a['sha256']}`" and arts[a["file"]][3] == f"{a['bytes'] / 1e6:.3f}"
    fid = {r[0].strip("`"): r for r in _table(text, "## Fidelity")}
    assert fid["encoder.image_embed"][1:] == ["0.9999871", "0.9999862", "0.0123", "0.0021"]
    assert fid["decoder.masks"][1:3] == ["0.9998765", "0.9998701"]
    assert "| verify 2026-11-01 | 40 | 5 | 0.99931 | 0.99213 | 0.975 | 0.0042 |" in text
    perf = _table(text, "## Performance")
    assert [r[0] for r in perf] == ["onnx fp16 256", "upstream-eager fp32 256"]  # foreign session excluded
    assert perf[0][1:8] == ["2", "0.51", "812.2", "23.50", "835.8", "432", "0.50×"]
    assert perf[1][3:6] == ["1624.5", "47.00", "1671.5"]
    assert perf[0][9:] == ["2026-11-02", "measured"]
    browser = _table(text, "## Browser (LiteRT.js)")
    env = "x86_64 2 cores · chromium 156 · @litertjs/core 2.5.3"
    assert browser == [
        ["`decoder.tflite`", "wasm", "pass", "-", "2.5e-07", "396.69", env, "2026-11-03", "measured"],
        ["`decoder.tflite`", "webgpu", "output_mismatch", "full", "1", "8.33", env, "2026-11-03", "measured"],
    ]
    assert out["bench"] == 2 and out["sweep"] == 1
    with Image.open(fixture_bundle / "latency.png") as im:
        assert im.format == "PNG" and im.height > 100
    card = load_card(fixture_bundle)
    assert len(card["records"]["bench"]) == 2 and card["records"]["sweep"] == ["sweep/2.5.3/2026-11-03/decoder.json"]
    assert all((fixture_bundle / p).is_file() for p in card["records"]["bench"])
    assert verify_manifest(fixture_bundle) == []
    first = (fixture_bundle / "latency.png").read_bytes()
    render_bundle(fixture_bundle, [tmp_path / "records"])  # records now also inside the bundle: no duplicates
    assert (fixture_bundle / "latency.png").read_bytes() == first
    assert len(_table((fixture_bundle / "README.md").read_text(), "## Performance")) == 2


def test_tampered_artifact_fails_manifest_verify(fixture_bundle: Path, capsys) -> None:
    assert main(["manifest", "verify", str(fixture_bundle)]) == 0
    data = bytearray((fixture_bundle / "decoder.onnx").read_bytes())
    data[100] ^= 1
    (fixture_bundle / "decoder.onnx").write_bytes(bytes(data))
    (fixture_bundle / "extra.bin").write_bytes(b"x")
    capsys.readouterr()
    assert main(["manifest", "verify", str(fixture_bundle)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: decoder.onnx: sha256" in out and "FAIL: extra.bin: not listed" in out
    assert "encoder.onnx" not in out
    (fixture_bundle / "encoder.onnx").unlink()
    assert "encoder.onnx: missing" in "\n".join(verify_manifest(fixture_bundle))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c.pop("precision"), "precision"),
        (lambda c: c.update(resolution="big"), "resolution"),
        (lambda c: c.update(precision="fp8"), "precision"),
        (lambda c: c["artifacts"][0].update(sha256="xyz"), "artifacts"),
        (lambda c: c.update(source="synthetic"), "source"),
    ],
)
def test_malformed_card_is_one_line_error_naming_the_field(fixture_bundle: Path, capsys, edit, field) -> None:
    card = json.loads((fixture_bundle / "card.json").read_text())
    edit(card)
    (fixture_bundle / "card.json").write_text(json.dumps(card))
    for command in (["card", "render"], ["verify"], ["bench"]):
        assert main([*command, str(fixture_bundle)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and f"'{field}'" in err


def test_invalid_json_card_is_one_line_error(fixture_bundle: Path, capsys) -> None:
    (fixture_bundle / "card.json").write_text('{"schema": 1,')
    assert main(["card", "render", str(fixture_bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "card.json" in err


# ---- real bundles --------------------------------------------------------------------------------------

FASTEST_FIRST = ("onnx", "litert", "executorch")
TARGET = next((t for t in FASTEST_FIRST if t in TARGETS), next(iter(TARGETS)))


def _export(target: str, cwd: Path, monkeypatch, precision: str = "fp32") -> Path:
    """The same export command (relative --out) run in ``cwd``."""
    monkeypatch.chdir(cwd)
    assert main(["export", "--target", target, "--precision", precision, "--config", "test-small", "--out", "b"]) == 0
    return cwd / "b"


def _artifact_shas(bundle: Path) -> dict[str, str]:
    files = [a["file"] for a in load_card(bundle)["artifacts"]]
    return {f: hashlib.sha256((bundle / f).read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def exported(small_bundle) -> Path:
    """The session's ``sam2edge export --target TARGET --config test-small --precision fp32 --out ABSOLUTE``
    (``small_bundle``); every test here copies it before writing."""
    return small_bundle(TARGET)


def test_reexport_is_byte_identical(exported: Path, tmp_path: Path, monkeypatch) -> None:
    again = _export(TARGET, tmp_path, monkeypatch)
    first, second = _artifact_shas(exported), _artifact_shas(again)
    assert first == second, f"{TARGET} export is not reproducible: {[f for f in first if first[f] != second.get(f)]}"


@pytest.mark.slow
@pytest.mark.parametrize("target, precision", [(t, "fp32") for t in sorted(TARGETS)] + [("litert", "fp16")])
def test_reexport_is_byte_identical_every_target(target: str, precision: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a = _export(target, tmp_path / "one", monkeypatch, precision)
    b = _export(target, tmp_path / "two", monkeypatch, precision)
    assert _artifact_shas(a) == _artifact_shas(b)


def test_verify_passes_on_bundle_and_fails_on_perturbed_weights(exported: Path, tmp_path: Path, capsys) -> None:
    good = tmp_path / "good"
    shutil.copytree(exported, good)
    assert main(["verify", str(good)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out
    fid = json.loads((good / "fidelity.json").read_text())["verify"]
    assert fid["passed"] and fid["end_to_end"]["clicks"] >= 40 and len(fid["end_to_end"]["photos"]) >= 5
    assert {
        "encoder.image_embed",
        "encoder.feat_s0",
        "encoder.feat_s1",
        "decoder.masks",
        "decoder.iou",
        "decoder.single_mask",
        "decoder.single_iou",
        "decoder.object_score",
    } <= set(fid["outputs"])
    assert min(m["cosine"] for m in fid["outputs"].values()) >= 0.99999
    assert verify_manifest(good) == []  # manifest refreshed after fidelity.json changed
    assert load_card(good)["fidelity"]["verify"]["passed"]

    # the bundle's weights no longer match its recorded checkpoint: every weight off by ~1 %
    from sam2edge.config import TEST_SMALL

    sd = synthetic_state_dict(TEST_SMALL)
    g = torch.Generator().manual_seed(7)
    perturbed = {k: v + 0.01 * v.std().nan_to_num(0) * torch.randn(v.shape, generator=g) for k, v in sd.items()}
    ckpt = tmp_path / "perturbed.pt"
    save_checkpoint(perturbed, "meta", ckpt)
    bad = tmp_path / "bad"
    shutil.copytree(exported, bad)
    card = json.loads((bad / "card.json").read_text())
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    card["source"] = {"checkpoint": str(ckpt), "format": "meta", "sha256": digest}
    (bad / "card.json").write_text(json.dumps(card))
    assert main(["verify", str(bad), "--no-write"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"FAIL: (encoder|decoder)\.\w+: cosine 0\.\d+ < 0\.99999", out)


def test_bench_writes_records_with_the_fields(exported: Path, tmp_path: Path, capsys) -> None:
    recs = tmp_path / "records"
    args = ["bench", "--compare", str(exported), "--runs", "2", "--warmup", "1", "--clicks", "2", "--threads", "1"]
    assert main([*args, "--records", str(recs)]) == 0
    out = capsys.readouterr().out
    assert "upstream-eager fp32 256" in out and "enc/upstream" in out and "compute bound" in out
    files = sorted(recs.rglob("*.json"))
    assert len(files) == 2
    records = [json.loads(p.read_text()) for p in files]
    for r in records:
        for key in (
            "runtime",
            "runtime_version",
            "version",
            "machine",
            "threads",
            "date",
            "session",
            "load_s",
            "peak_rss_mb",
            "encoder_ms",
            "decoder_ms",
            "first_click_ms",
            "ratios",
            "compute_bound",
        ):
            assert key in r, key
        assert r["provenance"] == "measured" and r["threads"] == 1
        assert r["encoder_ms"]["n"] == 2 and r["decoder_ms"]["n"] == 4 and r["load_s"] > 0
        assert r["encoder_ms"]["min"] <= r["encoder_ms"]["median"] <= r["encoder_ms"]["max"]
        assert r["first_click_ms"]["median"] > r["encoder_ms"]["median"]
        assert r["compute_bound"]["encoder_gflop"] > 0 and r["compute_bound"]["gemm_gflops"] > 0
    assert {r["runtime"] for r in records} == {TARGET, "upstream-eager"}
    up = next(r for r in records if r["runtime"] == "upstream-eager")
    assert up["ratios"]["encoder_vs_upstream"] == 1.0
    # the card picks these records up
    bundle = tmp_path / "b"
    shutil.copytree(exported, bundle)
    render_bundle(bundle, [recs])
    perf = _table((bundle / "README.md").read_text(), "## Performance")
    mine = next(r for r in records if r["runtime"] == TARGET)
    assert perf[0][0] == mine["subject"] and perf[0][3] == f"{mine['encoder_ms']['median']:.1f}"


def test_card_shows_the_gpu_delegate_check(fixture_bundle: Path, tmp_path: Path) -> None:
    fid_path = fixture_bundle / "fidelity.json"
    fid = json.loads(fid_path.read_text())
    out = {"cosine": 0.99999991, "correlation": 1.0, "max_abs": 1e-6, "max_rel": 1e-6}
    fid["checks"] = {
        "gpu_delegate": {
            "environment": {"vulkan_device": "SwiftShader Device (Subzero)", "ai_edge_litert": "2.3.0"},
            "files": {
                "encoder.tflite": {
                    "verdict": "resident",
                    "ops_gpu": 1280,
                    "ops_total": 1280,
                    "partitions": 1,
                    "outputs": {"image_embeddings": out, "feat_s0": {**out, "cosine": 0.99995}},
                    "mask_iou": None,
                    "segments": [{"nodes": [0, 640]}, {"nodes": [640, 1280]}],
                },
                "decoder.tflite": {
                    "verdict": "mismatch",
                    "ops_gpu": 386,
                    "ops_total": 386,
                    "partitions": 1,
                    "outputs": {"masks": out},
                    "mask_iou": {"iou_worst": 0.5},
                    "segments": [],
                    "failures": ["decoder mask IoU worst 0.5000 < 0.99"],
                },
                "mask_encoder.tflite": {
                    "verdict": "device-limit",
                    "ops_gpu": 29,
                    "ops_total": 29,
                    "partitions": 1,
                    "outputs": {},
                    "mask_iou": None,
                    "failures": ["too slow"],
                },
            },
        }
    }
    fid_path.write_text(json.dumps(fid))
    render_bundle(fixture_bundle, [tmp_path / "records"])
    text = (fixture_bundle / "README.md").read_text()
    assert "SwiftShader Device (Subzero) · 2.3.0" in text
    assert _table(text, "## GPU delegate (software GPU)") == [
        ["`encoder.tflite`", "resident", "1280/1280", "1", "0.9999500", "-", "GPU run in 2 chained pieces"],
        ["`decoder.tflite`", "mismatch", "386/386", "1", "0.9999999", "0.50000", "whole graph"],
        ["`mask_encoder.tflite`", "device-limit", "29/29", "1", "-", "-", "-"],
    ]
    assert "- `decoder.tflite` on the software GPU: mismatch: decoder mask IoU worst 0.5000 < 0.99" in text
