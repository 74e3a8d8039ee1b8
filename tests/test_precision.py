"""fp16 files (ONNX's fp16 storage with fp32 compute, ExecuTorch's fp16 arithmetic) and the robustness set.

Fast: ONNX's fp16 file holds fp16 weights and computes exactly what fp32 arithmetic on fp16-rounded weights
computes (the emulation ``export.precision.fp16_weights``); ExecuTorch's lowered fp16 encoder computes what its
emulation ``export.precision.fp16_arithmetic`` computes; neither gives the fp32 model's answer (so the checks can
fail). Slow: the robustness set (``scripts/robustness_set.py``) is
deterministic, and every target's fp16 emulation holds the fp16 bars on each of its 5 checkpoints at full size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sam2edge.checks.fidelity.bars import BARS

ROOT = Path(__file__).resolve().parents[1]


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1, self.norm, self.fc2 = nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 32)
        self.conv = nn.Conv2d(3, 64, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, 3, 4, 4) -> (1, 16, 32)
        t = self.conv(x).flatten(2).transpose(1, 2)  # (1, 16, 64)
        return self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(t))))


def _rounded(m: nn.Module, keep=lambda name: False) -> nn.Module:
    import copy

    out = copy.deepcopy(m)
    with torch.no_grad():
        for n, p in out.named_parameters():
            if not keep(n):
                p.copy_(p.half().float())
    return out


def _x() -> torch.Tensor:
    return torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(1)) * 2


def test_onnx_fp16_storage_is_fp32_compute_on_rounded_weights(tmp_path):
    import onnx
    import onnxruntime as ort

    from sam2edge.export.onnx_fp16 import FP16_MIN_ELEMENTS, fp16_storage

    m, x = _Small().eval(), _x()
    raw = tmp_path / "raw.onnx"
    torch.onnx.export(m, (x,), str(raw), dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    census = fp16_storage(raw, tmp_path / "half.onnx")
    model = onnx.load(str(tmp_path / "half.onnx"))
    big = [i for i in model.graph.initializer if int(np.prod(i.dims)) >= FP16_MIN_ELEMENTS]
    assert big and all(i.data_type == onnx.TensorProto.FLOAT16 for i in big) and census["fp16"] == len(big)
    assert (tmp_path / "half.onnx").stat().st_size < 0.6 * raw.stat().st_size
    y = ort.InferenceSession(str(tmp_path / "half.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()}
    )
    with torch.no_grad():
        small = {n for n, p in m.named_parameters() if p.numel() < FP16_MIN_ELEMENTS}
        want, fp32 = _rounded(m, lambda n: n in small)(x).numpy(), m(x).numpy()
    np.testing.assert_allclose(y[0], want, rtol=1e-5, atol=1e-5)
    assert np.abs(want - fp32).max() > 1e-4  # the rounding is visible: the comparison above can fail


def test_executorch_fp16_lowers_fp16_arithmetic_with_a_kept_part_in_fp32():
    """The ExecuTorch fp16 encoder as the export lowers it (test-small): fp16 weights and arithmetic in the
    XNNPACK delegates, one kept block fp32 in a delegate of its own (its casts on the portable kernels), a
    program well under the fp32 parameters' bytes, and outputs of fp16's error against fp32: visibly not fp32 (so
    the check can fail). Against the eager emulation the selection runs (``fp16_arithmetic``): where this CPU
    computes fp16 through fp32, as close as it (each operation rounds its result, as eager fp16 does); with fp16
    arithmetic, no closer (XNNPACK's sums and means accumulate in fp16)."""
    from executorch.runtime import Runtime

    from sam2edge.checks.bench.records import machine
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.executorch import REWRITES, lower_program, parameter_bytes
    from sam2edge.export.executorch_graphs import XnnEncoderGraph, encoder_inputs, fp16_encoder
    from sam2edge.export.precision import fp16_arithmetic
    from sam2edge.model import build_sam2
    from sam2edge.weights import synthetic_state_dict

    keep = ("image_encoder.trunk.blocks.0",)
    model = build_sam2(TEST_SMALL, REWRITES)
    model.load_state_dict(synthetic_state_dict(TEST_SMALL))
    model.eval()
    graph = fp16_encoder(XnnEncoderGraph(model), keep).eval()
    kept = graph.inner.model.image_encoder.trunk.blocks[0].module
    assert {p.dtype for p in kept.parameters()} == {torch.float32}
    assert graph.inner.model.image_encoder.trunk.blocks[1].attn.qkv.weight.dtype == torch.float16
    args = encoder_inputs(TEST_SMALL)
    fp16, census = lower_program(graph, args, "fp16", "encoder")
    fp32_bytes = parameter_bytes(model, "fp32")["encoder"]  # what the fp32 encoder program holds
    c = census.as_dict()
    assert c["delegates"] == 3, c  # fp16 before the kept block, the block in fp32, fp16 after it
    assert set(c["outside_delegate"]) == {"dim_order_ops"}, c  # the dtype casts only
    # fp16 weights (0.61x here: convolutions are serialized fp32, the kept block is fp32); fp32 weights would be >= 1x
    assert len(fp16.buffer) < 0.7 * fp32_bytes, (len(fp16.buffer), fp32_bytes)
    image = torch.randn(1, 3, TEST_SMALL.image_size, TEST_SMALL.image_size, generator=torch.Generator().manual_seed(3))
    got = Runtime.get().load_program(fp16.buffer).load_method("forward").execute([image])
    with torch.no_grad():
        emulated = XnnEncoderGraph(fp16_arithmetic(model, keep))(image)
        exact = XnnEncoderGraph(model)(image)
    native = machine()["fp16_arithmetic"] == "native"
    for g, e, x in zip(got, emulated, exact, strict=True):
        assert g.dtype == torch.float32
        rel_program, rel_emulated = float((g - x).norm() / x.norm()), float((e - x).norm() / x.norm())
        # fp16 arithmetic, visibly (not fp32), and of fp16's order
        assert 1e-4 < rel_emulated and 1e-4 < rel_program < 0.02, (rel_program, rel_emulated)
        if native:  # AVX512-FP16 (test-small: 0.0034 against the emulation's 0.0013)
            assert rel_emulated <= rel_program, (rel_program, rel_emulated)
        else:  # through fp32 (AMD EPYC, test-small: 0.000512 against 0.000512)
            assert abs(rel_program - rel_emulated) <= 0.1 * rel_emulated, (rel_program, rel_emulated)


def _robustness_module():
    spec = importlib.util.spec_from_file_location("robustness_set", ROOT / "scripts" / "robustness_set.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def robustness_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("robustness_set")
    return _robustness_module().write_set(folder)


@pytest.mark.slow
def test_robustness_set_is_deterministic(robustness_set, tmp_path):
    rs = _robustness_module()
    again = rs.write_set(tmp_path, ["upstream-s1-perturbed", "upstream-s4-outliers"])
    for name, path in again.items():
        a, b = (hashlib.sha256(p.read_bytes()).hexdigest() for p in (path, robustness_set[name]))
        assert a == b, name
    assert len(robustness_set) == 5


@pytest.mark.slow
@pytest.mark.parametrize("target", ["litert", "onnx", "executorch"])
def test_fp16_emulation_holds_on_the_robustness_set(robustness_set, target):
    """Each target's fp16 arithmetic (fp16-stored encoder weights, fp32 compute and decoder) at full size,
    40 clicks vs eager fp32 with upstream's operations, on every checkpoint of the set."""
    from sam2edge.checks.fidelity import click_set, end_to_end
    from sam2edge.config import HIERA_TINY
    from sam2edge.export.precision import emulated_pair
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.weights import load_weights

    clicks, bad = click_set(40), []
    for name, path in robustness_set.items():
        sd = load_weights(str(path), HIERA_TINY)[0]
        ref = Sam2Predictor(EagerBackend.from_state_dict(sd, HIERA_TINY, UPSTREAM))
        r = end_to_end(ref, Sam2Predictor(emulated_pair(sd, HIERA_TINY, target)[1]), clicks)
        if not (r["iou_worst"] >= BARS["fp16"]["min_iou_worst"] and r["iou_median"] >= BARS["fp16"]["min_iou_median"]):
            bad.append((name, r["iou_worst"], r["iou_median"]))
    assert not bad, (target, bad)


def test_int8_fake_quant_matches_the_dynamic_schemes():
    from sam2edge.export.int8_sensitivity import fake_quant_activation, fake_quant_weight, int8_layers

    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 64, generator=g) * torch.linspace(0.1, 3, 8)[:, None]
    q = fake_quant_weight(w)
    step = w.abs().amax(1, keepdim=True) / 127
    assert torch.all((q - w).abs() <= step / 2 + 1e-6) and torch.allclose(q / step, torch.round(q / step), atol=1e-4)
    x = torch.randn(16, 64, generator=g)
    x[:, 3] *= 50  # an outlier channel: one per-tensor range for every token loses the others' resolution
    err = {k: float((fake_quant_activation(x, k) - x)[:, 4:].abs().mean()) for k in ("per_token", "per_tensor")}
    assert err["per_token"] <= err["per_tensor"] and err["per_tensor"] > 0
    model = nn.Sequential()
    model.add_module("image_encoder", nn.Sequential(nn.Linear(64, 32)))
    layers = int8_layers(model, "per_tensor")
    assert list(layers) == ["image_encoder.0"]
    with torch.no_grad():
        y8 = model(x)
        layers["image_encoder.0"].int8_enabled = False
        y32 = model(x)
    torch.testing.assert_close(y32, torch.nn.functional.linear(x, layers["image_encoder.0"].weight, model[0][0].bias))
    assert (y8 - y32).abs().max() > 1e-3


def test_smoothing_is_the_same_function_in_fp32():
    """Shift and scale (``export.smooth``) move range between a LayerNorm and its Linear readers and between the
    values and the attention's projection: with outlier channels that sit at a constant offset (as trained
    transformers' do), the encoder's outputs are unchanged in fp32 (test-small pads its stage-3 / 4 windows:
    those norms are scaled only) while the ranges int8 quantises per token shrink."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.smooth import calibrate, smoothed
    from sam2edge.model import Rewrites, build_sam2

    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    sd["image_encoder.trunk.blocks.1.norm2.weight"][3] *= 20  # an outlier channel
    sd["image_encoder.trunk.patch_embed.proj.bias"][5] += 8.0  # a residual channel at a constant offset
    new, report = smoothed(sd, TEST_SMALL, Rewrites())
    assert report and max(r["max_scale"] for r in report.values()) > 1
    assert max(r["max_shift"] for r in report.values()) > 0.5
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    models = []
    for s in (sd, new):
        m = build_sam2(TEST_SMALL, Rewrites())
        m.load_state_dict(s)
        models.append(m.eval())
    with torch.no_grad():
        for a, b in zip(models[0].encode_image(x), models[1].encode_image(x), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
    before, after = (calibrate(m, TEST_SMALL, ("horse.png",)) for m in models)
    assert not before["blocks.4.norm1"].shiftable and before["blocks.0.norm1"].shiftable  # stage 3 pads

    def spread(r):  # the extent a token's int8 step must cover, against the median channel's own width
        return float(torch.maximum(r.hi.abs(), r.lo.abs()).max() / (r.hi - r.lo).median())

    for key in ("blocks.1.norm2", "blocks.1.attn", "blocks.0.norm1"):
        assert spread(after[key]) < spread(before[key]), key


@pytest.mark.parametrize("seed", [1, 2])
def test_mlp_hidden_channels_at_offsets_are_shifted_by_an_explicit_subtraction(seed):
    """Hidden MLP channels that sit at offsets (no linear producer can take their shift: GELU is between) are
    shifted in the graph (``ShiftedMLP``: ``mlp.shift``, ``mlp.layers.1``'s bias holding ``W d``): the encoder is
    the same function in fp32 and the calibrated range int8 quantises narrows below ``SHIFT_GAIN``; ordinary
    weights get no shift there."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.smooth import SHIFT_GAIN, calibrate, centring_gain, smoothed
    from sam2edge.model import Rewrites, build_sam2

    param, shift = "image_encoder.trunk.blocks.1.mlp.layers.0.bias", "image_encoder.trunk.blocks.1.mlp.shift"
    plain = variant_state_dict(f"synthetic:{seed}", TEST_SMALL)
    sd = {**plain, param: plain[param].clone()}
    sd[param][:4] += 6.0  # four hidden channels at an offset (GELU passes them)
    new, _ = smoothed(sd, TEST_SMALL, Rewrites())
    assert shift in new and shift not in smoothed(plain, TEST_SMALL, Rewrites())[0]
    models = []
    for s in (sd, new):
        m = build_sam2(TEST_SMALL, Rewrites())
        m.load_state_dict(s)
        models.append(m.eval())
    assert models[0].get_submodule(shift.rsplit(".", 1)[0]).shift is None
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for a, b in zip(models[0].encode_image(x), models[1].encode_image(x), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))

    before, after = (calibrate(m, TEST_SMALL, ("horse.png",))["blocks.1.mlp"] for m in models)
    assert centring_gain(before) >= SHIFT_GAIN > centring_gain(after)


@pytest.mark.parametrize("target", ["litert", "onnx", "executorch"])
def test_every_int8_export_builds_its_graphs_from_the_smoothed_encoder(target, monkeypatch, tmp_path):
    """Every target's int8 quantises activations per call (per tensor or per token), so every int8 export smooths
    the encoder first: the model the pipeline hands the target is built from ``export_weights`` (smoothed norms
    and Linear columns), fp32 / fp16 exports from the checkpoint's own weights."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export import pipeline
    from sam2edge.export.smooth import export_weights
    from sam2edge.targets import get_target, resolve

    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    norm = "image_encoder.trunk.blocks.1.norm2.weight"
    smoothed_norm = export_weights(sd, TEST_SMALL, "int8")[norm]
    assert not torch.equal(smoothed_norm, sd[norm])
    assert export_weights(sd, TEST_SMALL, "fp16") is sd and export_weights(sd, TEST_SMALL, "fp32") is sd

    built = {}

    class Stop(Exception):
        pass

    spec = resolve(get_target(target).converter)

    def model(sd_, cfg, precision, rewrites):
        built[precision] = sd_[norm].clone()
        raise Stop

    monkeypatch.setattr(pipeline, "resolve", lambda _c: dataclasses.replace(spec, model=model))
    for precision in ("fp32", "int8"):
        with pytest.raises(Stop):
            pipeline.run_export(target, "test-small", precision, tmp_path / precision, weights=(sd, "t"))
    torch.testing.assert_close(built["int8"], smoothed_norm)
    assert torch.equal(built["fp32"], sd[norm])


@pytest.mark.parametrize(  # LiteRT / ExecuTorch: about 2 minutes each here (their int8 selection and conversion)
    "target",
    [pytest.param("litert", marks=pytest.mark.slow), "onnx", pytest.param("executorch", marks=pytest.mark.slow)],
)
def test_int8_export_carries_the_mlp_shift_into_its_graph(target, tmp_path):
    """An int8 export of weights whose MLP hidden channels sit at offsets converts the shift with its encoder:
    the card counts the shifted MLPs and the bundle's masks stay with eager fp32 (a graph without the
    subtraction would add ``W d`` to every token: masks far off)."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.pipeline import run_export

    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    fc1 = "image_encoder.trunk.blocks.1.mlp.layers.0.bias"
    sd[fc1] = sd[fc1].clone()
    sd[fc1][:4] += 6.0  # four hidden channels at an offset
    source = {"checkpoint": "synthetic:1", "format": "synthetic", "sha256": None}
    card = run_export(target, "test-small", "int8", tmp_path / "b", weights=(sd, source), force=True, clicks=8)
    assert card["extra"]["int8_shifted_mlps"] >= 1
    e2e = card["fidelity"]["end_to_end"]
    assert e2e["iou_median"] >= 0.95, e2e
