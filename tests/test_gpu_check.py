"""GPU check: LiteRT's GPU delegate on SwiftShader's Vulkan device (small models; CI installs the device).

A missing Vulkan device makes these tests FAIL (scripts/setup.sh installs libvulkan1 + chromium).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from sam2edge.checks.gpu import check as gpu_check
from sam2edge.checks.gpu.check import check_file, parse_delegate_log, run_on, verdict_of
from sam2edge.checks.gpu.feeds import Feeds
from sam2edge.checks.gpu.report import format_report
from sam2edge.checks.tflite.lint import lint_file
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.model import Rewrites, build_sam2
from sam2edge.weights import synthetic_state_dict

FIVE_D_REASON = "Tensor dimensions must be less than 5"


class Clean(nn.Module):
    """conv -> relu -> per-pixel linear; every op GPU-friendly, rank <= 4."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.lin = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.conv(x))  # 1x8x16x16
        return self.lin(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) * 2.0 + 1.0, y.mean(dim=(2, 3))


class FiveD(nn.Module):
    """The naive-export pattern: channels split into a 5-D tensor for a softmax over groups."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        z = y.reshape(1, 2, 4, 16, 16).softmax(dim=1)  # 5-D
        return z.reshape(1, 8, 16, 16) + y


def _convert(module: nn.Module, args: tuple, path) -> None:
    import litert_torch

    litert_torch.convert(module.eval(), args).export(str(path))


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("toys")
    x = torch.randn(1, 3, 16, 16)
    modules = {"clean": Clean(), "five_d": FiveD()}
    for name, m in modules.items():
        _convert(m, (x,), folder / f"{name}.tflite")
    return folder, modules


def test_vulkan_device_present():
    """CI installs it (scripts/setup.sh); without it every GPU test below must fail, not skip."""
    assert gpu_check.vulkan_icd().is_file()


def test_clean_model_is_resident(toys):
    folder, _ = toys
    r = check_file(folder / "clean.tflite")
    assert r.verdict == "resident", r.failures
    assert r.residency.ops_gpu == r.residency.ops_total == lint_file(folder / "clean.tflite").nodes
    assert r.residency.partitions == 1 and r.residency.rejected == []
    assert "SwiftShader" in r.residency.device
    assert all(m["cosine"] >= 0.9999 for m in r.outputs.values())


def test_five_d_reshape_is_partial_with_reason(toys):
    folder, _ = toys
    r = check_file(folder / "five_d.tflite")
    assert r.verdict == "partial"
    assert 0 < r.residency.ops_gpu < r.residency.ops_total
    reasons = [x["reason"] for x in r.residency.rejected if x["op"] == "RESHAPE"]
    assert reasons and all(FIVE_D_REASON in why for why in reasons)
    # the reason this check parses the log: the API claims full acceleration of this partial graph
    assert r.residency.fully_accelerated_claim is True
    # the CPU fallback keeps the answer right
    assert r.outputs["output_0"]["cosine"] >= 0.9999


def test_gpu_outputs_match_cpu_and_eager(toys):
    folder, modules = toys
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    feeds = Feeds({"x": x}, [{"args_0": "x"}])
    gpu, summary, log = run_on(folder / "clean.tflite", "gpu", feeds)
    cpu, _, _ = run_on(folder / "clean.tflite", "cpu", feeds)
    assert "Selected adapter: SwiftShader" in log and "Initializing WebGPU-based API" in log
    with torch.no_grad():
        ref = [t.numpy() for t in modules["clean"](torch.from_numpy(x))]
    for j, name in enumerate(summary["outputs"]):
        np.testing.assert_allclose(gpu[f"0/{name}"], ref[j], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(gpu[f"0/{name}"], cpu[f"0/{name}"], atol=1e-5, rtol=1e-5)


def test_parse_delegate_log_forms():
    partial = (
        "Selected adapter: SwiftShader Device (Subzero), arch=swiftshader, vendor=google, backend=Vulkan, x\n"
        "ERROR: Following operations are not supported by GPU delegate:\n"
        "RESHAPE: Tensor dimensions must be less than 5. m;3\n"
        "SLICE: Slicing is unsupported for input with rank > 4\n"
        "21 operations will run on the GPU, and the remaining 26 operations will run on the CPU.\n"
        "I0000 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.\n"
    )
    r = parse_delegate_log(partial, ops_total=47)
    assert (r.ops_gpu, r.ops_total, r.partitions) == (21, 47, 1)
    assert [x["op"] for x in r.rejected] == ["RESHAPE", "SLICE"]
    assert r.device.startswith("SwiftShader Device (Subzero)")
    full = parse_delegate_log("Initializing WebGPU-based API from graph.\n", ops_total=12)
    assert full.resident and (full.ops_gpu, full.ops_total) == (12, 12)
    none = parse_delegate_log("No operations will run on the GPU, and all 9 operations will run on the CPU.\n", 9)
    assert not none.resident and none.ops_gpu == 0 and none.partitions == 0
    texture = "E0000 environment.cc:105] Validation error: Texture size ([Extent3D width:16384]) exceeded maximum\n"
    void = parse_delegate_log(texture * 2 + "Initializing WebGPU-based API from graph.\n", ops_total=3)
    assert void.resident and void.gpu_errors == ["Texture size ([Extent3D width:16384]) exceeded maximum"]
    good = {"out": {"cosine": 1.0, "correlation": 1.0, "max_abs": 0.0, "max_rel": 0.0}}
    assert verdict_of(void, good, None)[0] == "mismatch"  # a refused GPU object voids the run


def test_verdict_mismatch_takes_precedence():
    res = parse_delegate_log("Initializing WebGPU-based API from graph.\n", ops_total=5)
    good = {"out": {"cosine": 0.99999, "correlation": 0.99999, "max_abs": 1e-4, "max_rel": 1e-5}}
    assert verdict_of(res, good, {"iou_worst": 1.0})[0] == "resident"
    bad = {"out": {"cosine": 0.265, "correlation": 0.2, "max_abs": 3.0, "max_rel": 0.5}}
    verdict, why = verdict_of(res, bad, None)
    assert verdict == "mismatch" and "cosine" in why[0]
    assert verdict_of(res, good, {"iou_worst": 0.62})[0] == "mismatch"


def test_crashed_gpu_run_is_a_failed_verdict(toys, monkeypatch):
    """A GPU worker that dies (seen at 512 px: "Failed to lock custom tensor buffer") is reported, not raised."""
    folder, _ = toys
    real = gpu_check.run_on
    log = "Validation error: Texture size ([Extent3D width:16, height:24576]) exceeded maximum\n"

    def gpu_dies(path, accel, feeds, timeout=gpu_check.DEFAULT_TIMEOUT_S):
        if accel == "gpu":
            raise gpu_check.WorkerFailed("LiteRT GPU run failed (exit 1): Failed to lock custom tensor buffer", log)
        return real(path, accel, feeds, timeout)

    monkeypatch.setattr(gpu_check, "run_on", gpu_dies)
    r = check_file(folder / "clean.tflite")
    assert r.verdict == "failed" and "Failed to lock" in r.failures[0]
    assert r.residency.gpu_errors and "validation error" in r.failures[1]
    assert "FAILED" in format_report(r)


def test_cli_json_and_exit_codes(toys, capsys):
    folder, _ = toys
    assert main(["gpu-check", str(folder), "--json"]) == 1  # five_d is partial
    out = json.loads(capsys.readouterr().out)
    verdicts = {f["path"].rsplit("/", 1)[-1]: f["verdict"] for f in out["files"]}
    assert verdicts == {"clean.tflite": "resident", "five_d.tflite": "partial"}
    assert "SwiftShader" in out["environment"]["vulkan_device"] and out["environment"]["ai_edge_litert"]
    assert main(["gpu-check", str(folder / "clean.tflite")]) == 0


def test_no_vulkan_device_is_one_line_exit_2(toys, tmp_path, monkeypatch, capsys):
    folder, _ = toys
    icd = tmp_path / "icd.json"  # an ICD whose driver library does not exist: no adapter
    icd.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": "/nonexistent/libvk.so"}}))
    monkeypatch.setenv(gpu_check.ICD_ENV, str(icd))
    assert main(["gpu-check", str(folder / "clean.tflite")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "libvulkan1" in err and "chromium" in err


def test_export_hook_refuses_partial_unless_allow_dirty(toys):
    """The LiteRT exporter's POST_EXPORT_CHECKS entry: a partial file refuses the export, --allow-dirty records it."""
    from sam2edge.errors import UserError
    from sam2edge.export.litert import POST_EXPORT_CHECKS, ExportContext

    folder, _ = toys
    check = POST_EXPORT_CHECKS["gpu_delegate"]
    files = {"clean.tflite": "encoder", "five_d.tflite": "decoder"}
    with pytest.raises(UserError, match=r"five_d\.tflite is partial.*--allow-dirty"):
        check(ExportContext(folder, TEST_SMALL, "fp32", {}, files))
    record = check(ExportContext(folder, TEST_SMALL, "fp32", {}, files, allow_dirty=True))
    assert not record["all_resident"]
    assert record["files"]["clean.tflite"]["verdict"] == "resident"
    assert record["files"]["five_d.tflite"]["verdict"] == "partial"
    assert any(r["op"] == "RESHAPE" for r in record["files"]["five_d.tflite"]["rejected"])
    json.dumps(record)  # goes into fidelity.json as is


# ---- attention rank (reference card 001: rank-3 attention miscomputed on a Pixel 8a GPU) ----------


@pytest.fixture(scope="module")
def rank_decoders(tmp_path_factory):
    from sam2edge.export.litert import convert_graph, graphs
    from sam2edge.runtime.backends.litert import DECODER_FILE

    folder = tmp_path_factory.mktemp("ranks")
    sd = synthetic_state_dict(TEST_SMALL, 0)
    paths = {}
    for rank in (3, 4):
        model = build_sam2(TEST_SMALL, Rewrites(attention_rank=rank))
        model.load_state_dict(sd)
        module, kwargs = graphs(model, 8)[DECODER_FILE]
        paths[rank] = folder / f"rank{rank}" / "decoder.tflite"
        paths[rank].parent.mkdir()
        convert_graph(module, kwargs, paths[rank], "fp32")
    return paths


def test_attention_rank_on_swiftshader(rank_decoders):
    """Measured: SwiftShader does NOT reproduce the Pixel 8a's rank-3 miscompute; both ranks are resident
    and match the CPU. (So a pass here does not clear rank 3 for phones; the default stays rank 4.)"""
    reports = {rank: check_file(p, clicks=20) for rank, p in rank_decoders.items()}
    for rank, r in reports.items():
        assert r.kind == "decoder", rank
        assert r.verdict == "resident", (rank, r.failures)
        assert r.mask_iou["clicks"] == 20 and r.mask_iou["iou_worst"] >= 0.99, rank
        assert 0.01 < r.mask_iou["foreground_median"] < 0.99, rank  # masks are not trivially empty or full
        assert r.outputs["masks"]["cosine"] >= 0.9999, rank
    assert reports[3].residency.ops_total != reports[4].residency.ops_total  # two different graphs


def test_texture_limit_is_device_limit_not_a_graph_verdict():
    """A resident graph whose textures exceed the software device's limit is reported as such."""
    from sam2edge.checks.gpu.check import Residency, verdict_of

    err = "Texture size ([Extent3D width:16384, height:8]) exceeded maximum texture size ([Extent3D width:8192])"
    res = Residency(10, 10, 1, [], "SwiftShader", gpu_errors=[err])
    verdict, why = verdict_of(res, {"masks": {"cosine": 0.0}}, None)
    assert verdict == "device-limit" and any("cosine" in w for w in why)
    partial = Residency(10, 9, 1, [{"op": "GATHER", "reason": "unsupported"}], "SwiftShader", gpu_errors=[err])
    assert verdict_of(partial, {"masks": {"cosine": 0.0}}, None)[0] == "mismatch"
    other = Residency(10, 10, 1, [], "SwiftShader", gpu_errors=["Buffer is destroyed"])
    assert verdict_of(other, {"masks": {"cosine": 0.0}}, None)[0] == "mismatch"


@pytest.fixture(scope="module")
def fp16_decoder(tmp_path_factory):
    from sam2edge.export.litert import convert_graph, graphs
    from sam2edge.runtime.backends.litert import DECODER_FILE

    model = build_sam2(TEST_SMALL, Rewrites())
    model.load_state_dict(synthetic_state_dict(TEST_SMALL, 0))
    module, kwargs = graphs(model, 8)[DECODER_FILE]
    path = tmp_path_factory.mktemp("fp16") / "decoder.tflite"
    convert_graph(module, kwargs, path, "fp16")
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pieces_chain_to_the_whole_graph(rank_decoders, fp16_decoder, precision):
    """Cut into pieces and chained on the CPU, a graph gives the whole graph's outputs; fp16 weights'
    DEQUANTIZE ops travel with their readers, so no piece hands a weight to the next."""
    from ai_edge_litert.interpreter import Interpreter

    from sam2edge.checks.tflite.slice import constant_ops, cut, load_model, signature_tensors

    path = rank_decoders[4] if precision == "fp32" else fp16_decoder
    total = lint_file(path).nodes
    whole = Interpreter(model_path=str(path)).get_signature_runner()
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(d["shape"]).astype(np.float32) for k, d in whole.get_input_details().items()}
    ref = whole(**feeds)
    model = load_model(path)
    ins, outs = signature_tensors(model)
    values = {t: feeds[k] for k, t in ins.items()}
    bounds = np.linspace(0, total, 5).round().astype(int).tolist()
    folded = sorted(constant_ops(model))
    if folded:  # also cut right after a weight's DEQUANTIZE, between it and its reader
        bounds = sorted(set(bounds) | {folded[len(folded) // 2] + 1})
    pieces = [cut(path, a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    for p in pieces:
        got = Interpreter(model_content=p.data).get_signature_runner()(**{k: values[t] for k, t in p.inputs.items()})
        values.update({t: got[k] for k, t in p.outputs.items()})
        assert p.outputs, (p.start, p.end)
    for k, t in outs.items():
        assert np.abs(values[t] - ref[k]).max() <= 1e-6 * np.abs(ref[k]).max(), k
    folded_out = {int(t) for i in folded for t in model.subgraphs[0].operators[i].outputs}
    assert all(not set(p.outputs.values()) & folded_out for p in pieces), "a piece hands a weight on"
    assert precision == "fp32" or any(b == folded[len(folded) // 2] + 1 for b in bounds[1:-1])


@pytest.mark.parametrize("gpu_node_limit", [None, 100])
def test_graph_past_the_deadline_is_run_in_pieces(rank_decoders, monkeypatch, gpu_node_limit):
    """A whole-graph GPU run that misses the delegate's 2-min deadline is re-run as chained pieces on the real
    delegate: every operator runs on the GPU once, and the last pieces' outputs are the graph's GPU outputs
    (mask IoU included); a piece that misses the deadline too (here: more than ``gpu_node_limit`` operators)
    is halved."""
    path = rank_decoders[4]
    real = gpu_check._run_worker
    total = lint_file(path).nodes

    def deadline(model, accel, feeds_file, out_file, env, timeout):
        summary, log = real(model, accel, feeds_file, out_file, env, timeout)
        ops = lint_file(model).nodes
        if accel == "gpu" and (model == path or (gpu_node_limit and ops > gpu_node_limit)):
            raise gpu_check.WorkerFailed("GPU run failed (exit 1)", log + "\nTimed out waiting for future: 2m\n")
        return summary, log

    monkeypatch.setattr(gpu_check, "_run_worker", deadline)
    monkeypatch.setattr(gpu_check, "FIRST_SEGMENTS", 2)
    r = check_file(path, clicks=20)
    assert r.verdict == "resident", r.failures
    assert r.residency.ops_gpu == total and r.residency.partitions == 1  # residency: the whole graph's load
    spans = [s["nodes"] for s in r.segments]
    assert spans[0][0] == 0 and spans[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert len(spans) == 2 if gpu_node_limit is None else all(b - a <= gpu_node_limit for a, b in spans)
    assert all(s["ops_gpu"] == s["ops"] for s in r.segments), r.segments  # each piece whole on the GPU
    assert all(m["cosine"] >= 0.9999 for m in r.outputs.values())
    assert r.mask_iou["clicks"] == 20 and r.mask_iou["iou_worst"] >= 0.99
    assert "chained pieces" in format_report(r)


def test_graph_predicted_past_the_budget_is_only_loaded_whole(rank_decoders, monkeypatch):
    """A CPU run predicting a GPU run past PIECE_BUDGET_S on the software GPU (3 s per run, as if full size): the
    whole graph is loaded for residency, never run whole; the numerics come from pieces sized to the budget."""
    path, real, whole_gpu_runs = rank_decoders[4], gpu_check._run_worker, []

    def timed(model, accel, feeds_file, out_file, env, timeout):
        summary, log = real(model, accel, feeds_file, out_file, env, timeout)
        if model == path and accel == "cpu":
            summary["run_s"] = [3.0] * len(summary["run_s"])
        elif model == path:
            whole_gpu_runs.append(len(summary["run_s"]))
        return summary, log

    monkeypatch.setattr(gpu_check, "_run_worker", timed)
    r = check_file(path, clicks=20)
    assert whole_gpu_runs == [0] and r.verdict == "resident", (whole_gpu_runs, r.failures)
    assert r.residency.ops_gpu == lint_file(path).nodes and r.residency.partitions == 1
    want = -(-gpu_check.SOFTWARE_SLOWDOWN * 3.0 // gpu_check.PIECE_BUDGET_S)  # ceil: 201 s in 60 s pieces -> 4
    assert len(r.segments) == want and all(s["ops_gpu"] == s["ops"] for s in r.segments), r.segments
    assert all(m["cosine"] >= 0.9999 for m in r.outputs.values()) and r.mask_iou["iou_worst"] >= 0.99
    assert "predicted at 201 s" in format_report(r)


def test_too_slow_and_unsplittable_is_device_limit(toys, monkeypatch):
    """Whole graph past the deadline and the pieces cannot run either: resident placement, no numbers ->
    device-limit with both reasons, not a refused graph."""
    folder, _ = toys
    real = gpu_check._run_worker

    def slow(path, accel, feeds_file, out_file, env, timeout):
        summary, log = real(path, accel, feeds_file, out_file, env, timeout)
        if accel == "gpu" and path == folder / "clean.tflite":
            raise gpu_check.WorkerFailed("GPU run failed (exit 1)", log + "\nTimed out waiting for future: 2m\n")
        if accel == "gpu":
            raise gpu_check.WorkerFailed("GPU run failed (exit 1): Node number 3 (FULLY_CONNECTED) failed", log)
        return summary, log

    monkeypatch.setattr(gpu_check, "_run_worker", slow)
    r = check_file(folder / "clean.tflite")
    assert r.verdict == "device-limit" and r.residency.resident
    assert "2-min deadline" in r.failures[0] and "in pieces impossible" in r.failures[1], r.failures


def test_record_stores_the_check_in_a_bundle(toys, tmp_path, capsys):
    """`gpu-check DIR --record`: the result lands in fidelity.json and card.json; the manifest stays valid."""
    import shutil

    from sam2edge.bundle import finalize_bundle, load_card, verify_manifest

    folder, _ = toys
    b = tmp_path / "bundle"
    b.mkdir()
    shutil.copy(folder / "clean.tflite", b / "clean.tflite")
    finalize_bundle(
        b,
        target="litert",
        precision="fp32",
        resolution=256,
        config="test-small",
        source={"checkpoint": "synthetic", "format": "synthetic", "sha256": None},
        command="test",
        fidelity={"passed": True},
        artifacts={"clean.tflite": "encoder"},
    )
    assert main(["gpu-check", str(b), "--record"]) == 0
    rec = json.loads((b / "fidelity.json").read_text())["checks"]["gpu_delegate"]
    assert rec["files"]["clean.tflite"]["verdict"] == "resident" and "--record" in rec["command"]
    assert load_card(b)["fidelity"]["checks"]["gpu_delegate"] == rec
    assert verify_manifest(b) == []
    capsys.readouterr()
    assert main(["gpu-check", str(folder), "--record"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "card.json" in err[0]
