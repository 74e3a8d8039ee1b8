"""ExecuTorch XNNPACK export, small config: every precision exported, run and compared with eager.

Each bundle is lowered once per session (module fixtures): ExecuTorch lowering takes about a minute per
program on two cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("executorch")

from sam2edge.bundle import load_card, validate_fidelity  # noqa: E402
from sam2edge.checks.fidelity import mask_iou, photo  # noqa: E402
from sam2edge.checks.fidelity.bars import BARS  # noqa: E402
from sam2edge.config import TEST_SMALL  # noqa: E402
from sam2edge.errors import UserError  # noqa: E402
from sam2edge.export.executorch import FP32_COSINE, SIZE_RATIO_MAX  # noqa: E402
from sam2edge.export.pipeline import run_export  # noqa: E402
from sam2edge.runtime.backends.executorch import MAX_POINTS, ExecuTorchBackend, pad_prompt  # noqa: E402
from sam2edge.runtime.predictor import Sam2Predictor  # noqa: E402

CFG = TEST_SMALL
# operations that must never be left outside the delegate (LayerNorm, attention, GELU at fp32, the FPN resize)
HOT_OPS = ("mean", "sum", "bmm", "mm", "softmax", "native_layer_norm", "gelu", "expand_copy", "upsample_nearest2d")


def _export(tmp_path_factory, precision: str) -> tuple:
    """A bundle at ``precision`` without the batched decoder (batch 0; fp32's, in ``fp32``, has it)."""
    out = tmp_path_factory.mktemp(f"et_{precision}") / "bundle"
    card = run_export("executorch", "test-small", precision, out, force=True, clicks=40, options={"batch": 0})
    return out, card


@pytest.fixture(scope="module")
def fp32(small_bundle):
    """The session's test-small fp32 ExecuTorch bundle (CLI export, 40 clicks; conftest ``small_bundle``),
    shared with tests/test_everything.py's batched-decoder tests; tests only read it."""
    out = small_bundle("executorch")
    return out, load_card(out)


@pytest.fixture(scope="module")
def eager():
    return Sam2Predictor.from_checkpoint(None, CFG, quiet=True)


def test_fp32_bundle_parity_size_delegation(fp32):
    out, card = fp32
    assert card["status"] == "shippable", card["fidelity"]["failures"]
    assert validate_fidelity(json.loads((out / "fidelity.json").read_text())) == card["fidelity"]  # one schema
    for name, m in card["fidelity"]["outputs"].items():
        assert m["cosine"] >= FP32_COSINE, name
    assert card["fidelity"]["end_to_end"]["clicks"] >= 40
    assert card["fidelity"]["end_to_end"]["iou_worst"] >= 0.999  # a pixel at |logit| ~ 1e-6 may flip
    for name, s in card["extra"]["sizes"].items():
        assert s["bytes"] == (out / name).stat().st_size
        assert s["bytes"] <= s["limit_bytes"] and s["limit_bytes"] <= SIZE_RATIO_MAX * s["parameter_bytes"] + 256 * 1024
    enc = card["extra"]["delegation"]["encoder.pte"]
    assert enc["delegates"] == 1 and not set(enc["outside_delegate"]) & set(HOT_OPS), enc
    dec = card["extra"]["delegation"]["decoder.pte"]  # outside: label logic / single-mask choice on a few scalars
    assert not set(dec["outside_delegate"]) & (set(HOT_OPS) - {"expand_copy"}), dec
    bat = card["extra"]["delegation"]["decoder_batched.pte"]  # the same decoder with B rows: the same leftovers
    assert not set(bat["outside_delegate"]) & (set(HOT_OPS) - {"expand_copy"}), bat
    why = card["extra"]["outside_delegate_why"]["decoder_batched.pte"]
    assert set(why) == set(bat["outside_delegate"]) and not [op for op, w in why.items() if "not investigated" in w]


@pytest.mark.parametrize("kind", ["points1", "points3", "points15+pad", "box", "box+point"])
def test_fp32_prompts_match_eager(fp32, eager, kind):
    """N = 1 click (+pad), 3 clicks (+pad), 15 clicks + pad = all 16 slots, a box, a box + click."""
    out, _ = fp32
    pred = Sam2Predictor.from_export(out)
    img = photo("chelsea.png")
    h, w = img.shape[:2]
    rng = np.random.default_rng(3)
    n = {"points1": 1, "points3": 3, "points15+pad": MAX_POINTS - 1}.get(kind, 1)
    pts = rng.uniform([0.1 * w, 0.1 * h], [0.9 * w, 0.9 * h], size=(n, 2)).astype(np.float32)
    labels = (np.arange(n) % 3 != 2).astype(np.int64)
    kw = {"point_coords": pts, "point_labels": labels} if kind.startswith("points") else {}
    if kind.startswith("box"):
        kw["box"] = np.array([0.2 * w, 0.2 * h, 0.7 * w, 0.8 * h], np.float32)
        if kind == "box+point":
            kw.update(point_coords=pts[:1], point_labels=labels[:1])
    pred.set_image(img)
    eager.set_image(img)
    tm, ts, tl = pred.predict(**kw, multimask_output=True)
    rm, rs, rl = eager.predict(**kw, multimask_output=True)
    np.testing.assert_allclose(tl, rl, atol=2e-4 * max(1.0, np.abs(rl).max()))
    np.testing.assert_allclose(ts, rs, atol=1e-5)
    assert min(mask_iou(tm[k], rm[k]) for k in range(3)) >= 0.999


@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=pytest.mark.slow), "int8"])
def test_lower_precisions_bar_and_size(tmp_path_factory, precision):
    out, card = _export(tmp_path_factory, precision)
    e2e = card["fidelity"]["end_to_end"]
    assert e2e["clicks"] >= 40 and 0.0 <= e2e["iou_worst"] <= e2e["iou_median"] <= 1.0
    bars = BARS[precision]  # the one bar table (export and verify)
    passed = e2e["iou_worst"] >= bars["min_iou_worst"] and e2e["iou_median"] >= bars.get("min_iou_median", 0.0)
    assert card["status"] == ("shippable" if passed else "rejected"), (card["status"], e2e)
    # Expected: both precisions meet their bar with these weights (int8 measured by this export at test-small,
    # 40 clicks: worst 0.9934 against the bar 0.95, median 0.9980). A bundle that misses it fails here.
    assert passed and card["status"] == "shippable", (precision, card["status"], e2e, bars)
    for name, s in card["extra"]["sizes"].items():
        assert s["bytes"] <= s["limit_bytes"], (name, s)
    # the bundle runs, and its encoder stays close to eager fp32
    backend = ExecuTorchBackend.from_bundle(out)
    x = np.random.default_rng(0).standard_normal((1, 3, CFG.image_size, CFG.image_size)).astype(np.float32)
    ref = Sam2Predictor.from_checkpoint(None, CFG, quiet=True).backend.encode(x)
    got = backend.encode(x)
    cos = float(
        np.dot(got.image_embed.ravel(), ref.image_embed.ravel())
        / np.linalg.norm(got.image_embed)
        / np.linalg.norm(ref.image_embed)
    )
    assert cos > (0.999 if precision == "fp16" else 0.95), cos
    if precision == "fp16":
        assert e2e["iou_worst"] >= 0.99, e2e


def test_int8_quantises_the_linear_layers_only():
    """Dynamic int8 covers the Linear layers (card: ``encoder outside the Linear layers`` stays fp32): a
    quantised convolution took XNNPACK's dynamic-quant layout path and broke the encoder's program at run
    time. One per-channel weight dequantisation per Linear, none for the convolution, and the
    program runs close to eager. (A convolution straight into a quantised Linear fails XNNPACK's lowering:
    "Weight and Input should both be quantized"; the model has a norm between them everywhere.)"""
    from sam2edge.export.executorch import REWRITES, _quantize_int8, lower_program
    from sam2edge.model.layers import LayerNorm

    class ConvLinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm = torch.nn.Conv2d(16, 32, 1), LayerNorm(32, 1e-6, REWRITES)
            self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):  # as the patch embedding into a Hiera block
            return self.fc2(self.fc1(self.norm(self.conv(x).permute(0, 2, 3, 1))))  # (1, H, W, 32)

    torch.manual_seed(0)
    module, args = ConvLinear().eval(), (torch.randn(1, 16, 8, 8),)
    quantised = _quantize_int8(module, args)
    targets = [str(n.target) for n in quantised.graph.nodes if n.op == "call_function"]
    assert sum("dequantize_per_channel" in t for t in targets) == 2, targets
    assert any("convolution" in t or "conv2d" in t for t in targets)
    prog, counts = lower_program(module, args, "int8", "encoder")
    assert counts.delegates == 1 and not counts.portable_ops, counts
    from executorch.runtime import Runtime

    out = Runtime.get().load_program(prog.buffer).load_method("forward").execute(list(args))[0]
    want = module(*args)
    assert float((out - want).abs().max() / want.abs().max()) < 0.05


def test_xnnpack_stores_convolutions_fp32_in_fp16_programs():
    """The size limit's storage rule (``CONV_STORED_BYTES``): an fp16 program of a 3x3 convolution and a
    Linear is as large as the conv's tensors at fp32 plus the Linear's at fp16, and larger than all at fp16.
    If ExecuTorch starts storing fp16 convolutions as fp16, this fails and the limit must tighten."""
    from sam2edge.export.executorch import CONV_STORED_BYTES, GRAPH_BYTES_PER_OP, lower_program, program_tensor_bytes

    class ConvLinear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(64, 64, 3, padding=1)  # 36,928 tensors' elements
            self.fc = torch.nn.Linear(64, 256)  # 16,640

        def forward(self, x):
            return self.fc(self.conv(x).permute(0, 2, 3, 1))  # (1, H, W, 256)

    module, args = ConvLinear().half().eval(), (torch.randn(1, 64, 8, 8).half(),)
    prog, counts = lower_program(module, args, "fp16", "memory-encoder")
    stored = program_tensor_bytes(module, args)
    conv_elems, fc_elems = 64 * 64 * 9 + 64, 256 * 64 + 256
    assert CONV_STORED_BYTES == 4 and stored == 4 * conv_elems + 2 * fc_elems
    graph = GRAPH_BYTES_PER_OP * counts.total_ops
    assert stored <= len(prog.buffer) <= SIZE_RATIO_MAX * stored + graph
    assert len(prog.buffer) > SIZE_RATIO_MAX * 2 * (conv_elems + fc_elems) + graph


class _Reductions(torch.nn.Module):
    """The model's reductions: a LayerNorm's means over the last dim and LayerNorm2d's over NCHW channels
    (``model.layers``' written-out forms), a sum over a middle dim, a mean without keepdim."""

    @staticmethod
    def _norm(x: torch.Tensor, dim: int) -> torch.Tensor:
        u = x.mean(dim, keepdim=True)
        return (x - u) / torch.sqrt(((x - u) ** 2).mean(dim, keepdim=True) + 1e-6)

    def forward(self, tokens, maps):  # (1, 96, 64), (1, 32, 8, 12)
        return self._norm(tokens, -1), self._norm(maps, 1), tokens.sum(1), maps.mean(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reductions_become_gemms_inside_the_delegate(dtype):
    """``executorch_lower``: every mean / sum over one dim becomes one GEMM with a constant column (no
    reduction left for XNNPACK's transposed global pooling), one column per (C, value, dtype), all inside one
    delegate, and the program equals eager within the dtype's rounding."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.runtime import Runtime

    from sam2edge.export.executorch_lower import export_legalized, lower

    gen = torch.Generator().manual_seed(0)
    module = _Reductions().eval()
    args = (torch.randn(1, 96, 64, generator=gen).to(dtype), (torch.randn(1, 32, 8, 12, generator=gen) * 3).to(dtype))
    legal = export_legalized(module, args)
    ops = [str(n.target) for n in legal.graph.nodes if n.op == "call_function"]
    assert not [o for o in ops if "mean" in o or "sum" in o], ops
    assert ops.count("aten.linear.default") == 6  # two means per norm, the sum, the mean
    columns = sorted(k for k in (*legal.state_dict, *legal.constants) if k.startswith("_xnn_reduce_"))
    kind = str(dtype).split(".")[-1]  # one column per (C, value, dtype): 4 for the 6 GEMMs
    want_columns = ((12, "mean"), (32, "mean"), (64, "mean"), (96, "ones"))
    assert columns == [f"_xnn_reduce_{c}_{v}_{kind}" for c, v in want_columns], columns
    prog, census = lower(module, args, [XnnpackPartitioner()])
    counts = census.as_dict()
    # left outside: the non-keepdim outputs' squeeze views (fp16: scalar constants' casts too)
    assert counts["delegates"] == 1 and set(counts["outside_delegate"]) <= {"dim_order_ops", "squeeze_copy"}, counts
    got = Runtime.get().load_program(prog.buffer).load_method("forward").execute(list(args))
    with torch.no_grad():
        want = module(*(a.float() for a in args))
    tol = 1e-5 if dtype == torch.float32 else 4e-3  # fp32 summation order / fp16 rounding
    for g, w in zip(got, want):
        assert g.shape == w.shape and (g.float() - w).abs().max() <= tol * w.abs().max(), (g.shape, dtype)


def test_lowering_with_shared_provenance_is_byte_identical():
    """``lower`` shares torch.fx's provenance records instead of deep-copying them per pass: the program is byte for
    byte the one a plain lowering gives, and NodeSource is left as it was."""
    import copy

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torch.fx.traceback import NodeSource

    from sam2edge.export.executorch_lower import _lower, lower
    from sam2edge.export.provenance import shared_provenance

    gen = torch.Generator().manual_seed(1)
    module = _Reductions().eval()
    args = (torch.randn(1, 96, 64, generator=gen), torch.randn(1, 32, 8, 12, generator=gen) * 3)
    plain, plain_counts = _lower(module, args, [XnnpackPartitioner()], True)
    shared, shared_counts = lower(module, args, [XnnpackPartitioner()])
    assert shared.buffer == plain.buffer and shared_counts == plain_counts
    assert "__deepcopy__" not in NodeSource.__dict__  # restored
    record = NodeSource(None, "p")
    with shared_provenance():
        assert copy.deepcopy([record])[0] is record
    assert copy.deepcopy([record])[0] is not record


class _Counted:
    """A program's ``execute``, counted."""

    def __init__(self, method) -> None:
        self.method, self.calls = method, 0

    def execute(self, inputs):
        self.calls += 1
        return self.method.execute(inputs)


def test_runtime_runs_the_prep_once_per_image_and_a_given_decoder_per_click(fp32):
    """decoder_prep.pte runs in encode (set_image), not in a click; a mask input changes the projections, so
    that click runs it once more; Features made elsewhere get it on their first click. decoder_cpu.pte (given
    the projections) answers what decoder.pte (card 002's contract program) answers, for every prompt kind."""
    from sam2edge.runtime.backends import Features

    out, card = fp32
    roles = {a["file"]: a.get("role") for a in card["artifacts"]}
    assert roles["decoder_prep.pte"] == "decoder-prep" and roles["decoder_cpu.pte"] == "decoder-cpu"
    contract = card["fidelity"]["checks"]["contract_decoder"]  # decoder.pte measured like the bundle
    assert contract["decoder"] == "decoder.pte" and not contract["failures"]
    assert min(m["cosine"] for m in contract["outputs"].values()) >= FP32_COSINE
    backend = ExecuTorchBackend.from_bundle(out)
    assert backend.decoder_file == "decoder_cpu.pte"
    one = ExecuTorchBackend(out, CFG, decoder="decoder.pte")
    assert one.prep is None
    backend.prep = prep = _Counted(backend.prep)
    image = np.random.default_rng(0).standard_normal((1, 3, CFG.image_size, CFG.image_size)).astype(np.float32)
    feats = backend.encode(image)
    assert prep.calls == 1 and len(feats.prepared) == 1
    mask = np.random.default_rng(1).standard_normal((1, 1, 64, 64)).astype(np.float32)
    prompts = [  # a click + pad, two clicks + pad, a box, a box + click; the last with a mask input
        (np.array([[[40.0, 60.0], [0.0, 0.0]]]), np.array([[1, -1]]), None),
        (np.array([[[40.0, 60.0], [200.0, 90.0], [0.0, 0.0]]]), np.array([[1, 0, -1]]), None),
        (np.array([[[30.0, 40.0], [180.0, 220.0]]]), np.array([[2, 3]]), None),
        (np.array([[[30.0, 40.0], [180.0, 220.0], [100.0, 120.0]]]), np.array([[2, 3, 1]]), mask),
    ]
    for coords, labels, m in prompts:
        got, ref = backend.decode(feats, coords, labels, m), one.decode(feats, coords, labels, m)
        for name in ("masks", "iou", "single_mask", "single_iou", "object_score"):
            a, b = getattr(got, name), getattr(ref, name)
            assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max()), name
    assert prep.calls == 2  # the mask-input click only
    bare = Features(feats.image_embed, feats.feat_s0, feats.feat_s1)  # e.g. read back from an embeddings file
    again = backend.decode(bare, *prompts[0][:2], None)
    backend.decode(bare, *prompts[0][:2], None)
    assert prep.calls == 3
    np.testing.assert_array_equal(again.masks, backend.decode(feats, *prompts[0][:2], None).masks)


def test_bad_inputs_one_line_errors(fp32, tmp_path):
    out, _ = fp32
    backend = ExecuTorchBackend.from_bundle(out)
    s = CFG.image_size
    with pytest.raises(UserError, match=r"\[1,3,256,256\]"):
        backend.encode(np.zeros((3, s, s), np.float32))  # wrong rank
    with pytest.raises(UserError, match="at least one point"):
        pad_prompt(np.zeros((1, 0, 2)), np.zeros((1, 0)))
    with pytest.raises(UserError, match="exceed"):
        pad_prompt(np.zeros((1, MAX_POINTS + 1, 2)), np.ones((1, MAX_POINTS + 1)))
    bad = tmp_path / "corrupt"
    shutil.copytree(out, bad)
    (bad / "decoder.pte").write_bytes(b"not a program" * 100)
    with pytest.raises(UserError, match="decoder.pte does not match its size / SHA-256"):  # the bundle check
        ExecuTorchBackend.from_bundle(bad)
    with pytest.raises(UserError, match="not a loadable ExecuTorch program"):  # the runtime's own check
        ExecuTorchBackend(bad, CFG, decoder="decoder.pte")
    # the CLI: one line on stderr, exit 2, no traceback (corrupt .pte; 16 clicks + pad = 17 > 16 slots)
    clicks = [a for i in range(MAX_POINTS) for a in ("--point", f"{20 + 10 * i},{30 + 5 * i}")]
    for bundle, extra in ((bad, ["--point", "100,100"]), (out, clicks)):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "sam2edge",
                "segment",
                "sample:chelsea.png",
                "--model",
                str(bundle),
                *extra,
                "--out",
                str(tmp_path / "m.png"),
                "--overlay",
                str(tmp_path / "o.png"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2, r.stderr[-500:]
        # one error line; the ExecuTorch runtime's own C++ notices at its start (cpuinfo) print to the same stream
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-500:]


def test_int8_export_of_a_file_that_is_not_a_checkpoint_says_so_alone(tmp_path):
    """``export --target executorch --precision int8`` imports ExecuTorch's and torchao's quantizer stack, whose
    import-time notices (torchao's CUDA kernels, torch's pytree) came before the error: stderr is the error alone."""
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    argv = ["export", "--target", "executorch", "--precision", "int8", "--config", "test-small"]
    argv += ["--checkpoint", str(text), "--out", str(tmp_path / "b")]
    r = subprocess.run([sys.executable, "-m", "sam2edge", *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and not (tmp_path / "b").exists(), r.stderr[-500:]
    assert r.stderr.strip().splitlines() == [
        f"error: cannot read checkpoint {text}: Weights only load failed; the file is truncated or not a "
        "PyTorch/safetensors checkpoint (re-download it)"
    ], r.stderr[-800:]


def test_webgpu_graphs_match_xnnpack_graphs():
    """Card 004's decoder graph (3 slots, double-pad ignored) gives upstream's 2-token click answer exactly."""
    from sam2edge.export.executorch_webgpu import WebGpuDecoderGraph, WebGpuEncoderGraph, host_sparse
    from sam2edge.model import UPSTREAM, build_sam2
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.runtime.prompts import prompt_tables
    from sam2edge.weights import load_weights

    cfg = CFG.at_resolution(512)
    sd, _ = load_weights(None, cfg)
    model = build_sam2(cfg)
    model.load_state_dict(sd)
    ref = EagerBackend.from_state_dict(sd, cfg, UPSTREAM)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 3, 512, 512)).astype(np.float32))
    with torch.no_grad():
        emb, hr0, hr1 = WebGpuEncoderGraph(model)(x)
        f = ref.encode(x.numpy())
        np.testing.assert_allclose(emb.numpy(), f.image_embed, atol=1e-4)
        pe = model.sam_prompt_encoder
        click = ([[200.0, 150.0], [0, 0]], [1.0, -1.0])
        box = ([[50.0, 60.0], [300, 400], [0, 0]], [2.0, 3.0, -1.0])
        for coords, labels in (click, box):
            c, lab = np.array(coords, np.float32), np.array(labels, np.float32)
            sparse = torch.from_numpy(host_sparse(c, lab, prompt_tables(model)))
            m, iou, obj = WebGpuDecoderGraph(model)(emb, pe.image_pe, sparse, pe.no_mask_dense, hr0, hr1)
            r = ref.decode(f, c[None], lab[None], None)
            np.testing.assert_allclose(m.numpy(), r.masks, atol=1e-3)
            np.testing.assert_allclose(iou.numpy().reshape(1, 3), r.iou, atol=1e-5)
            assert m.shape == (1, 3, 128, 128) and iou.shape == (1, 1, 3) and obj.shape == (1, 1, 1)


@pytest.mark.slow  # two Vulkan and two XNNPACK lowerings (2 min on 2 busy cores); in CI: the graphs' parity above
def test_webgpu_bundle_twin_meets_the_bar(tmp_path):
    """Card 004 bundle: WebGPU-lowered programs, tables and manifest; the XNNPACK twin matches upstream (IoU 1.0)."""
    import json

    from sam2edge.export.executorch_webgpu import DECODER_FILE, ENCODER_FILE, export_webgpu
    from sam2edge.model import build_sam2
    from sam2edge.weights import load_weights

    out = tmp_path / "webgpu"
    card = export_webgpu(CFG.at_resolution(512), "test-small", None, out)
    twin = card["fidelity"]["cpu_twin"]
    assert validate_fidelity(json.loads((out / "fidelity.json").read_text())) == card["fidelity"]  # one schema
    assert card["status"] == "shippable" and twin["mask_iou_worst"] == 1.0, twin
    kinds = {p["kind"] for p in twin["prompts"]}
    assert kinds == {"point", "box"} and len(twin["prompts"]) >= 10
    assert card["extra"]["delegation"][DECODER_FILE]["delegates"] >= 1
    manifest = json.loads((out / "manifest.json").read_text())
    listed = set(manifest["files"])
    for name in (ENCODER_FILE, DECODER_FILE, "prompt_img_pos.bin", "prompt_gaussian.bin"):
        assert name in listed and (out / name).is_file(), name
    e = CFG.at_resolution(512).image_embedding_size
    img_pos = np.fromfile(out / "prompt_img_pos.bin", "<f4").reshape(1, -1, e, e)
    model = build_sam2(CFG.at_resolution(512))
    model.load_state_dict(load_weights(None, CFG.at_resolution(512))[0])
    np.testing.assert_array_equal(img_pos, model.sam_prompt_encoder.image_pe.numpy())


def test_int8_size_limit_counts_layers_kept_fp32_at_4_bytes():
    """A Linear the measured selection keeps fp32 is stored fp32 in encoder.pte: the size limit counts it so."""
    from sam2edge.export.executorch import parameter_bytes
    from sam2edge.model import build_sam2

    model = build_sam2(TEST_SMALL)
    name = next(
        n for n, m in model.named_modules() if n.startswith("image_encoder.") and isinstance(m, torch.nn.Linear)
    )
    w = dict(model.named_parameters())[f"{name}.weight"]
    int8, kept = parameter_bytes(model, "int8"), parameter_bytes(model, "int8", (name,))
    assert kept["encoder"] - int8["encoder"] == 4 * w.numel() - (w.numel() + 4 * w.shape[0])
    assert kept["decoder"] == int8["decoder"]
