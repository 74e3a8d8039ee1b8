"""ONNX static int8 (``export.onnx_static``): encoder_vnni.onnx as a w8a8 QDQ graph with calibrated ranges.

Each export is written and measured as on a VNNI CPU (``has_vnni`` patched, so the file is made and measured on
the CPU that runs the test), at test-small against eager fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from sam2edge.checks.fidelity.metrics import click_set
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.export import onnx_static as st
from sam2edge.export.pipeline import run_export
from sam2edge.runtime.backends import onnx as ob
from sam2edge.weights import synthetic_state_dict

SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}
# test-small's Hiera: products with weights (27 Linear layers, each of its 6 blocks' qkv as three: ONNX_REWRITES.qkv),
# and q @ k^T / softmax @ v per block
LINEARS, ATTENTION_PRODUCTS = 27 + 2 * 6, 12


def _export(out: Path, monkeypatch) -> dict:
    monkeypatch.setattr(ob, "has_vnni", lambda cpuinfo=None: True)
    weights = (synthetic_state_dict(TEST_SMALL), SOURCE)
    options = {"batch": 0, "int8": "static"}
    return run_export("onnx", "test-small", "int8", out, weights=weights, force=True, options=options)


def _fused_ops(path: Path) -> set[str]:
    """The op types onnxruntime's CPU provider runs for ``path`` after its own graph fusions."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(path.with_suffix(".fused.onnx"))
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node}


def test_static_int8_encoder_quantises_every_product_and_holds_the_bars(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "int8"
    card = _export(out, monkeypatch)
    vnni = card["fidelity"]["checks"]["int8_vnni"]
    assert vnni["shipped"] and vnni["int8"] == "static", vnni
    assert vnni["end_to_end"]["iou_worst"] >= 0.95 and vnni["end_to_end"]["iou_median"] >= 0.99
    assert vnni["end_to_end"]["clicks"] >= 40
    act = card["extra"]["int8_activations"]
    assert act["mode"] == "static" and act["shipped"] == "static" and act["calibration"] == list(st.CALIBRATION)
    assert not set(act["calibration"]) & {p.photo for p in click_set(40)}
    graph = onnx.load(str(out / ob.VNNI_ENCODER_FILE)).graph
    assert st.quantized_matmuls(graph) == {"weight": LINEARS, "activation": ATTENTION_PRODUCTS, "float": 0}
    ops = [n.op_type for n in graph.node]
    assert "DynamicQuantizeLinear" not in ops and "MatMulInteger" not in ops  # no range measured per call
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}  # standard QDQ, readable by NPU toolchains
    fused = _fused_ops(out / ob.VNNI_ENCODER_FILE)
    assert {"QGemm", "QLinearMatMul"} <= fused and "Gemm" not in fused and "MatMul" not in fused
    portable = [n.op_type for n in onnx.load(str(out / ob.ENCODER_FILE)).graph.node]
    assert "MatMulInteger" in portable and "QuantizeLinear" not in portable  # encoder.onnx: dynamic u8 as before
    x = np.random.default_rng(1).standard_normal((1, 3, 256, 256)).astype(np.float32)
    assert ob.OnnxBackend.from_bundle(out).encoder_role == ob.VNNI_ENCODER_ROLE
    assert np.isfinite(ob.OnnxBackend.from_bundle(out).encode(x).image_embed).all()


def test_static_file_missing_a_bar_falls_back_to_dynamic(tmp_path: Path, monkeypatch) -> None:
    """Activation ranges cut to 1% of the calibrated ones clip every real activation: the static file misses the
    bars, the dynamic s8 file ships in its place, and the card says both."""
    from onnx import numpy_helper

    real = st.quantize_static_int8

    def clipped(opt, out, cfg, input_name):
        census = real(opt, out, cfg, input_name=input_name)
        model = onnx.load(str(out))
        scales = {n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear"}  # activations' ranges
        for init in model.graph.initializer:
            if init.name in scales:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 0.01, init.name))
        onnx.save(model, str(out))
        return census

    monkeypatch.setattr(st, "quantize_static_int8", clipped)
    out = tmp_path / "int8"
    card = _export(out, monkeypatch)
    vnni = card["fidelity"]["checks"]["int8_vnni"]
    assert not vnni["static"]["shipped"] and "missed the int8 bars" in vnni["static"]["why"]
    assert vnni["shipped"] and vnni["int8"] == "dynamic" and vnni["end_to_end"]["iou_worst"] >= 0.95
    assert card["extra"]["int8_activations"]["shipped"] == "dynamic"
    ops = {n.op_type for n in onnx.load(str(out / ob.VNNI_ENCODER_FILE)).graph.node}
    assert "MatMulInteger" in ops and "QuantizeLinear" not in ops


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--target", "litert", "--precision", "int8", "--int8", "static"], "applies to --target onnx --precision"),
        (["--target", "onnx", "--precision", "fp32", "--int8", "dynamic"], "applies to --target onnx --precision"),
    ],
)
def test_int8_flag_refusals(argv, says, tmp_path: Path, capsys) -> None:
    assert main(["export", *argv, "--config", "test-small", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not (tmp_path / "b").exists()


def test_int8_flag_reaches_the_export_and_the_card_command(tmp_path: Path, monkeypatch) -> None:
    from sam2edge.errors import UserError
    from sam2edge.export import pipeline

    seen = {}

    def fake(*a, **kw):
        seen.update(kw)
        raise UserError("stopped by the test")

    monkeypatch.setattr(pipeline, "run_export", fake)
    args = ["export", "--target", "onnx", "--precision", "int8", "--config", "test-small", "--out", str(tmp_path / "b")]
    assert main([*args, "--int8", "static"]) == 2
    assert seen["options"] == {"int8": "static"} and "--int8 static" in seen["command"]
    assert main(args) == 2 and seen["options"] is None  # the default mode (st.DEFAULT_MODE: static)
    assert main([*args, "--int8", "dynamic"]) == 2 and seen["options"] == {"int8": "dynamic"}


def test_unknown_int8_mode_is_one_line(tmp_path: Path) -> None:
    from sam2edge.errors import UserError

    weights = (synthetic_state_dict(TEST_SMALL), SOURCE)
    with pytest.raises(UserError, match="pass --int8 static or --int8 dynamic"):
        run_export("onnx", "test-small", "int8", tmp_path / "b", weights=weights, options={"int8": "fast"})
    assert not (tmp_path / "b").exists()
