"""GPTQ rounding of the int8 encoder weights (``export.gptq``): the weights lie on the int8 grid every target
recomputes (so the targets' own quantisers reproduce them exactly), and the layer's output moves less than with
nearest rounding for inputs like the calibration's, over several seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sam2edge.export.gptq import QMAX, nearest, output_error, rounded


def _layer(seed: int, out: int = 48, inp: int = 96, tokens: int = 2000):
    """A weight with a few large entries and inputs whose channels are correlated (as LayerNorm outputs are)."""
    g = torch.Generator().manual_seed(seed)
    w = 0.02 * torch.randn(out, inp, generator=g)
    w[torch.randint(0, out, (4,), generator=g), torch.randint(0, inp, (4,), generator=g)] *= 8.0
    mix = torch.randn(inp // 4, inp, generator=g)  # inputs in a lower-dimensional subspace, plus noise
    x = torch.randn(tokens, inp // 4, generator=g) @ mix + 0.1 * torch.randn(tokens, inp, generator=g)
    return w, x, (x.double().T @ x.double()) / tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rounded_weights_are_on_the_grid_and_move_the_output_less(seed):
    w, _x, h = _layer(seed)
    q = rounded(w, h)
    torch.testing.assert_close(nearest(q), q, rtol=1e-6, atol=1e-9)  # a target's max-abs rounding of q is q
    scale = w.abs().amax(1, keepdim=True) / QMAX
    torch.testing.assert_close(q.abs().amax(1, keepdim=True), w.abs().amax(1, keepdim=True))  # scale kept
    assert float(((q / scale).round() - q / scale).abs().max()) < 1e-3
    assert output_error(w, q, h) < 0.5 * output_error(w, nearest(w), h)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_targets_quantisers_reproduce_the_rounded_weights(seed):
    """ExecuTorch's per-channel symmetric observer (-127..127) and onnxruntime's symmetric INT8 weights give back
    the very values ``rounded`` chose, so the bundle's int8 weights are GPTQ's."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    w, _x, h = _layer(seed)
    q = rounded(w, h)
    obs = PerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-127, quant_max=127
    )
    obs(q)
    scale, zero = obs.calculate_qparams()
    et = torch.dequantize(torch.quantize_per_channel(q, scale.double(), zero, 0, torch.qint8))
    torch.testing.assert_close(et, q, rtol=0, atol=1e-7)
    for row in q.numpy():
        zp, s, data = quantize_data(row, TensorProto.INT8, symmetric=True)
        np.testing.assert_allclose((data.astype(np.float64) - zp) * s, row, rtol=0, atol=1e-7)


def test_int8_export_weights_are_gptq_rounded_on_the_grid():
    """The state dict an int8 export builds its graphs from has every encoder Linear weight on its int8 grid,
    rounded with compensation (not to the nearest grid point); nothing else changes."""
    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.smooth import export_weights, smoothed
    from sam2edge.model import Rewrites

    sd = variant_state_dict("synthetic:1", TEST_SMALL)
    smooth = smoothed(sd, TEST_SMALL, Rewrites())[0]
    out = export_weights(sd, TEST_SMALL, "int8")
    linears = [k for k in out if k.startswith("image_encoder.") and k.endswith(".weight") and out[k].dim() == 2]
    assert len(linears) > 10
    for k in linears:
        torch.testing.assert_close(nearest(out[k]), out[k], rtol=1e-6, atol=1e-9, msg=k)
        assert not torch.equal(out[k], nearest(smooth[k])), k
    assert all(torch.equal(out[k], smooth[k]) for k in out if k not in linears)


@pytest.mark.parametrize("seed", [1, 2])
def test_one_calibration_pass_gives_the_smoothed_layers_moments(seed):
    """An int8 export runs its calibration photos once: the second moments GPTQ needs for a layer whose input the
    smoothing shifted and scaled are computed from the original input's (``moved``), and equal those measured by
    running the photos through the smoothed model itself."""
    from dataclasses import replace

    from sam2edge.checks.fidelity.checkpoints import variant_state_dict
    from sam2edge.config import TEST_SMALL
    from sam2edge.export.gptq import MomentRecorder, hessians, moved
    from sam2edge.export.smooth import RangeRecorder, encode_photos, readers, shifts_and_scales, smooth_state_dict
    from sam2edge.model import Rewrites, build_sam2

    sd = variant_state_dict(f"synthetic:{seed}", TEST_SMALL)
    sd["image_encoder.trunk.patch_embed.proj.bias"][5] += 8.0  # a residual channel at a constant offset
    photos = ("horse.png",)

    def model(weights):
        m = build_sam2(TEST_SMALL, replace(Rewrites(), qkv="fused"))
        m.load_state_dict(weights)
        return m.eval()

    plain = model(sd)
    ranges, moments = RangeRecorder(plain), MomentRecorder(plain)
    with torch.no_grad():
        encode_photos(plain, TEST_SMALL, photos, ranges.hooks + moments.hooks)
    m = moments.moments()
    measured = hessians(model(smooth_state_dict(sd, ranges.ranges())[0]), TEST_SMALL, photos)
    checked = 0
    for key, (d, s) in shifts_and_scales(sd, ranges.ranges()).items():
        for name in readers(sd, key):
            want = measured[name]
            torch.testing.assert_close(moved(*m[name], d, s), want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
            checked += 1
    assert checked >= 3 * len(plain.image_encoder.trunk.blocks)  # qkv, mlp.layers.0 and attn.proj of every block


def test_onnx_u8_file_stores_the_rounded_weights_unchanged(tmp_path):
    """encoder.onnx's u8 weights are the symmetric s8 codes + 128 (zero point 128): dequantised they are the
    GPTQ-rounded weights themselves; onnxruntime's asymmetric QUInt8 would have rounded them again."""
    import onnx
    from onnx import numpy_helper

    from sam2edge.export.onnx_int8 import quantize_int8

    w, x, h = _layer(3)
    q = rounded(w, h)
    lin = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(q)
    src = tmp_path / "fp32.onnx"
    torch.onnx.export(lin, (x[None, :16],), str(src), input_names=["x"], dynamo=False)
    got = {}
    for form in ("u8", "u8-asymmetric"):
        dst = tmp_path / f"{form}.onnx"
        quantize_int8(src, dst, form)
        g = onnx.load(str(dst)).graph
        inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        (node,) = [n for n in g.node if n.op_type == "MatMulInteger"]
        codes, zero = inits[node.input[1]], inits[node.input[3]]
        scale_name = node.input[1].removesuffix("_quantized") + "_scale"
        got[form] = ((codes.astype(np.float64) - zero) * inits[scale_name]).T  # (out, in)
        if form == "u8":
            assert codes.dtype == np.uint8 and set(np.unique(zero)) == {128}
    np.testing.assert_allclose(got["u8"], q.numpy(), rtol=0, atol=1e-7)
    assert np.abs(got["u8-asymmetric"] - q.numpy()).max() > 1e-5  # the row's own grid moves them


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_act_order_rounds_the_largest_inputs_first_and_moves_the_output_less(seed):
    """Inputs with a few channels far larger than the rest (what smoothing leaves behind on outlier weights):
    rounding those columns first, while every other column can still take their error, beats the natural order."""
    w, x, _h = _layer(seed)
    g = torch.Generator().manual_seed(100 + seed)
    x = x * torch.where(torch.rand(x.shape[1], generator=g) < 0.1, 12.0, 1.0)  # ~10% of the channels 12x larger
    h = (x.double().T @ x.double()) / x.shape[0]
    ordered, natural = rounded(w, h), rounded(w, h, act_order=False)
    torch.testing.assert_close(nearest(ordered), ordered, rtol=1e-6, atol=1e-9)  # still on the targets' grid
    assert output_error(w, ordered, h) < 0.5 * output_error(w, natural, h)
