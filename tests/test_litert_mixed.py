"""LiteRT mixed precision (``export.litert_mixed``): the measured selection's parts stay fp32 in the .tflite.

The ops that land in the graph are read back from the flatbuffer: with parts kept, their FULLY_CONNECTED /
CONV_2D weights are float32 and every other weighted op's are int8 (dynamic-range recipe) or float16 (fp16
recipe); with nothing kept the recipe is litert-torch's own. The end-to-end export of an outlier checkpoint
whose all-int8 LiteRT encoder misses the int8 bar, with nothing allowed fp32, is refused naming the layers and
``diagnose``. ``REFUSED`` is also
one nothing saves: with the selection's 8 layers fp32 its LiteRT int8 export still measured worst 0.0393 (emulated
0.0392), and is refused with those layers named.
"""

from __future__ import annotations

import pytest
import torch

from sam2edge.checks.fidelity.checkpoints import variant_state_dict
from sam2edge.config import TEST_SMALL

QKV = "image_encoder.trunk.blocks.1.attn.qkv"
CONV = "sam_mask_decoder.conv_s0"
BLOCK = "image_encoder.trunk.blocks.2"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The test-small encoder graph converted fp32 by litert-torch, with its module and the model's name in it."""
    from sam2edge.export.litert import ENCODER_FILE, convert_graph, graphs
    from sam2edge.export.litert_mixed import Owners, model_prefix
    from sam2edge.model import Rewrites, build_sam2

    model = build_sam2(TEST_SMALL, Rewrites())
    model.load_state_dict(variant_state_dict("synthetic:1", TEST_SMALL))
    module, sample = graphs(model.eval(), 8)[ENCODER_FILE]
    path = tmp_path_factory.mktemp("litert_mixed") / "encoder.tflite"
    convert_graph(module, sample, path, "fp32")
    return path.read_bytes(), Owners(module, model_prefix(module, model)), model


def test_every_weighted_op_is_owned_by_a_module_of_the_model(converted):
    from sam2edge.export.litert_mixed import weighted_ops

    fp32, owners, model = converted
    ops = weighted_ops(fp32, owners)
    names = dict(model.named_modules())
    assert ops and all(r["owner"] in names and r["dtype"] == "FLOAT32" for r in ops), ops[:3]
    linears = {n for n, m in names.items() if n.startswith("image_encoder.") and isinstance(m, torch.nn.Linear)}
    assert linears <= {r["owner"] for r in ops}  # every encoder Linear is found by name
    assert sum(r["owner"] == QKV for r in ops) == 1 and sum(r["owner"] == CONV for r in ops) == 1


CASES = [("int8", "INT8", (QKV, CONV)), ("fp16", "FLOAT16", (BLOCK,))]


@pytest.mark.parametrize(("precision", "reduced", "keep"), CASES)
def test_kept_parts_keep_float32_weights_and_the_rest_is_reduced(converted, precision, reduced, keep):
    from sam2edge.export.litert_mixed import in_parts, quantize, weighted_ops

    fp32, owners, _ = converted
    data, census = quantize(fp32, precision, owners, keep)
    ops = weighted_ops(data, owners)
    kept = {r["dtype"] for r in ops if in_parts(r["owner"], keep)}
    rest = {r["dtype"] for r in ops if not in_parts(r["owner"], keep)}
    assert kept == {"FLOAT32"} and rest == {reduced}, (kept, rest)
    n_kept = sum(in_parts(r["owner"], keep) for r in weighted_ops(fp32, owners))
    assert census["fp32_kept_ops"] == n_kept >= len(keep) and not census["leaked"], census
    plain, census0 = quantize(fp32, precision, owners, ())
    assert {r["dtype"] for r in weighted_ops(plain, owners)} == {reduced} and "fp32_kept_ops" not in census0
    assert len(data) > len(plain)  # the kept weights take 4 bytes each


def test_a_kept_part_the_graph_does_not_have_is_an_error(converted):
    from sam2edge.export.litert_mixed import quantize

    fp32, owners, _ = converted
    with pytest.raises(RuntimeError, match="own no weighted op"):
        quantize(fp32, "int8", owners, ("image_encoder.trunk.blocks.99",))


SOURCE = {"format": "synthetic", "sha256": None}
OPTIONS = {"gpu_check": "skip", "batch": 0}  # the export's own fidelity is the check here; no batched decoder
# (variant, LayerNorm outlier gain): with every weighted op int8 the real LiteRT export is refused (test-small, 40
# clicks, worst 0.0401 < 0.95, median 0.9741; ``synthetic:1`` at gain 30: worst 0.6216)
REFUSED = ("synthetic:2", 30.0)


def _outliers(spec: str, gain: float) -> dict:
    from tests.test_mixed_precision import int8_outliers

    return int8_outliers(variant_state_dict(spec, TEST_SMALL), seed=5, gain=gain)


@pytest.mark.parametrize("target", ["onnx", pytest.param("litert", marks=pytest.mark.slow)])  # litert: 60 s
def test_int8_export_nothing_can_save_is_refused(target, tmp_path, monkeypatch):
    """With nothing allowed fp32 (max_kept 0) an outlier checkpoint's int8 export misses the int8 bar and is refused
    in one line: the lowest clicks, what the selection kept and reached, the ``diagnose`` command; nothing is
    written."""
    import re

    from sam2edge.errors import UserError
    from sam2edge.export import int8_sensitivity
    from sam2edge.export.pipeline import run_export

    spec, gain = REFUSED
    real = int8_sensitivity.select_int8
    monkeypatch.setattr(int8_sensitivity, "select_int8", lambda *a, **k: real(*a, **{**k, "max_kept": 0}))
    out = tmp_path / "b"
    with pytest.raises(UserError) as err:
        run_export(
            target,
            "test-small",
            "int8",
            out,
            weights=(_outliers(spec, gain), {**SOURCE, "checkpoint": spec}),
            options=OPTIONS,
        )
    msg = str(err.value)
    assert not out.exists() and "\n" not in msg and msg.startswith("export refused: end-to-end mask IoU"), msg
    assert "keeping nothing in fp32 still missed the bars in the eager emulation (worst " in msg, msg
    assert re.search(r"IoU worst 0\.\d{4} < 0\.95", msg) and f"sam2edge diagnose {target} --int8" in msg, msg


def test_litert_int8_emulation_quantises_the_encoder_graph_convolutions():
    """LiteRT's dynamic-range recipe quantises convolution weights too (``targets``: int8_layers), so its
    emulation fake-quantises every encoder Conv2d and the decoder's feature projections in the encoder graph,
    per output channel, and nothing of the prompt-side decoder; ONNX's stays Linear-only."""
    from torch import nn

    from sam2edge.export.int8_sensitivity import int8_layers
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.targets import get_target

    model = build_sam2(TEST_SMALL, Rewrites()).eval()
    layers = int8_layers(model, "per_token", get_target("litert").int8_layers)
    convs = {n for n, m in layers.items() if isinstance(m, nn.Conv2d)}
    assert "image_encoder.trunk.patch_embed.proj" in convs and {CONV, "sam_mask_decoder.conv_s1"} <= convs
    assert all(n.startswith("image_encoder.") or n in (CONV, "sam_mask_decoder.conv_s1") for n in layers)
    assert QKV in layers and not any(n.startswith("sam_mask_decoder.output") for n in layers)
    onnx = int8_layers(build_sam2(TEST_SMALL, Rewrites()).eval(), "per_tensor", get_target("onnx").int8_layers)
    assert not any(isinstance(m, nn.Conv2d) for m in onnx.values())
    conv = layers["image_encoder.trunk.patch_embed.proj"]
    x = torch.randn(1, 3, TEST_SMALL.image_size, TEST_SMALL.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y8 = conv(x)
        conv.int8_enabled = False
        y32 = conv(x)
    step = conv.weight.flatten(1).abs().amax(1) / 127
    assert torch.all((conv.int8_weight - conv.weight).flatten(1).abs().amax(1) <= step / 2 + 1e-7)
    assert 0 < float((y8 - y32).abs().max()) < 0.1 * float(y32.abs().max())


def test_litert_int8_emulation_takes_a_1x1_convolution_per_pixel():
    """LiteRT runs a 1x1 convolution's dynamic-range int8 as a fully connected layer's rows: one activation range
    per pixel (an int8 bundle of upstream-s4-outliers differs from the emulation as two emulation draws do only
    this way, ``benchmarks/int8_draws.py``); the patch embedding keeps one range per image. One loud pixel then
    coarsens only its own step in the 1x1 convolution."""
    from sam2edge.export.int8_sensitivity import fake_quant_activation, int8_layers
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.targets import get_target

    layers = int8_layers(build_sam2(TEST_SMALL, Rewrites()).eval(), "per_token", get_target("litert").int8_layers)
    assert layers["image_encoder.trunk.patch_embed.proj"].int8_granularity == "per_tensor"
    conv = layers[CONV]
    assert conv.kernel_size == (1, 1) and conv.int8_granularity == "per_pixel"
    for seed in (0, 1):
        x = torch.randn(1, conv.in_channels, 8, 8, generator=torch.Generator().manual_seed(seed))
        x[0, :, 3, 5] *= 1000  # one loud pixel
        with torch.no_grad():
            got = conv(x)
            per_pixel = fake_quant_activation(x.permute(0, 2, 3, 1), "per_token").permute(0, 3, 1, 2)
            want = torch.nn.functional.conv2d(per_pixel, conv.int8_weight, conv.bias)
            per_image = torch.nn.functional.conv2d(fake_quant_activation(x, "per_tensor"), conv.int8_weight, conv.bias)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        quiet = torch.ones(8, 8, dtype=torch.bool)
        quiet[3, 5] = False
        assert (got - want).abs().max() < 1e-5 < (per_image - want)[0][:, quiet].abs().max()
