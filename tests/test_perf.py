"""Performance tooling: profiles from the runtimes' own profilers, thread scaling, CPU extensions.

No timing is asserted: the tests check that each profiler names the operator types of the graph it ran
(every operator of a tiny graph is accounted for), that bench records carry the machine's vector
extensions and the thread scaling, and that bad ``--threads`` values are one-line errors.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sam2edge.checks.bench.bench import vector_extensions
from sam2edge.checks.bench.bound import model_flops
from sam2edge.checks.bench.profile import NodeTime, ort_node_times, summarise
from sam2edge.checks.bench.records import add_scaling, fp16_arithmetic, machine
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.model import UPSTREAM, build_sam2
from sam2edge.runtime.backends.onnx import OnnxBackend, has_vnni
from sam2edge.weights import synthetic_state_dict

SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}


@pytest.fixture(scope="module")
def onnx_bundle(small_bundle):
    """The session's test-small fp32 ONNX bundle (synthetic weights); bench reads it, records go elsewhere."""
    return small_bundle("onnx")


def test_profile_command_names_op_types(onnx_bundle: Path, tmp_path: Path, capsys) -> None:
    recs = tmp_path / "records"
    args = ["bench", "--profile", str(onnx_bundle), "--runs", "1", "--clicks", "2", "--threads", "1"]
    assert main([*args, "--records", str(recs)]) == 0
    out = capsys.readouterr().out
    [path] = recs.glob("*/profile-*.json")
    rec = json.loads(path.read_text())
    assert rec["kind"] == "profile" and rec["target"] == "onnx" and rec["machine"]["vector_extensions"] is not None
    enc, dec = rec["runtime"]["encoder"], rec["runtime"]["decoder"]
    enc_ops, dec_ops = {t["op"] for t in enc["by_type"]}, {t["op"] for t in dec["by_type"]}
    assert {"Conv", "Softmax"} <= enc_ops and ({"Gemm", "MatMul", "FusedMatMul"} & enc_ops)
    assert "Softmax" in dec_ops and "ConvTranspose" not in dec_ops  # the upscaling runs as GEMMs
    assert enc["calls"] == 1 and dec["calls"] == 2  # warm-up runs left out
    assert abs(sum(t["share"] for t in enc["by_type"]) - 1) < 1e-6 and enc["top_nodes"]
    # eager: aten operator types and upstream's modules
    eager = rec["eager"]
    assert "aten::addmm" in {t["op"] for t in eager["encoder"]["by_type"]}
    assert {"image_encoder", "image_encoder.trunk"} <= {m["module"] for m in eager["encoder"]["by_module"]}
    assert "sam_mask_decoder.transformer" in {m["module"] for m in eager["decoder"]["by_module"]}
    # the printed table is the record's: the decoder section lists its slowest operator types, in order
    assert "onnx decoder" in out and "upstream eager encoder" in out
    section = out.split("onnx decoder")[1].split("slowest nodes")[0]
    shown = [line.split()[0] for line in section.splitlines()[1:] if line.strip()]
    assert shown == [t["op"] for t in dec["by_type"][: len(shown)]] and len(shown) == min(12, len(dec["by_type"]))


def test_ort_trace_skips_warm_up_runs() -> None:
    trace = [
        {"name": "model_run", "ts": 0, "dur": 10},
        {"name": "model_run", "ts": 20, "dur": 10},
        {"cat": "Node", "name": "a_kernel_time", "ts": 1, "dur": 5000, "args": {"op_name": "Add"}},
        {"cat": "Node", "name": "a_kernel_time", "ts": 21, "dur": 2000, "args": {"op_name": "Add"}},
        {"cat": "Node", "name": "a_fence_before", "ts": 21, "dur": 9000},
    ]
    nodes, runs = ort_node_times(trace, skip_runs=1)
    assert runs == 1 and nodes == [NodeTime("a", "Add", 2.0)]
    s = summarise([NodeTime("a", "Add", 2.0), NodeTime("b", "Add", 1.0), NodeTime("c", "Conv", 1.0)])
    assert [(t["op"], t["count"]) for t in s["by_type"]] == [("Add", 2), ("Conv", 1)]
    assert s["by_type"][0]["share"] == 0.75 and s["top_nodes"][0]["name"] == "a"


def test_litert_per_operator_profile(tmp_path: Path) -> None:
    """ai-edge-litert has no op profiler: every non-constant operator is timed as its own graph."""
    import litert_torch

    from sam2edge.checks.bench.profile import tflite_node_times

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GELU(), torch.nn.Flatten(), torch.nn.Linear(288, 4))
    path = tmp_path / "tiny.tflite"
    litert_torch.convert(m.eval(), (torch.randn(1, 3, 8, 8),)).export(str(path))
    nodes, whole = tflite_node_times(path, threads=1, runs=2)
    ops = {n.op for n in nodes}
    assert {"CONV_2D", "GELU", "FULLY_CONNECTED"} <= ops and whole > 0
    assert all(n.ms > 0 for n in nodes)
    # a dynamic-range int8 conversion: its products name their int8 weights, so a profile tells them from fp32 ones
    from litert_torch.generative.quantize import quant_recipes

    q = tmp_path / "tiny-int8.tflite"
    litert_torch.convert(m.eval(), (torch.randn(1, 3, 8, 8),), quant_config=quant_recipes.full_dynamic_recipe()).export(
        str(q)
    )
    assert {"CONV_2D int8", "FULLY_CONNECTED int8", "GELU"} <= {n.op for n in tflite_node_times(q, 1, 2)[0]}


def test_executorch_etdump_profile(tmp_path: Path) -> None:
    """ETDump: XNNPACK's own per-operator events inside the delegate, portable operators outside it."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from sam2edge.checks.bench.profile import _EtdumpMethod, etdump_node_times

    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU()).eval()
    x = torch.randn(4, 16)
    lowered = to_edge_transform_and_lower(torch.export.export(m, (x,)), partitioner=[XnnpackPartitioner()])
    (tmp_path / "m.pte").write_bytes(lowered.to_executorch().buffer)
    method = _EtdumpMethod(tmp_path / "m.pte")
    for _ in range(3):
        method.execute([x])
    nodes, runs, wrappers = etdump_node_times(method.etdump(tmp_path / "m.etdp"), skip_runs=1)
    ops = {n.op for n in nodes}
    assert runs == 2 and "portable:native_layer_norm" in ops  # XNNPACK leaves LayerNorm outside
    assert any(o.startswith("xnnpack:Fully Connected") for o in ops) and "xnnpack:GELU (NC)" in ops
    assert wrappers["Method::execute"] > 0 and wrappers["DELEGATE_CALL"] > 0


def test_vector_extensions_and_thread_scaling() -> None:
    x86 = "processor : 0\nflags\t\t: fpu sse avx2 fma avx512f avx512_vnni amx_tile\n"
    assert vector_extensions(x86) == ["avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"]
    assert vector_extensions("Features\t: fp asimd asimddp i8mm sve\n") == ["asimd", "asimddp", "sve", "i8mm"]
    assert vector_extensions("") == []
    assert fp16_arithmetic(vector_extensions(x86)) == "through fp32"
    assert fp16_arithmetic(["asimd", "asimdhp"]) == "native"
    assert fp16_arithmetic(["f16c", "avx512_fp16"]) == "native"
    recs = [
        {"subject": "s", "threads": t, "encoder_ms": {"median": e}, "decoder_ms": {"median": d}}
        for t, e, d in ((1, 100.0, 10.0), (2, 50.0, 8.0))
    ] + [{"subject": "alone", "threads": 2, "encoder_ms": {"median": 1.0}, "decoder_ms": {"median": 1.0}}]
    add_scaling(recs)
    assert recs[1]["thread_scaling"] == {"base_threads": 1, "encoder": 2.0, "decoder": 1.25}
    assert recs[0]["thread_scaling"]["encoder"] == 1.0 and "thread_scaling" not in recs[2]


@pytest.mark.parametrize("bad", ["0", "1,x", ",", "0,2"])
def test_bad_threads_exit_2(bad: str, capsys) -> None:
    assert main(["bench", "--upstream", "--threads", bad, "--no-records"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --threads") and len(err.strip().splitlines()) == 1


def test_gpu_check_skip_and_reuse_by_sha256(tmp_path: Path, monkeypatch) -> None:
    """--gpu-check skip records that the check was not run; an unchanged graph is checked once."""
    from types import SimpleNamespace

    from sam2edge.cards.measured import gpu_delegate
    from sam2edge.checks.gpu import report

    graph = tmp_path / "b" / "encoder.tflite"
    graph.parent.mkdir()
    graph.write_bytes(b"\0\0\0\0TFL3 graph one")
    ctx = SimpleNamespace(folder=graph.parent, files={"encoder.tflite": "encoder"}, allow_dirty=False, state={})
    skipped = report.export_check(SimpleNamespace(**{**vars(ctx), "state": {"gpu_check": "skip"}}))
    assert skipped["skipped"] and skipped["files"] == {} and "--gpu-check skip" in skipped["reason"]
    assert "not run" in "\n".join(gpu_delegate({"checks": {"gpu_delegate": skipped}}))

    checked = []
    monkeypatch.setattr(
        report,
        "check_file",
        lambda p: checked.append(p.read_bytes()) or SimpleNamespace(residency=SimpleNamespace(device="SwiftShader")),
    )
    monkeypatch.setattr(report, "summarize", lambda r: {"verdict": "resident", "failures": []})
    monkeypatch.setenv("SAM2EDGE_GPU_CHECK_CACHE", str(tmp_path / "cache"))
    first, second = report.export_check(ctx), report.export_check(ctx)
    assert len(checked) == 1 and first["reused"] == [] and second["reused"] == ["encoder.tflite"]
    assert first["files"] == second["files"] and second["environment"]["vulkan_device"] == "SwiftShader"
    graph.write_bytes(b"\0\0\0\0TFL3 graph two")  # another graph: checked again
    assert report.export_check(ctx)["reused"] == [] and len(checked) == 2
    monkeypatch.setenv("SAM2EDGE_GPU_CHECK_CACHE", "off")
    report.export_check(ctx)
    assert len(checked) == 3
    monkeypatch.setenv("SAM2EDGE_GPU_CHECK_CACHE", str(tmp_path / "cache2"))  # a crashed run is not remembered
    monkeypatch.setattr(report, "summarize", lambda r: {"verdict": "failed", "failures": ["GPU run crashed"]})
    ctx.allow_dirty = True
    report.export_check(ctx)
    report.export_check(ctx)
    assert len(checked) == 5


def test_export_cli_passes_gpu_check_skip(tmp_path: Path, monkeypatch) -> None:
    from sam2edge.errors import UserError
    from sam2edge.export import pipeline

    seen = {}

    def fake(*a, **kw):
        seen.update(kw)
        raise UserError("stopped by the test")

    monkeypatch.setattr(pipeline, "run_export", fake)
    args = ["export", "--target", "litert", "--config", "test-small", "--out", str(tmp_path / "b")]
    assert main([*args, "--gpu-check", "skip"]) == 2
    assert seen["options"] == {"gpu_check": "skip"} and "--gpu-check skip" in seen["command"]
    assert main(args) == 2 and seen["options"] is None


def test_onnx_int8_encoder_passes_the_int8_bar(tmp_path: Path) -> None:
    """ONNX int8 (dynamic int8 MatMuls in the encoder, decoder fp32): worst mask IoU >= 0.95 and median
    >= 0.99 over 40 clicks on real photos against eager fp32 with upstream's operations."""
    import onnx

    from sam2edge.export.onnx import export_onnx

    out = tmp_path / "int8"
    card = export_onnx(synthetic_state_dict(TEST_SMALL), SOURCE, TEST_SMALL, "test-small", "int8", out, "test")
    e2e = card["fidelity"]["end_to_end"]
    assert card["status"] == "shippable" and card["precision"] == "int8" and e2e["clicks"] >= 40
    assert e2e["iou_worst"] >= 0.95 and e2e["iou_median"] >= 0.99
    enc = [n.op_type for n in onnx.load(str(out / "encoder.onnx")).graph.node]
    dec = [n.op_type for n in onnx.load(str(out / "decoder.onnx")).graph.node]
    assert enc.count("MatMulInteger") >= 12 and "DynamicQuantizeLinear" in enc and "MatMulInteger" not in dec
    assert card["extra"]["rewrites"]["transposed_conv"] == "matmul" and "ConvTranspose" not in dec
    assert {"convert encoder.onnx", "check optimization", "fidelity"} <= set(card["extra"]["stage_seconds"])
    assert _weight_dtypes(out / "encoder.onnx") == {onnx.TensorProto.UINT8}  # u8 x u8: exact on every CPU
    vnni, roles = card["fidelity"]["checks"]["int8_vnni"], {a["role"]: a["file"] for a in card["artifacts"]}
    if has_vnni():  # s8 static (the default) or u8 x s8 dynamic, measured on the kernels that run it, same bars
        assert vnni["shipped"] and roles["encoder-vnni"] == "encoder_vnni.onnx"
        assert vnni["end_to_end"]["iou_worst"] >= 0.95 and vnni["end_to_end"]["clicks"] >= 40
        assert card["extra"]["int8_activations"]["mode"] == "static"
        vnni_ops = {n.op_type for n in onnx.load(str(out / "encoder_vnni.onnx")).graph.node}
        if vnni["int8"] == "static":  # calibrated ranges: a QDQ graph, no range measured per call
            assert "QuantizeLinear" in vnni_ops and "DynamicQuantizeLinear" not in vnni_ops
        else:  # the static file missed a bar: the dynamic s8 file shipped in its place
            assert _weight_dtypes(out / "encoder_vnni.onnx") == {onnx.TensorProto.INT8}
        assert OnnxBackend.from_bundle(out).encoder_role == "encoder-vnni"
    else:
        assert not vnni["shipped"] and "no VNNI" in vnni["why"] and "encoder-vnni" not in roles
        assert not (out / "encoder_vnni.onnx").exists() and OnnxBackend.from_bundle(out).encoder_role == "encoder"


def _weight_dtypes(path: Path) -> set[int]:
    """Element types of the constant weight inputs of an ONNX file's MatMulInteger nodes."""
    import onnx

    m = onnx.load(str(path))
    inits = {t.name: t.data_type for t in m.graph.initializer}
    return {inits[n.input[1]] for n in m.graph.node if n.op_type == "MatMulInteger" and n.input[1] in inits}


def test_onnx_int8_vnni_encoder_missing_its_bar_is_left_out(tmp_path: Path, monkeypatch) -> None:
    """A VNNI encoder that misses a bar is removed from the bundle (the portable encoder still ships), and
    ``SAM2EDGE_ORT_ENCODER`` / a CPU without VNNI make the backend open ``encoder.onnx``."""
    from sam2edge.export.pipeline import run_export
    from sam2edge.runtime.backends import onnx as ob

    monkeypatch.setattr(ob, "has_vnni", lambda cpuinfo=None: True)  # written and measured on any CPU
    out = tmp_path / "int8"
    weights = (synthetic_state_dict(TEST_SMALL), SOURCE)
    bars = {"min_iou_worst": 1.01}  # no file can pass: the bundle is written as rejected (force)
    card = run_export("onnx", "test-small", "int8", out, weights=weights, bars=bars, force=True, options={"batch": 0})
    vnni = card["fidelity"]["checks"]["int8_vnni"]
    assert not vnni["shipped"] and "missed the int8 bars" in vnni["why"] and vnni["bars"]["min_iou_worst"] == 1.01
    assert not (out / "encoder_vnni.onnx").exists() and "encoder-vnni" not in {a["role"] for a in card["artifacts"]}
    roles = {"encoder", "decoder", "encoder-vnni"}
    assert ob.pick_encoder(roles, vnni=True) == "encoder-vnni" and ob.pick_encoder(roles, vnni=False) == "encoder"
    assert ob.pick_encoder(roles - {"encoder-vnni"}, vnni=True) == "encoder"
    monkeypatch.setenv("SAM2EDGE_ORT_ENCODER", "portable")
    assert ob.pick_encoder(roles, vnni=True) == "encoder"
    monkeypatch.setenv("SAM2EDGE_ORT_ENCODER", "fast")
    with pytest.raises(UserError, match="auto .* or portable"):
        ob.pick_encoder(roles, vnni=True)


def test_vnni_flags_are_read_from_cpuinfo() -> None:
    from sam2edge.runtime.backends.onnx import has_vnni

    assert has_vnni("processor : 0\nflags : fpu avx2 avx512f avx512_vnni\n")
    assert has_vnni("flags\t\t: sse avx2 avx_vnni\n")
    assert not has_vnni("flags : fpu avx2 fma f16c\nbugs : avx512_vnni\n")  # only the flags line counts
    assert not has_vnni("Features : fp asimd asimddp\n")  # ARM: onnxruntime's dot-product kernels, no saturation


def test_litert_int8_encoder_passes_the_int8_bar(tmp_path: Path) -> None:
    """LiteRT int8 (litert-torch dynamic-range recipe on the encoder; decoders fp32): the int8 bar (worst
    mask IoU >= 0.95, median >= 0.99 over 40 clicks); GPU check skipped (the card says so)."""
    from sam2edge.export.pipeline import run_export

    out = tmp_path / "int8"
    card = run_export(
        "litert",
        "test-small",
        "int8",
        out,
        weights=(synthetic_state_dict(TEST_SMALL), SOURCE),
        options={"gpu_check": "skip", "batch": 0},  # no batched decoder: not under test here
    )
    fid = card["fidelity"]
    e2e = fid["end_to_end"]
    assert card["status"] == "shippable" and e2e["clicks"] >= 40
    assert e2e["iou_worst"] >= 0.95 and e2e["iou_median"] >= 0.99
    lint = card["extra"]["lint"]
    assert "INT8" in lint["encoder.tflite"]["weight_dtypes"] and "INT8" not in lint["decoder.tflite"]["weight_dtypes"]
    assert "SmoothQuant" in card["extra"]["int8_smoothing"]  # the encoder smoothed, as every int8 export's
    assert card["extra"]["int8_smoothed_pairs"] == 3 * 6  # test-small's 6 blocks: two norms and the values each
    err = card["extra"]["int8_rounding_error"]  # GPTQ's output error on the calibration photos, vs nearest's
    assert err["layers"] > 0 and 0 < err["error_vs_nearest_median"] < 1
    assert fid["checks"]["gpu_delegate"]["skipped"] and not fid["checks"]["gpu_decoder_fidelity"]["failures"]


def test_export_records_stage_seconds(tmp_path: Path) -> None:
    from sam2edge.progress import Stages

    st = Stages("t", 3)
    st.next("a")
    st.next("b")
    st.next("a")
    st.finish_stage()
    st.close()
    assert set(st.seconds) == {"a", "b"} and all(v >= 0 for v in st.seconds.values())


def test_executorch_fp16_gelu_stays_in_the_delegate() -> None:
    """fp16 GELU -> erf-free exact form (erf to 1.5e-7): one XNNPACK delegate instead of GELUs splitting it
    on the portable kernel; the form matches the exact GELU (fp64) and the fp16 program fp32 eager."""
    import math

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.runtime import Runtime

    from sam2edge.export.executorch_lower import ERF_A, ERF_P, lower

    x = torch.linspace(-12, 12, 100001, dtype=torch.float64)
    z = x.abs() / math.sqrt(2)
    t = 1 / (1 + ERF_P * z)
    erf = 1 - sum(a * t ** (i + 1) for i, a in enumerate(ERF_A)) * torch.exp(-z * z)
    assert (0.5 * x + 0.5 * x.abs() * erf - torch.nn.functional.gelu(x)).abs().max() < 5e-7

    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.GELU())
    m = m.eval().half()
    xin = (torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) * 3).half()
    before = lower(m, (xin,), [XnnpackPartitioner()], legalize=False)[1].as_dict()
    prog, census = lower(m, (xin,), [XnnpackPartitioner()], legalize=True)
    after = census.as_dict()
    assert before["outside_delegate"].get("gelu") == 2 and before["delegates"] >= 2
    assert after["delegates"] == 1 and "gelu" not in after["outside_delegate"]
    assert set(after["outside_delegate"]) <= {"dim_order_ops"}  # fp32 scalar constants cast to fp16
    out = Runtime.get().load_program(prog.buffer).load_method("forward").execute([xin])[0].float()
    with torch.no_grad():
        ref = m.float()(xin.float())
    assert (out - ref).abs().max() <= 2e-3 * ref.abs().max()  # fp16 rounding, not an approximation


# ---------------------------------------------------------------- the peer's export as a bench subject
PEER_BOX = np.array([120.0, 60.0, 480.0, 340.0])  # X0, Y0, X1, Y1 in coffee.png (600x400) pixels
PEER_PROMPTS = [
    dict(point_coords=np.array([[300.0, 150.0]]), point_labels=np.array([1])),
    dict(point_coords=np.array([[300.0, 150.0], [80.0, 330.0]]), point_labels=np.array([1, 0])),
    dict(box=np.array([120.0, 60.0, 480.0, 340.0])),
    dict(
        point_coords=np.array([[250.0, 200.0]]), point_labels=np.array([1]), box=np.array([120.0, 60.0, 480.0, 340.0])
    ),
]


def test_peer_export_gives_upstream_predictor_masks(tmp_path: Path) -> None:
    """The peer stand-in (upstream's modules through torch.onnx, run by onnxruntime) returns upstream
    SAM2ImagePredictor's masks, scores and logits on a real photo (not square) for a point, point + negative,
    box and box + point, through the bench runner's own calls: bench compares equal work. A folder of other
    weights is refused, never overwritten."""
    from amg_oracle import UpstreamSam2ForPredictor
    from oracles import TorchvisionStandIn

    from sam2edge.checks.bench.peer import PeerRunner, ensure_peer, export_peer
    from sam2edge.checks.fidelity import photo
    from sam2edge.checks.fidelity.upstream import upstream_from_state_dict
    from sam2edge.errors import UserError
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.runtime.prompts import prompt_layout

    cfg, img = TEST_SMALL, photo("coffee.png")  # 400x600
    (h, w), e = img.shape[:2], TEST_SMALL.image_embedding_size
    model = upstream_from_state_dict(synthetic_state_dict(cfg, seed=1), cfg)
    export_peer(tmp_path / "peer", model, cfg, SOURCE)
    runner = PeerRunner(tmp_path / "peer", cfg, threads=1)
    TorchvisionStandIn.install()
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    ref = SAM2ImagePredictor(UpstreamSam2ForPredictor(model, cfg))
    ref._bb_feat_sizes = [(4 * e, 4 * e), (2 * e, 2 * e), (e, e)]  # upstream hard-codes 1024's
    ref.set_image(img)
    feats = runner.encode(preprocess(img, cfg.image_size).numpy())
    for kw in PEER_PROMPTS:
        masks, iou, low = ref.predict(**kw, multimask_output=True)
        c, lab = prompt_layout(kw.get("box"), kw.get("point_coords"), kw.get("point_labels"), np.array([w, h]), 256)
        peer_low, peer_iou = runner.decode(feats, c, lab)
        np.testing.assert_allclose(peer_low[0], low, rtol=0, atol=1e-4 * np.abs(low).max())
        np.testing.assert_allclose(peer_iou[0], iou, rtol=0, atol=1e-5)
        full = ref._transforms.postprocess_masks(torch.from_numpy(peer_low), (h, w))[0].numpy() > 0
        for a, b in zip(full, masks.astype(bool)):
            assert 0.005 < b.mean() < 0.995, "a trivially empty or full mask cannot tell exports apart"
            assert (a & b).sum() / (a | b).sum() >= 0.999
    other = upstream_from_state_dict(synthetic_state_dict(cfg, seed=2), cfg)
    before = (tmp_path / "peer" / "encoder.onnx").read_bytes()
    with pytest.raises(UserError, match="other weights"):
        ensure_peer(tmp_path / "peer", other, cfg, SOURCE)
    assert (tmp_path / "peer" / "encoder.onnx").read_bytes() == before


def test_bench_compare_times_the_peer(onnx_bundle: Path, tmp_path: Path, capsys) -> None:
    """bench --compare --peer DIR exports the peer once and times it in the same interleaved run, with ratios
    to upstream and the export's provenance in its record; a folder that is not a peer export is refused."""
    peer, recs = tmp_path / "peer", tmp_path / "records"
    args = ["bench", "--runs", "1", "--warmup", "0", "--clicks", "1", "--threads", "1", "--peer", str(peer)]
    assert main([*args, "--compare", str(onnx_bundle), "--records", str(recs)]) == 0
    out = capsys.readouterr().out
    assert "peer onnx fp32 256" in out and "enc/peer" in out and "\nmachine: " in out
    records = {r["runtime"]: r for r in (json.loads(p.read_text()) for p in recs.rglob("*.json"))}
    assert set(records) == {"onnx", "upstream-eager", "peer-onnx"}
    r = records["peer-onnx"]
    assert r["bundle"] is None and r["peer"]["opset"] == 18 and r["runtime_version"].startswith("onnxruntime ")
    assert {"encoder_vs_upstream", "decoder_vs_upstream"} <= set(r["ratios"]) and r["encoder_ms"]["n"] == 1
    assert r["peer"]["files"] == json.loads((peer / "peer.json").read_text())["files"]
    u = records["upstream-eager"]  # timed in a process of its own, its memory that process's
    assert u["process"] == "own" and records["onnx"]["process"] == "bench" and u["peak_rss_mb"] > 0
    o = records["onnx"]
    assert {"encoder_vs_peer", "decoder_vs_peer", "first_click_vs_peer"} <= set(o["ratios"])
    assert o["ratios"]["encoder_vs_peer"] == pytest.approx(o["encoder_ms"]["median"] / r["encoder_ms"]["median"])
    stamp = (peer / "encoder.onnx").stat().st_mtime_ns
    assert main([*args, str(onnx_bundle), "--no-records"]) == 0  # reused, not exported again
    assert (peer / "encoder.onnx").stat().st_mtime_ns == stamp and "peer onnx fp32 256" in capsys.readouterr().out
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["bench", "--upstream", "--peer", str(mine), "--no-records"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --peer") and len(err.strip().splitlines()) == 1
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_records_carry_the_cpu_model_and_its_extensions() -> None:
    """machine() names the CPU and its SIMD / int8 / fp16 / bf16 extensions from /proc/cpuinfo text."""
    xeon = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse2 avx f16c fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_tile\n"
    )
    m = machine(xeon)
    assert m["cpu"] == "Intel(R) Xeon(R) Platinum 8480+" and m["cpu_generation"] == "family 6, model 143"
    assert m["vector_extensions"] == [
        "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile"
    ]  # fmt: skip
    arm = (
        "processor\t: 0\nFeatures\t: fp asimd asimdhp asimddp sve sve2 i8mm bf16\nCPU part\t: 0xd40\n"
        "Hardware\t: Graviton3\n"
    )
    assert machine(arm)["cpu"] == "Graviton3" and machine(arm)["cpu_generation"] == "part 0xd40"
    assert machine(arm)["vector_extensions"] == ["asimd", "asimdhp", "asimddp", "sve", "sve2", "i8mm", "bf16"]
    assert machine("")["cpu"] and machine("")["vector_extensions"] == [] and machine("")["cpu_generation"] is None
    here = machine()
    assert isinstance(here["cpu"], str) and here["cpu"] and here["cores"] >= 1


def test_bench_names_two_bundles_of_one_kind_apart(onnx_bundle: Path, tmp_path: Path, capsys) -> None:
    """A before / after pair (same target, precision and size) gets one subject and one record each, named by
    folder, so neither overwrites the other and thread scaling is not computed across them."""
    after, recs = tmp_path / "after", tmp_path / "records"
    shutil.copytree(onnx_bundle, after)
    args = ["bench", "--runs", "1", "--warmup", "0", "--clicks", "1", "--threads", "1", "--records", str(recs)]
    assert main([*args, str(onnx_bundle), str(after)]) == 0
    out = capsys.readouterr().out
    subjects = sorted(json.loads(p.read_text())["subject"] for p in recs.rglob("*.json"))
    assert subjects == sorted([f"onnx fp32 256 [{onnx_bundle.name}]", "onnx fp32 256 [after]"])
    assert all(s in out for s in subjects)


def test_compute_bound_counts_the_attention() -> None:
    """The bench's FLOP count includes the attention matmuls: equal to a count of the explicit-softmax form
    (which the CPU FlopCounter sees op by op), not the smaller count it gives for the fused kernel on the CPU."""
    model = build_sam2(TEST_SMALL, dataclasses.replace(UPSTREAM, attention_impl="math"))
    with torch.no_grad(), FlopCounterMode(display=False) as f:
        model.encode_image(torch.zeros(1, 3, TEST_SMALL.image_size, TEST_SMALL.image_size))
    assert model_flops(TEST_SMALL)["encoder_gflop"] == pytest.approx(f.get_total_flops() / 1e9, rel=1e-6)


def test_isolated_upstream_gives_upstream_masks_in_its_own_process() -> None:
    """Upstream eager in a child process decodes what upstream eager here decodes (same weights and prompt: the
    child's last mask is sent back on request of the test's probe) and times every call there."""
    import os

    from sam2edge.checks.bench.isolated import IsolatedUpstream
    from sam2edge.checks.fidelity.upstream import UpstreamRunner, upstream_from_state_dict
    from sam2edge.config import get_config
    from sam2edge.weights.load import synthetic_state_dict

    cfg = get_config("test-small")
    sd = synthetic_state_dict(cfg, seed=3)
    x = np.random.default_rng(0).standard_normal((1, 3, cfg.image_size, cfg.image_size)).astype(np.float32)
    coords, labels = np.array([[[40.0, 60.0], [0.0, 0.0]]], np.float32), np.array([[1, -1]], np.int32)
    runner = IsolatedUpstream(sd, cfg, threads=1)
    try:
        runner.encode(x)
        enc_ms = runner.last_ms
        runner.decode(None, coords, labels)
        pid, masks = runner.probe()
        stats = runner.stats()
    finally:
        runner.close()
    here = UpstreamRunner(upstream_from_state_dict(sd, cfg), cfg)
    want = here.decode(here.encode(x), coords, labels)[0]
    assert pid != os.getpid() and enc_ms > 0 and runner.last_ms > 0 and stats["load_s"] > 0
    np.testing.assert_allclose(masks, np.asarray(want), atol=1e-4)
    assert not runner._proc.is_alive()


def test_isolated_upstream_that_dies_is_one_line() -> None:
    """A child killed mid-run (as the kernel's out-of-memory killer does) is a one-line UserError naming the call,
    the signal and the fix, not the pipe's EOFError."""
    import os
    import signal

    from sam2edge.checks.bench.isolated import IsolatedUpstream, UpstreamProcessDied
    from sam2edge.config import get_config
    from sam2edge.weights.load import synthetic_state_dict

    cfg = get_config("test-small")
    runner = IsolatedUpstream(synthetic_state_dict(cfg, seed=3), cfg, threads=1)
    os.kill(runner._proc.pid, signal.SIGKILL)
    runner._proc.join(10)
    with pytest.raises(UpstreamProcessDied) as e:
        runner.encode(np.zeros((1, 3, cfg.image_size, cfg.image_size), np.float32))
    msg = str(e.value)
    assert "\n" not in msg and "during encode" in msg and "signal 9" in msg and "run again" in msg, msg
    runner.close()
