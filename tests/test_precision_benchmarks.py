"""The reduced-precision benchmark scripts: ``precision_robustness.py speed`` builds its table from one bench run's
records (and ``record`` its table from bundle cards), ``int8_bound.py`` splits two profiles by kind of operator, and
they, ``int8_rank_alone.py``, ``int8_fragile.py``, ``executorch_fp16_error.py``, ``bench_onnx_forms.py``,
``bench_eager_beside.py`` and ``bench_provenance.py`` refuse unusable input in one line with exit code 2, writing
nothing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _subject(runtime: str, encoder: float, click: float, bundle: dict | None = None) -> dict:
    return {
        "subject": f"{runtime} {bundle['precision'] if bundle else 'fp32'} 1024",
        "runtime": runtime,
        "bundle": bundle,
        "encoder_ms": {"median": encoder},
        "decoder_ms": {"median": click},
        "resolution": 1024,
        "threads": 2,
        "runs": 5,
        "clicks_per_run": 4,
        "date": "2026-01-02",
        "version": "sam2edge 9.9.9",
        "machine": {"cpu": "Test CPU", "cores": 2, "vector_extensions": ["avx2"]},
        "compute_bound": {"decoder_bound_ms": 10.0, "decoder_gflop": 2.0, "gemm_gflops": 200.0},
    }


def _bundle(folder: Path, target: str, precision: str, kept: int, status: str = "shippable") -> dict:
    folder.mkdir(parents=True)
    card = {
        "target": target,
        "precision": precision,
        "status": status,
        "source": {"checkpoint": "/somewhere/renamed.pt", "sha256": "abc"},
        "extra": {"mixed_precision": {"kept_fp32": [f"layer{i}" for i in range(kept)]}} if precision != "fp32" else {},
    }
    (folder / "card.json").write_text(json.dumps(card))
    e2e = {"iou_worst": 0.96, "iou_median": 0.991}
    (folder / "fidelity.json").write_text(json.dumps({"end_to_end": e2e}))
    return {"path": str(folder), "target": target, "precision": precision}


@pytest.fixture
def bench_run(tmp_path):
    """One bench run: an int8 and an fp32 LiteRT bundle, the peer and upstream eager (times in ms)."""
    run = tmp_path / "records" / "2026-01-02"
    run.mkdir(parents=True)
    int8 = _bundle(tmp_path / "b-int8", "litert", "int8", kept=3)
    fp32 = _bundle(tmp_path / "b-fp32", "litert", "fp32", kept=0)
    subjects = {
        "int8": _subject("litert", 450.0, 12.0, int8),
        "fp32": _subject("litert", 800.0, 12.0, fp32),
        "peer": _subject("peer-onnx", 1000.0, 30.0),
        "upstream": _subject("upstream-eager", 2000.0, 40.0),
    }
    for name, s in subjects.items():
        (run / f"{name}.json").write_text(json.dumps(s))
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "manifest.json").write_text(json.dumps({"upstream-s9": {"sha256": "abc"}}))
    return run


def test_speed_table_reads_ratios_and_goals_off_one_run(bench_run, tmp_path):
    out = tmp_path / "rec.json"
    args = ["speed", "--bench", str(bench_run), "--set", str(tmp_path / "set"), "--out", str(out)]
    assert _script("precision_robustness").main(args) == 0
    rec = json.loads(out.read_text())
    rows = {r["bundle"]: r for r in rec["rows"]}
    int8 = rows["litert int8"]
    assert (int8["encoder_vs_peer"], int8["encoder_vs_upstream"], int8["encoder_vs_fp32"]) == (
        "0.45x",
        "0.23x",
        "0.56x",
    )
    assert (int8["kept"], int8["checkpoint"], int8["click_vs_peer"]) == ("3", "upstream-s9", "0.40x")
    assert rows["peer (samexporter-style ONNX fp32)"]["encoder_vs_peer"] == "1.00x"
    goals = rec["notes"][-1]
    assert "0.45x the peer's (goal <= 0.5x: met)" in goals and "litert int8 upstream-s9 1.78x" in goals, goals
    assert "1.20x its compute bound" in goals, goals


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "no bench records"),
        ("no-peer", "no upstream eager or no peer subject"),
        ("no-bundle", "timed no bundle"),
        ("out-inside", "inside --bench"),
        ("out-exists", "never overwritten"),
        ("out-no-folder", "its folder does not exist"),
    ],
)
def test_speed_refuses_unusable_input_in_one_line(bench_run, tmp_path, capsys, case, needle):
    bench, out = bench_run, tmp_path / "rec.json"
    if case == "missing":
        bench = tmp_path / "nowhere"
    elif case == "no-peer":
        (bench / "peer.json").unlink()
    elif case == "no-bundle":
        for name in ("int8", "fp32"):
            (bench / f"{name}.json").unlink()
    elif case == "out-inside":
        out = bench / "rec.json"
    elif case == "out-no-folder":
        out = tmp_path / "no" / "rec.json"
    else:
        out.write_text("a user's file")
    assert _script("precision_robustness").main(["speed", "--bench", str(bench), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert (out.read_text() == "a user's file") if case == "out-exists" else not out.exists()


@pytest.mark.parametrize(
    "case, needle",
    [("out-exists", "never overwritten"), ("clicks", "--rank-clicks 0"), ("missing", "no such file")],
)
def test_rank_alone_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    checkpoint, out = tmp_path / "ckpt.pt", tmp_path / "out.json"
    checkpoint.write_bytes(b"not read: the arguments are refused first")
    argv = [str(checkpoint), "--out", str(out)]
    if case == "out-exists":
        out.write_text("a user's file")
    elif case == "clicks":
        argv += ["--rank-clicks", "0"]
    else:
        argv[0] = str(tmp_path / "nowhere.pt")
    assert _script("int8_rank_alone").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert (out.read_text() == "a user's file") if case == "out-exists" else not out.exists()


def test_offsets_refuses_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    assert _script("int8_offsets").main([str(tmp_path / "nowhere.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nowhere.pt: no such file" in err and "\n" not in err and err.startswith("error: "), err


def test_offsets_refuses_a_file_that_is_not_a_checkpoint_in_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.pt"
    bad.write_bytes(b"not a checkpoint")
    assert _script("int8_offsets").main([str(bad), "--config", "test-small"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "notes.pt" in err, err


def test_offsets_prints_each_blocks_gain_and_the_shifted_blocks(tmp_path, capsys):
    """On test-small weights whose block 1 has hidden channels at an offset: one row, a gain per block, block 1
    shifted (the export's own rule, ``shifts_and_scales``)."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL

    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    sd["image_encoder.trunk.blocks.1.mlp.layers.0.bias"][:4] += 6.0
    torch.save({"model": sd}, tmp_path / "offsets.pt")  # Meta's names are the image path's names
    assert _script("int8_offsets").main([str(tmp_path / "offsets.pt"), "--config", "test-small"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
    assert row[1].strip() == "offsets" and len(row[2].split()) == 6 and row[3].strip().startswith("1"), row


@pytest.mark.parametrize("script", ["int8_rank_alone", "int8_fragile", "int8_offsets", "fp16_floor"])
def test_checkpoint_scripts_refuse_a_file_that_is_not_a_checkpoint(tmp_path, capsys, script):
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"not a checkpoint")
    assert _script(script).main([str(checkpoint), "--config", "test-small"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read checkpoint" in err and "\n" not in err, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--graph", "decoder", "--forms", "fused-whole"], "unknown decoder form(s) ['fused-whole']"),
        (["--runs", "0"], "--runs 0"),
        (["--peer", "PEER"], "holds no peer encoder.onnx"),
        (["--gap", "-1"], "--gap -1.0"),
    ],
)
def test_onnx_forms_refuses_unusable_input_in_one_line(tmp_path, capsys, argv, needle):
    work = tmp_path / "work"
    argv = [a.replace("PEER", str(tmp_path)) for a in argv]
    assert _script("bench_onnx_forms").main(["--work", str(work), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert not work.exists()  # refused before anything is built


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["NOBUNDLE"], "not a bundle (no card.json)"),
        (["BUNDLE", "--runs", "0"], "--runs 0"),
        (["BUNDLE", "--checkpoint", "NOBUNDLE.pt"], "does not exist"),
    ],
)
def test_eager_beside_refuses_unusable_input_in_one_line(tmp_path, capsys, argv, needle):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "card.json").write_text("{}")
    argv = [a.replace("NOBUNDLE", str(tmp_path / "nothing")).replace("BUNDLE", str(bundle)) for a in argv]
    assert _script("bench_eager_beside").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err


def test_record_builds_rows_and_never_overwrites(tmp_path, capsys):
    """``record``: one row per bundle of the folders, the machine it ran on; an existing --out is refused."""
    bundles = tmp_path / "bundles"
    _bundle(bundles / "upstream-s9--litert--int8", "litert", "int8", kept=2)
    out = tmp_path / "rec.json"
    assert _script("precision_robustness").main(["record", "--bundles", str(bundles), "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert len(rec["rows"]) == 1 and rec["machine"]["cores"] >= 1 and "vector_extensions" in rec["machine"]
    assert rec["id"] == "precision-robustness-1024"
    named = tmp_path / "named.json"
    argv = ["record", "--bundles", str(bundles), "--out", str(named), "--id", "rs-x", "--title", "T"]
    assert _script("precision_robustness").main(argv) == 0
    named_rec = json.loads(named.read_text())
    assert (named_rec["id"], named_rec["title"]) == ("rs-x", "T")
    assert "record --bundles DIR --id rs-x" in named_rec["command"]
    out.write_text("a user's file")
    assert _script("precision_robustness").main(["record", "--bundles", str(bundles), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "never overwritten" in err and err.startswith("error: "), err
    assert out.read_text() == "a user's file"
    nowhere = tmp_path / "no" / "rec.json"
    assert _script("precision_robustness").main(["record", "--bundles", str(bundles), "--out", str(nowhere)]) == 2
    err = capsys.readouterr().err.strip()
    assert "its folder does not exist" in err and "\n" not in err and not (tmp_path / "no").exists(), err


@pytest.mark.parametrize(
    "case, needle", [("clicks", "--clicks 0"), ("missing", "no such file"), ("rows", "--rows 'TFLite': no row")]
)
def test_fragile_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"not read: the arguments are refused first")
    argv = {"clicks": [str(checkpoint), "--clicks", "0"], "rows": [str(checkpoint), "--rows", "TFLite"]}.get(
        case, [str(tmp_path / "nowhere.pt")]
    )
    assert _script("int8_fragile").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err


@pytest.mark.parametrize(
    "case, needle",
    [("no-card", "no card.json"), ("fp32", "a fp32 bundle; give an int8 one"), ("missing", "no such file")],
)
def test_draws_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    bundle, checkpoint = tmp_path / "bundle", tmp_path / "ckpt.pt"
    bundle.mkdir()
    checkpoint.write_bytes(b"not read: the arguments are refused first")
    if case != "no-card":
        (bundle / "card.json").write_text(json.dumps({"precision": "fp32" if case == "fp32" else "int8"}))
    argv = [str(bundle), str(checkpoint if case != "missing" else tmp_path / "nowhere.pt")]
    assert _script("int8_draws").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err


@pytest.mark.parametrize("script", ["int8_rank_alone", "int8_fragile", "int8_offsets", "fp16_floor"])
def test_checkpoint_scripts_refuse_an_unknown_config_in_one_line(tmp_path, capsys, script):
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"not read: the arguments are refused first")
    with pytest.raises(SystemExit) as e:
        _script(script).main([str(checkpoint), "--config", "bogus"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--config: invalid choice: 'bogus'" in err and "sam2.1-hiera-tiny" in err, err


def test_provenance_bench_never_writes_into_an_existing_folder(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("a user's file")
    assert _script("bench_provenance").main(["--work", str(work)]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists" in err and "nothing is overwritten" in err and "\n" not in err, err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and (work / "keep.txt").read_text() == "a user's file"


@pytest.mark.parametrize("flag, value", [("--target", "onnx"), ("--config", "bogus")])
def test_provenance_bench_refuses_unknown_choices(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        _script("bench_provenance").main(["--work", str(tmp_path / "w"), flag, value])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"{flag}: invalid choice: '{value}'" in err and not (tmp_path / "w").exists(), err


@pytest.mark.parametrize(
    "case, needle",
    [
        ("no-card", "no card.json"),
        ("bad-card", "not a readable card"),
        ("int8", "target executorch, precision int8; give an ExecuTorch fp16 bundle"),
        ("photo", "--photos moon.png: not a fidelity photo"),
    ],
)
def test_executorch_fp16_error_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    bundle = tmp_path / "b"
    bundle.mkdir()
    if case == "bad-card":
        (bundle / "card.json").write_bytes(b"\xff not json")
    elif case in ("int8", "photo"):
        (bundle / "card.json").write_text(json.dumps({"target": "executorch", "precision": "int8"}))
    argv = [str(bundle)] + (["--photos", "moon.png"] if case == "photo" else [])
    assert _script("executorch_fp16_error").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err


@pytest.mark.parametrize(
    "script, argv, needle",
    [
        ("executorch_fp16_error", ["b", "--attention", "flash"], "argument --attention: invalid choice: 'flash'"),
        ("executorch_fp16_ops", ["--attention", "sdpa"], "unrecognized arguments: --attention sdpa"),
    ],
)
def test_executorch_fp16_scripts_refuse_unknown_arguments(capsys, script, argv, needle):
    """An attention form the error script does not lower, or an argument the operation table does not take:
    argparse's error line (after its usage), exit 2, before anything is loaded or lowered."""
    with pytest.raises(SystemExit) as e:
        _script(script).main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "error: " in err and needle in err, err


def test_executorch_fp16_error_refuses_a_kept_part_that_is_not_a_module(tmp_path, capsys):
    bundle = tmp_path / "b"
    bundle.mkdir()
    card = {"target": "executorch", "precision": "fp16", "config": "test-small", "source": {}, "extra": {}}
    (bundle / "card.json").write_text(json.dumps(card))
    assert _script("executorch_fp16_error").main([str(bundle), "--keep", "image_encoder.trunk.block"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (torchao's import may print lines before it)
    assert "--keep image_encoder.trunk.block: not a module" in err and err.startswith("error: "), err


def test_onnx_vnni_encoder_gets_its_own_row_and_the_check_the_bench_ran(tmp_path):
    """An ONNX int8 bundle's ``encoder_vnni.onnx`` (static activations) is a row of its own in ``record``, with its
    own check; ``speed`` labels the bundle by its activations and shows the check of the file a VNNI CPU ran."""
    mod = _script("precision_robustness")
    folder = tmp_path / "bundles" / "upstream-s9--onnx--int8"
    bundle = _bundle(folder, "onnx", "int8", kept=2)  # the portable encoder.onnx's selection
    card = json.loads((folder / "card.json").read_text())
    card["extra"]["int8_activations"] = {"mode": "static", "shipped": "static"}
    (folder / "card.json").write_text(json.dumps(card))
    vnni_e2e = {"iou_worst": 0.9524, "iou_median": 0.9906}
    fidelity = {"end_to_end": {"iou_worst": 0.963, "iou_median": 0.9927}}
    fidelity["checks"] = {"int8_vnni": {"shipped": True, "int8": "static", "end_to_end": vnni_e2e}}
    (folder / "fidelity.json").write_text(json.dumps(fidelity))
    out = tmp_path / "rec.json"
    assert mod.main(["record", "--bundles", str(tmp_path / "bundles"), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["precision"], r["worst"], r["kept_fp32"]) for r in rows] == [
        ("int8", 0.963, "layer0, layer1"),
        ("int8, encoder_vnni.onnx (static activations)", 0.9524, "none (every product int8)"),
    ]
    run = tmp_path / "run"
    run.mkdir()
    vnni_cpu = _subject("onnx", 450.0, 12.0, bundle)
    vnni_cpu["machine"]["vector_extensions"] = ["avx2", "avx512_vnni"]
    for name, s in {
        "i8": vnni_cpu,
        "p": _subject("peer-onnx", 1000.0, 30.0),
        "u": _subject("upstream-eager", 2e3, 40.0),
    }.items():
        (run / f"{name}.json").write_text(json.dumps(s))
    speed = tmp_path / "speed.json"
    assert mod.main(["speed", "--bench", str(run), "--out", str(speed)]) == 0
    (row,) = [r for r in json.loads(speed.read_text())["rows"] if r["bundle"].startswith("onnx")]
    assert row["bundle"] == "onnx int8, static activations" and row["mask_iou"] == "0.9524 (0.9906)"
    assert row["kept"] == "0"  # the static file quantises every product, whatever encoder.onnx keeps
    no_vnni = mod._ran_check(fidelity, {"vector_extensions": ["avx2"]})
    assert no_vnni == ("", fidelity["end_to_end"], False)  # encoder.onnx


@pytest.mark.parametrize(
    "case, needle",
    [
        ("no-card", "no card.json; give a LiteRT fp32 bundle"),
        ("int8-bundle", "is a litert int8 bundle; give a LiteRT fp32 one"),
        ("no-checkpoint", "no such file; give the checkpoint the bundle was exported from"),
        ("runs", "--runs 0: give 1 or more"),
        ("record-exists", "exists; name a new file for --record"),
    ],
)
def test_litert_static_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    bundle, ckpt, record = tmp_path / "b", tmp_path / "c.pt", tmp_path / "r.json"
    bundle.mkdir()
    if case != "no-card":
        precision = "int8" if case == "int8-bundle" else "fp32"
        (bundle / "card.json").write_text(json.dumps({"target": "litert", "precision": precision}))
    if case != "no-checkpoint":
        ckpt.write_bytes(b"not read: the arguments are refused first")
    record.write_text("a user's file")
    argv = [str(bundle), "--checkpoint", str(ckpt), "--work", str(tmp_path / "w")]
    argv += ["--runs", "0"] if case == "runs" else []
    argv += ["--record", str(record)] if case == "record-exists" else []
    assert _script("litert_static_int8").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert record.read_text() == "a user's file" and not (tmp_path / "w").exists()


def _profile(target: str, precision: str, types: dict[str, float]) -> dict:
    """A ``sam2edge bench --profile`` record whose encoder took ``types`` (operator type -> ms per call)."""
    by_type = [{"op": op, "ms": ms, "share": 0.0, "count": 1} for op, ms in types.items()]
    return {
        "kind": "profile",
        "target": target,
        "precision": precision,
        "resolution": 1024,
        "threads": 2,
        "runs": 3,
        "time": "2026-01-02T03:04:05Z",
        "machine": {"cpu": "Test CPU", "cores": 2, "vector_extensions": ["avx2"]},
        "runtime": {"encoder": {"by_type": by_type}},
    }


def test_int8_bound_splits_the_profiles_by_kind_and_computes_the_ceiling(tmp_path, capsys):
    """fp32: 300 ms of weight products, 100 of activation products, 100 of the rest; int8 quantised 240 ms of the
    products to 80 (3x) and kept 60 ms fp32: 80 + 60 + 100 + 100 = 340 ms. Every product at 3x gives 300 ms, a
    ceiling of 500 / 300 = 1.67x; 1.6x needs the products at 300 / (500 / 1.6 - 200) = 2.67x."""
    fp32 = {"FULLY_CONNECTED": 280.0, "CONV_2D": 20.0, "BATCH_MATMUL": 100.0, "SOFTMAX": 60.0, "RESHAPE": 40.0}
    int8 = {"FULLY_CONNECTED int8": 80.0, "FULLY_CONNECTED": 60.0, "BATCH_MATMUL": 100.0, "SOFTMAX": 100.0}
    paths = [tmp_path / "q.json", tmp_path / "f.json"]
    paths[0].write_text(json.dumps(_profile("litert", "int8", int8)))
    paths[1].write_text(json.dumps(_profile("litert", "fp32", fp32)))
    record = tmp_path / "bound.json"
    assert _script("int8_bound").main([*map(str, paths), "--record", str(record)]) == 0
    row = json.loads(record.read_text())["rows"][0]
    assert (row["fp32_ms"], row["int8_ms"], row["speedup"]) == (500, 340, "1.47x")
    assert (row["weight_ms"], row["weight_speedup"]) == ("300 -> 80 + 60 kept fp32", "3.00x")
    assert (row["activation_ms"], row["rest_ms"], row["ceiling"], row["needed"]) == (
        "100 -> 100", "100 -> 100", "1.67x", "2.67x"
    )  # fmt: skip
    et = {"xnnpack:Fully Connected (NC, QDU8, F32, QC8W) GEMM": 50.0, "xnnpack:Batch Matrix Multiply (NC, F32)": 400.0}
    et_fp32 = {"xnnpack:Fully Connected (NC, F32) GEMM": 150.0, "xnnpack:Batch Matrix Multiply (NC, F32)": 400.0}
    assert (
        _script("int8_bound").bound(_profile("executorch", "int8", et), _profile("executorch", "fp32", et_fp32), 1.6)[
            "needed"
        ]
        == "unreachable"
    )  # 550 / 1.6 < 400 ms of activation products alone


@pytest.mark.parametrize(
    "case, needle",
    [
        ("odd", "give them in pairs"),
        ("not-a-profile", "not an encoder profile"),
        ("no-encoder", "not an encoder profile"),
        ("order", "not an int8 and an fp32 profile of one target, in that order"),
        ("onnx", "has no operator kinds"),
        ("no-int8", "no int8 product"),
        ("nan-ms", "not an encoder profile"),
        ("string-ms", "not an encoder profile"),
        ("negative-ms", "not an encoder profile"),
        ("kept-more", "keeps more fp32 products than the fp32 one has"),
        ("goal-nan", "--goal nan: give a finite speed-up above 0"),
        ("goal-inf", "--goal inf: give a finite speed-up above 0"),
        ("goal-zero", "--goal 0.0: give a finite speed-up above 0"),
        ("record-exists", "exists; name a new file for --record"),
        ("record-is-input", "exists; name a new file for --record"),
        ("record-no-folder", "its folder does not exist"),
    ],
)
def test_int8_bound_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    q = _profile("onnx" if case == "onnx" else "litert", "int8", {"FULLY_CONNECTED int8": 1.0})
    f = _profile("litert", "fp32", {"FULLY_CONNECTED": 3.0})
    if case == "no-int8":
        q["runtime"]["encoder"]["by_type"][0]["op"] = "FULLY_CONNECTED"
    if case == "no-encoder":  # a profile of a bundle without an encoder graph, such as a decoder-only run
        q["runtime"] = {"decoder": q["runtime"]["encoder"]}
    bad_ms = {"nan-ms": float("nan"), "string-ms": "3 ms", "negative-ms": -1.0}
    if case in bad_ms:
        q["runtime"]["encoder"]["by_type"][0]["ms"] = bad_ms[case]
    if case == "kept-more":  # the "int8" profile keeps more fp32 products than the fp32 profile holds in all
        q["runtime"]["encoder"]["by_type"].append({"op": "FULLY_CONNECTED", "ms": 5.0})
    paths = [tmp_path / "q.json", tmp_path / "f.json"]
    paths[0].write_text("not json" if case == "not-a-profile" else json.dumps(q))
    paths[1].write_text(json.dumps(f))
    record = tmp_path / "r.json"
    record.write_text("a user's file")
    argv = [*map(str, {"odd": paths[:1], "order": paths[::-1]}.get(case, paths))]
    out = {"record-exists": record, "record-is-input": paths[1], "record-no-folder": tmp_path / "no" / "r.json"}
    argv += ["--record", str(out[case])] if case in out else []
    goals = {"goal-nan": "nan", "goal-inf": "inf", "goal-zero": "0"}
    argv += ["--goal", goals[case]] if case in goals else []
    fp32_before = paths[1].read_text()
    assert _script("int8_bound").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert record.read_text() == "a user's file" and paths[1].read_text() == fp32_before
    assert not (tmp_path / "no").exists()


def test_fp16_floor_rounds_where_each_row_says_and_matches_the_emulation(tmp_path, capsys):
    """At test-small: nothing rounded is the reference itself; rounding every part's output reproduces the
    ExecuTorch fp16 emulation with every part kept fp32 (the tensors it hands between its fp32 islands)."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL

    torch.save({"model": variant_state_dict("synthetic:1", TEST_SMALL)}, tmp_path / "ckpt.pt")
    record = tmp_path / "floor.json"
    argv = [str(tmp_path / "ckpt.pt"), "--config", "test-small", "--clicks", "8", "--record", str(record)]
    assert _script("fp16_floor").main(argv) == 0
    rows = json.loads(record.read_text())["rows"]
    assert [r["rounded"] for r in rows][-2:] == [
        "input, outputs and every part's output",
        "ExecuTorch fp16 emulation, every part kept fp32",
    ]
    assert (rows[0]["worst"], rows[0]["median"]) == (1.0, 1.0)
    assert all(r["worst"] < 1.0 for r in rows[1:])  # every rounding moves some mask pixel at test-small
    assert abs(rows[-1]["worst"] - rows[-2]["worst"]) < 2e-3 and abs(rows[-1]["median"] - rows[-2]["median"]) < 1e-3


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "no such file"),
        ("clicks", "--clicks 0: give 1 or more"),
        ("record-exists", "exists; name a new"),
        ("record-is-input", "exists; name a new"),
        ("record-no-folder", "its folder does not exist"),
    ],
)
def test_fp16_floor_refuses_unusable_input_in_one_line(tmp_path, capsys, case, needle):
    checkpoint, record = tmp_path / "ckpt.pt", tmp_path / "r.json"
    if case != "missing":
        checkpoint.write_bytes(b"not read: the arguments are refused first")
    record.write_text("a user's file")
    argv = [str(checkpoint), "--config", "test-small", *(["--clicks", "0"] if case == "clicks" else [])]
    out = {"record-exists": record, "record-is-input": checkpoint, "record-no-folder": tmp_path / "no" / "r.json"}
    argv += ["--record", str(out[case])] if case in out else []
    assert _script("fp16_floor").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("error: "), err
    assert record.read_text() == "a user's file" and not (tmp_path / "no").exists()
    if case != "missing":
        assert checkpoint.read_bytes() == b"not read: the arguments are refused first"
