"""fp16 / int8 exports that hold for any weights.

Three random checkpoints (two other seeds and a range-stressed one, see ``sam2edge.checks.fidelity.checkpoints``)
compared end to end with eager fp32 with upstream's operations over the 40 clicks on real photos:
fp16 worst IoU >= 0.99 and median >= 0.999, int8 worst >= 0.95.
CI (TEST_SMALL): each target's graphs with its reduced-precision arithmetic run in eager
(``sam2edge.export.precision``: fp16 weights with fp32 compute for every target, the quantizer's int8 ops for
ExecuTorch int8). Slow: the same checkpoints through each target's real converter and runtime
(litert-torch fp16 recipe, ONNX fp16 initializers under onnxruntime, ExecuTorch fp16-stored parameters /
dynamic int8), at
TEST_SMALL and at full size. Also: the LayerNorm rewrite is the same function as upstream's in fp32 and finite
in fp16 at any scale, and the localization tool names the op that overflowed before the fix.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sam2edge.checks.fidelity import click_set, end_to_end
from sam2edge.checks.fidelity.bars import BARS
from sam2edge.checks.fidelity.checkpoints import TEST_SMALL_WIDE_DECODER, range_stress, variant_state_dict
from sam2edge.checks.fidelity.localize import first_jump, op_errors
from sam2edge.config import TEST_SMALL
from sam2edge.model import UPSTREAM, Rewrites, build_sam2
from sam2edge.model.layers import LayerNorm, LayerNorm2d
from sam2edge.runtime.backends import EagerBackend
from sam2edge.runtime.predictor import Sam2Predictor

CHECKPOINTS = ("synthetic:1", "synthetic:2", "synthetic:0:range4")  # int8 (test-small) and the real converters
# fp16 in CI: test-small's encoder with the full decoder widths, where an all-fp16 decoder fails the median bar
# (synthetic:3 0.9985, synthetic:1 0.9983, synthetic:3:range4 below 0.999 too: docs/design/precision.md)
WIDE_CHECKPOINTS = ("synthetic:3", "synthetic:1", "synthetic:3:range4")
FP16_WORST, FP16_MEDIAN, INT8_WORST = (
    BARS["fp16"]["min_iou_worst"],
    BARS["fp16"]["min_iou_median"],
    BARS["int8"]["min_iou_worst"],
)
SOURCE = {"format": "synthetic", "sha256": None}


@pytest.fixture(scope="module")
def clicks():
    return click_set(40)


class _Recorded:
    """A backend that runs ``backend`` once per distinct input (shared by every target of one checkpoint)."""

    def __init__(self, backend) -> None:
        self.backend, self.name, self.cfg = backend, backend.name, backend.cfg
        self._memo: dict[bytes, object] = {}

    def _once(self, key: bytes, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def encode(self, image):
        return self._once(b"e" + np.ascontiguousarray(image).tobytes(), lambda: self.backend.encode(image))

    def decode(self, feats, coords, labels, mask_input):
        key = b"".join(np.ascontiguousarray(a).tobytes() for a in (feats.image_embed[0, 0], coords, labels))
        key += b"m" + (b"" if mask_input is None else np.ascontiguousarray(mask_input).tobytes())
        return self._once(key, lambda: self.backend.decode(feats, coords, labels, mask_input))


@functools.cache
def _reference(spec: str, cfg=TEST_SMALL_WIDE_DECODER):
    sd = variant_state_dict(spec, cfg)
    return sd, _Recorded(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))


def _exported(spec, target, precision, tmp, cfg_name):
    """The real export (converter, runtime and its own fidelity measurement: 40 clicks vs eager fp32)."""
    from sam2edge.config import get_config
    from sam2edge.export.pipeline import run_export

    sd = variant_state_dict(spec, get_config(cfg_name))
    card = run_export(target, cfg_name, precision, tmp / "b", weights=(sd, {**SOURCE, "checkpoint": spec}), force=True)
    return card["fidelity"]["end_to_end"]


def _emulated(spec, target, clicks, cfg=TEST_SMALL_WIDE_DECODER):
    from sam2edge.export.precision import emulated_pair, int8_emulation

    sd, ref = _reference(spec, cfg)
    test = int8_emulation(sd, cfg) if target == "int8" else emulated_pair(sd, cfg, target)[1]
    return end_to_end(Sam2Predictor(ref), Sam2Predictor(test), clicks)


@pytest.mark.parametrize("spec", WIDE_CHECKPOINTS)
@pytest.mark.parametrize("target", ["executorch", "litert", "onnx"])
def test_fp16_graphs_hold_for_random_checkpoints(target, spec, clicks):
    """Each target's fp16 arithmetic (``EMULATIONS``: ExecuTorch / ONNX fp16 encoder + fp32 decoder, LiteRT
    fp16 weights) at full decoder width, 40 clicks vs eager fp32 upstream: the one bar table's fp16 bars."""
    r = _emulated(spec, target, clicks)
    assert r["iou_worst"] >= FP16_WORST and r["iou_median"] >= FP16_MEDIAN, (target, spec, r)


@pytest.mark.parametrize("spec", CHECKPOINTS)
def test_int8_graphs_hold_for_random_checkpoints(spec, clicks):
    r = _emulated(spec, "int8", clicks, TEST_SMALL)
    assert r["iou_worst"] >= INT8_WORST, (spec, r)


@pytest.mark.slow
@pytest.mark.parametrize("spec", CHECKPOINTS)
@pytest.mark.parametrize("target", ["executorch", "litert", "onnx"])
def test_fp16_export_holds_for_random_checkpoints(target, spec, tmp_path):
    r = _exported(spec, target, "fp16", tmp_path, "test-small")
    assert r["iou_worst"] >= FP16_WORST and r["iou_median"] >= FP16_MEDIAN, (target, spec, r)


@pytest.mark.slow
@pytest.mark.parametrize("spec", CHECKPOINTS)
def test_int8_export_holds_for_random_checkpoints(spec, tmp_path):
    r = _exported(spec, "executorch", "int8", tmp_path, "test-small")
    assert r["iou_worst"] >= INT8_WORST, (spec, r)


@pytest.mark.slow
@pytest.mark.parametrize("spec", CHECKPOINTS)
@pytest.mark.parametrize("target", ["executorch", "onnx", "litert"])
def test_fp16_export_holds_at_full_size(target, spec, tmp_path):
    """Full size (1024 px, Hiera-Tiny widths); about 10 min per conversion on 2 cores."""
    r = _exported(spec, target, "fp16", tmp_path, "sam2.1-hiera-tiny")
    assert r["iou_worst"] >= FP16_WORST and r["iou_median"] >= FP16_MEDIAN, (target, spec, r)


def test_range_stress_is_the_same_function_with_larger_ranges():
    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    image = torch.randn(1, 3, TEST_SMALL.image_size, TEST_SMALL.image_size)
    outs, peaks = [], []
    for s in (sd, range_stress(sd, 4.0)):
        model = build_sam2(TEST_SMALL, UPSTREAM)
        model.load_state_dict(s)
        with torch.no_grad():
            outs.append(model.encode_image(image))
            peaks.append(float(model.image_encoder.trunk(image)[-1].abs().max()))
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
    assert peaks[1] == pytest.approx(4 * peaks[0], rel=1e-3)


@settings(max_examples=25, deadline=None)
@given(st.floats(-3, 5), st.sampled_from([16, 32, 256, 768]))
def test_scaled_layer_norm_is_exact_in_fp32_and_finite_in_fp16(log_scale, dim):
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(2, 5, dim, generator=g) * 10.0**log_scale + 3.0 * 10.0**log_scale
    scaled, native = (LayerNorm(dim, 1e-6, Rewrites(layer_norm=n)) for n in ("scaled", "native"))
    with torch.no_grad():
        for m in (scaled, native):
            m.weight.copy_(torch.randn(dim, generator=g))
            m.bias.copy_(torch.randn(dim, generator=g))
        native.load_state_dict(scaled.state_dict())
        ref = native.double()(x.double())
        torch.testing.assert_close(scaled(x).double(), ref, rtol=1e-5, atol=1e-5)
        if x.abs().max() < 6e4:
            half = scaled.half()(x.half()).double()
            assert torch.isfinite(half).all()
            assert float((half - ref).norm() / ref.norm()) < 4e-3


def test_scaled_layer_norm_2d_matches_upstream():
    x = torch.randn(1, 8, 5, 5) * 500 + 7
    a, b = LayerNorm2d(8, Rewrites(layer_norm="scaled")), LayerNorm2d(8, UPSTREAM)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-5)
        assert torch.isfinite(a.half()(x.half())).all()


def test_localization_names_the_overflowing_layer_norm():
    """Before the fix: the decoder's 'safe' LayerNorm squared values beyond fp16's range; the op view finds it."""
    from sam2edge.export.executorch_graphs import XnnDecoderGraph, decoder_inputs

    sd = {k: v * 4 for k, v in variant_state_dict("synthetic:0", TEST_SMALL).items()}  # large decoder ranges
    found = {}
    for ln in ("safe", "scaled"):
        model = build_sam2(TEST_SMALL, Rewrites(layer_norm=ln, transposed_conv="native", texture_limit=0))
        model.load_state_dict(sd)
        inputs = decoder_inputs(TEST_SMALL, 16)
        torch.manual_seed(0)
        feats = model.eval().encode_image(torch.randn(1, 3, 256, 256))
        found[ln] = first_jump(
            [s for s in op_errors(XnnDecoderGraph(model).eval(), (*feats, *inputs[3:])) if s.beyond_fp16 or s.nonfinite]
        )
    assert found["safe"] is not None and ".norm" in found["safe"].where and "aten." in found["safe"].where
    assert found["scaled"] is None


def test_diagnose_cli_reports_layers(capsys, tmp_path):
    """The printed numbers are the report's, the exit code is exactly the bar's verdict on them, and every
    per-module / per-op error is a finite number."""
    import json

    from sam2edge.cli.diagnose import IOU_MEDIAN, IOU_WORST
    from sam2edge.cli.main import main

    report_path = tmp_path / "report.json"
    argv = ["diagnose", "executorch", "--config", "test-small", "--checkpoint", "synthetic:1", "--clicks", "3"]
    rc = main([*argv, "--json", str(report_path)])
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    worst, median = report["iou_worst"], report["iou_median"]
    assert 0.0 <= worst <= median <= 1.0 and report["clicks"] == 3
    assert rc == (0 if worst >= IOU_WORST and median >= IOU_MEDIAN else 1)
    assert f"over 3 clicks: median {median:.5f}, worst {worst:.5f}" in out
    assert "encoder: output image_encoder" in out or "encoder: output sam_mask_decoder" in out
    assert "decoder: output sam_mask_decoder" in out
    assert " :: aten." in out
    for stage in ("encoder", "decoder"):
        rows = [report[stage]["output"], *report[stage]["worst_ops"]]
        assert len(rows) >= 2, stage
        nums = [v for row in rows for v in row.values() if isinstance(v, float)]
        assert nums and all(math.isfinite(v) for v in nums), (stage, rows)


def test_card_precision_section_shows_measured_iou_and_fp32_kept():
    """The card of an int8 / fp16 bundle: the export's measured worst / median IoU against the one bar table,
    and the parts its export kept in fp32 with why (card.json extra.fp32_kept); nothing for fp32."""
    from sam2edge.cards.precision import precision_section
    from sam2edge.export.kept import fp32_kept

    fid = {"end_to_end": {"clicks": 40, "iou_worst": 0.9612, "iou_median": 0.99311}, "bars": BARS["int8"]}
    card = {"precision": "int8", "extra": {"fp32_kept": fp32_kept("executorch", "int8")}}
    text = "\n".join(precision_section(card, fid))
    assert "| mask IoU worst | 0.96120 | >= 0.95 | pass |" in text and "median" not in text.split("Kept")[0]
    assert (
        "| decoder.pte, decoder_cpu.pte + decoder_prep.pte (prompt encoder + mask decoder) | dynamic int8 of the "
        "decoder's Linear layers costs" in text
    )
    fid16 = {"end_to_end": {"clicks": 40, "iou_worst": 0.9932, "iou_median": 0.9985}, "bars": BARS["fp16"]}
    text = "\n".join(precision_section({"precision": "fp16", "extra": {}}, fid16))
    assert "| mask IoU median | 0.99850 | >= 0.999 | FAIL |" in text and "not recorded" in text
    assert precision_section({"precision": "fp32"}, fid) == []
    # an ExecuTorch fp16 card names the CPU its check ran on and how that CPU computes fp16
    fid16["machine"] = {"cpu": "AMD EPYC", "fp16_arithmetic": "through fp32"}
    text = "\n".join(precision_section({"precision": "fp16", "target": "executorch", "extra": {}}, fid16))
    assert "upstream operations) on AMD EPYC, fp16 arithmetic through fp32:" in text and "sam2edge verify" in text
    assert "sam2edge verify" not in "\n".join(precision_section({"precision": "fp16", "target": "onnx"}, fid16))
    fid16["machine"] = {"cpu": "AMD EPYC", "cpu_generation": "family 26, model 2", "fp16_arithmetic": "native"}
    text = "\n".join(precision_section({"precision": "fp16", "target": "executorch", "extra": {}}, fid16))
    assert "on AMD EPYC (family 26, model 2), fp16 arithmetic native:" in text  # the generation beside the name
    fid16["machine"] = {"cpu": "Old CPU"}  # a record without the arithmetic: the CPU alone
    assert "upstream operations) on Old CPU:" in "\n".join(precision_section({"precision": "fp16"}, fid16))
    assert fp32_kept("executorch", "fp16") and fp32_kept("onnx", "fp16") and not fp32_kept("litert", "fp32")
