"""LiteRT export, graph lint and LiteRT backend (small config; one conversion per session).

The bundle is exported once per session through the CLI (``sam2edge export --target litert --config test-small``,
the session fixture ``small_bundle``);
parity is measured against the eager model with upstream's operations on a real photo.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sam2edge.bundle import load_card, validate_fidelity
from sam2edge.checks.fidelity import mask_iou, photo
from sam2edge.checks.tflite.lint import BANNED, lint_file
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.model import Rewrites, build_sam2
from sam2edge.runtime.backends.litert import CARD_CONST_FILE, LiteRTBackend, read_tables
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.prompts import encode_points, prompt_tables
from sam2edge.weights import load_weights

pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

CLEAN_VERDICT = "banned ops = NONE, >4-D tensors = 0"
K = 8  # default token slots


@pytest.fixture(scope="module")
def bundle(small_bundle) -> Path:
    """The session's test-small fp32 LiteRT bundle (``sam2edge export --target litert --config test-small``,
    conftest ``small_bundle``: exported once, shared with tests/test_everything.py); tests only read it."""
    return small_bundle("litert")


@pytest.fixture(scope="module")
def small_model():
    sd, _ = load_weights(None, TEST_SMALL)
    model = build_sam2(TEST_SMALL, Rewrites())
    model.load_state_dict(sd)
    return model


@pytest.fixture(scope="module")
def predictors(bundle):
    """(eager with upstream's operations, LiteRT) predictors with the astronaut photo set."""
    ref = Sam2Predictor.from_checkpoint(None, TEST_SMALL, quiet=True)
    test = Sam2Predictor.from_export(bundle)
    img = photo("astronaut.png")
    ref.set_image(img)
    test.set_image(img)
    return ref, test


# ---- export --------------------------------------------------------------------------------------


def test_export_writes_a_verified_bundle(bundle):
    card = load_card(bundle)
    assert card["target"] == "litert" and card["precision"] == "fp32" and card["resolution"] == 256
    assert card["status"] == "shippable" and card["extra"]["gpu_clean"] is True
    files = {a["file"]: a["role"] for a in card["artifacts"]}
    models = {f for f, r in files.items() if r != "prompt-table"}
    assert models == {
        "encoder.tflite",
        "decoder.tflite",
        "mask_encoder.tflite",
        "decoder_cpu.tflite",
        "decoder_prep.tflite",
        "decoder_batched.tflite",
    }
    assert files["decoder_cpu.tflite"] == "decoder-cpu" and files["decoder_batched.tflite"] == "decoder-batched"
    assert files["decoder_prep.tflite"] == "decoder-prep"
    assert all((bundle / f).is_file() for f in files)
    fid = card["fidelity"]
    assert fid["passed"] and fid["end_to_end"]["clicks"] >= 40
    assert min(v["cosine"] for v in fid["outputs"].values()) >= 0.99999
    # the GPU decoder is measured too (the CPU runtime runs decoder_cpu.tflite), with the same bars
    gpu = fid["checks"]["gpu_decoder_fidelity"]
    assert gpu["decoder"] == "decoder.tflite" and not gpu["failures"] and gpu["end_to_end"]["clicks"] >= 40
    assert min(v["cosine"] for v in gpu["outputs"].values()) >= 0.99999
    assert set(fid["outputs"]) >= {"encoder.image_embed", "decoder.masks", "mask_encoder.dense_prompt"}
    assert validate_fidelity(json.loads((bundle / "fidelity.json").read_text())) == fid  # the one schema
    io = card["extra"]["io"]["decoder.tflite"]
    shapes = {t["name"]: t["shape"] for t in io["inputs"]}
    assert shapes == {
        "image_embeddings": [1, 32, 16, 16],
        "feat_s0": [1, 4, 64, 64],
        "feat_s1": [1, 8, 32, 32],
        "sparse_prompt": [1, K, 32],
        "sparse_valid": [1, K],
        "dense_prompt": [1, 32, 16, 16],
    }
    assert sorted(t["position"] for t in io["inputs"]) == list(range(6))
    # the CPU decoder is given the first layer's image projections (HW x Ci each) by the prep graph
    hw, ci = 16 * 16, 32 // TEST_SMALL.attention_downsample_rate
    projections = {n: [1, hw, ci] for n in ("image_q", "image_k", "image_v")}
    cpu_io, prep_io = card["extra"]["io"]["decoder_cpu.tflite"], card["extra"]["io"]["decoder_prep.tflite"]
    assert {t["name"]: t["shape"] for t in cpu_io["inputs"]} == shapes | projections
    assert {t["name"]: t["shape"] for t in prep_io["outputs"]} == projections
    assert {t["name"] for t in prep_io["inputs"]} == {"image_embeddings", "dense_prompt"}
    outs = {t["name"]: t["shape"] for t in io["outputs"]}
    assert outs == {
        "masks": [1, 3, 64, 64],
        "iou_scores": [1, 3],
        "single_mask": [1, 1, 64, 64],
        "single_iou": [1, 1],
        "object_score": [1, 1],
    }


def test_host_tables_match_the_model(bundle, small_model):
    ref = prompt_tables(small_model)
    got = read_tables(bundle, TEST_SMALL.d_model)
    for key, arr in ref.items():
        np.testing.assert_array_equal(got[key], arr)
    c = TEST_SMALL.d_model
    const = np.fromfile(bundle / CARD_CONST_FILE, "<f4")
    posmat, pe1, nap = np.split(const, [c, 2 * c])  # card-001 layout: posmat [2,C/2] | point_embed[1] | not_a_point
    np.testing.assert_array_equal(posmat.reshape(2, c // 2), ref["gaussian"])
    np.testing.assert_array_equal(pe1, ref["point_embed"][1])
    np.testing.assert_array_equal(nap, ref["not_a_point"])
    coords = np.array([[10.0, 200.5], [33.0, 7.0], [128.0, 250.0], [0.0, 0.0]], np.float32)
    labels = np.array([2, 3, 0, -1])
    tokens, valid = encode_points(coords, labels, got, TEST_SMALL.image_size, K)
    with torch.no_grad():
        pe = small_model.sam_prompt_encoder
        eager = pe.embed_points(torch.from_numpy(coords)[None], torch.from_numpy(labels)[None])
    np.testing.assert_allclose(tokens[0, :4], eager[0].numpy(), atol=2e-6)
    assert valid.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]] and not tokens[0, 4:].any()


# ---- lint ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["encoder.tflite", "decoder.tflite", "mask_encoder.tflite"])
def test_lint_verdict_clean(bundle, name, capsys):
    assert main(["lint", str(bundle / name)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == CLEAN_VERDICT
    assert main(["lint", "--json", str(bundle / name)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == CLEAN_VERDICT and doc["clean"] and doc["nodes"] == sum(doc["ops"].values())


def test_op_presence_and_absence(bundle):
    enc, dec = lint_file(bundle / "encoder.tflite"), lint_file(bundle / "decoder.tflite")
    for r in (enc, dec):
        assert r.max_rank <= 4 and not r.high_rank and not r.banned
        assert not set(r.ops) & set(BANNED) and not any(op.startswith(("CUSTOM", "STABLEHLO_")) for op in r.ops)
    assert {"CONV_2D", "MAX_POOL_2D", "BATCH_MATMUL", "SOFTMAX", "FULLY_CONNECTED"} <= set(enc.ops)
    assert {"CONV_2D", "BATCH_MATMUL", "SOFTMAX", "FULLY_CONNECTED"} <= set(dec.ops)
    assert "TRANSPOSE_CONV" not in dec.ops and "ERF" not in enc.ops  # zero-stuff conv, no erf GELU
    cpu = lint_file(bundle / "decoder_cpu.tflite")  # transposed conv as a GEMM: fewer MACs, CPU only
    assert "TRANSPOSE_CONV" not in cpu.ops and "PAD" not in cpu.ops and cpu.nodes < dec.nodes
    assert {t.name for t in dec.signatures["serving_default"]["inputs"]} >= {"sparse_prompt", "sparse_valid"}


class _Dirty(nn.Module):
    """A 5-D reshape and a ConvTranspose2d: two things a mobile GPU rejects."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.w = nn.Parameter(torch.randn(1, 2, 4, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)  # (1, 8, 16, 16)
        z = y.reshape(1, 2, 4, 256, 1) * self.w  # (1, 2, 4, 256, 1): rank 5
        return z.sum(1).reshape(1, 4, 16, 16)


@pytest.fixture(scope="module")
def dirty_tflite(tmp_path_factory) -> Path:
    import litert_torch

    path = tmp_path_factory.mktemp("dirty") / "dirty.tflite"
    litert_torch.convert(_Dirty().eval(), (torch.randn(1, 8, 8, 8),)).export(str(path))
    return path


def test_lint_reports_a_dirty_graph(dirty_tflite, capsys):
    from sam2edge.export.litert import lint_graphs

    r = lint_file(dirty_tflite)
    assert "TRANSPOSE_CONV" in r.banned and r.max_rank == 5 and r.high_rank
    assert r.verdict == f"banned ops = TRANSPOSE_CONV x1, >4-D tensors = {len(r.high_rank)}"
    assert main(["lint", str(dirty_tflite)]) == 1
    out = capsys.readouterr().out
    assert "GPU problem: TRANSPOSE_CONV" in out and "above rank 4" in out
    with pytest.raises(UserError, match="TRANSPOSE_CONV"):
        lint_graphs(dirty_tflite.parent, [dirty_tflite.name], allow_dirty=False)
    assert not lint_graphs(dirty_tflite.parent, [dirty_tflite.name], allow_dirty=True)[dirty_tflite.name].clean


# ---- LiteRT vs eager, per prompt kind ------------------------------------------------------------

PROMPTS = {
    "point": dict(point_coords=[[270, 180]], point_labels=[1]),
    "points+negatives": dict(point_coords=[[270, 180], [150, 400], [400, 90]], point_labels=[1, 0, 0]),
    "box": dict(box=[100, 80, 400, 450], multimask_output=False),
    "box+points": dict(box=[100, 80, 400, 450], point_coords=[[250, 250], [120, 420]], point_labels=[1, 0]),
}


def _check_parity(ref_out, test_out):
    (rm, rs, rl), (tm, ts, tl) = ref_out, test_out
    assert rm.shape == tm.shape and rl.shape == tl.shape
    a, b = tl.astype(np.float64).ravel(), rl.astype(np.float64).ravel()
    cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    assert cos >= 0.99999, cos
    np.testing.assert_allclose(tl, rl, atol=1e-3 * np.abs(rl).max())
    np.testing.assert_allclose(ts, rs, atol=1e-4)
    for k in range(len(rm)):
        assert mask_iou(tm[k], rm[k]) >= 0.999
    assert 0.02 < rm[int(np.argmax(rs))].mean() < 0.98  # a real, non-degenerate mask


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_litert_matches_eager(predictors, kind):
    ref, test = predictors
    kw = {k: np.asarray(v, np.float32) if k != "multimask_output" else v for k, v in PROMPTS[kind].items()}
    _check_parity(ref.predict(**kw), test.predict(**kw))


def test_litert_matches_eager_with_mask_input(predictors):
    ref, test = predictors
    _, scores, low = ref.predict(point_coords=np.array([[270, 180]]), point_labels=np.array([1]))
    prev = low[int(np.argmax(scores))][None]  # 1x4ex4e logits of the best candidate
    kw = dict(point_coords=np.array([[300, 200]]), point_labels=np.array([1]), mask_input=prev, multimask_output=False)
    ref_out, test_out = ref.predict(**kw), test.predict(**kw)
    _check_parity(ref_out, test_out)
    plain = ref.predict(point_coords=np.array([[300, 200]]), point_labels=np.array([1]), multimask_output=False)
    assert np.abs(plain[2] - ref_out[2]).max() > 1e-3  # the mask input really changes the answer


def test_cpu_runtime_loads_the_cpu_decoder_and_both_decoders_agree(bundle, predictors):
    """The bundle carries a decoder per accelerator; this CPU runtime picks decoder_cpu.tflite at load, and
    the GPU-clean decoder.tflite gives the same answers (both are measured against eager at export)."""
    from sam2edge.runtime.backends.litert import LiteRTBackend

    _, test = predictors
    cpu = test.backend
    assert cpu.decoder_file == "decoder_cpu.tflite"
    gpu = LiteRTBackend(bundle, cpu.cfg, cpu.num_tokens, decoder="decoder.tflite")
    coords = np.array([[[40.0, 60.0], [200.0, 100.0], [0.0, 0.0]]], np.float32)
    labels = np.array([[1, 0, -1]], np.float32)
    a, b = cpu.decode(test._features, coords, labels, None), gpu.decode(test._features, coords, labels, None)
    for x, y in ((a.masks, b.masks), (a.iou, b.iou), (a.single_mask, b.single_mask)):
        x, y = x.ravel().astype(np.float64), y.ravel().astype(np.float64)
        assert x @ y / np.linalg.norm(x) / np.linalg.norm(y) >= 0.99999


def test_cpu_decoder_prep_runs_once_per_image_and_per_mask_input(predictors):
    """decoder_prep.tflite runs in encode (set_image), not in a click; a mask input's dense prompt changes the
    projections, so that click runs it once more; Features made elsewhere (stored embeddings) get it once."""
    from sam2edge.runtime.backends import Features

    _, test = predictors
    cpu = test.backend
    calls = []
    prep = cpu._prep
    cpu._prep = lambda **kw: calls.append(1) or prep(**kw)
    try:
        image = np.random.default_rng(0).standard_normal((1, 3, 256, 256)).astype(np.float32)
        feats = cpu.encode(image)
        assert len(calls) == 1 and list(feats.prepared) == [str((cpu.folder / "decoder_prep.tflite").resolve())]
        coords, labels = np.array([[[40.0, 60.0], [0.0, 0.0]]], np.float32), np.array([[1, -1]], np.float32)
        first = cpu.decode(feats, coords, labels, None)
        cpu.decode(feats, coords + 9.0, labels, None)
        assert len(calls) == 1
        cpu.decode(feats, coords, labels, np.ones((1, 1, 64, 64), np.float32))
        assert len(calls) == 2
        bare = Features(feats.image_embed, feats.feat_s0, feats.feat_s1)  # e.g. read back from an embeddings file
        again = cpu.decode(bare, coords, labels, None)
        cpu.decode(bare, coords, labels, None)
        assert len(calls) == 3
        np.testing.assert_array_equal(again.masks, first.masks)
    finally:
        cpu._prep = prep


def test_too_many_prompt_points_is_a_clear_error(predictors):
    _, test = predictors
    with pytest.raises(UserError, match="slots"):
        test.predict(point_coords=np.full((K, 2), 100.0), point_labels=np.ones(K))


# ---- bad input -----------------------------------------------------------------------------------


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_lint_bad_files_exit_2(tmp_path, bundle, capsys):
    text = tmp_path / "notes.tflite"
    text.write_text("not a model\n")
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(range(256)) * 4)
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes((bundle / "decoder.tflite").read_bytes()[:4000])
    for path in (text, garbage, truncated, tmp_path / "missing.tflite"):
        assert main(["lint", str(path)]) == 2
        assert str(path) in _one_line_error(capsys)


def test_segment_runs_a_litert_bundle(tmp_path, bundle, capsys):
    args = [
        "segment",
        "sample:astronaut.png",
        "--point",
        "270,180",
        "--model",
        str(bundle),
        "--out",
        str(tmp_path / "m.png"),
        "--overlay",
        str(tmp_path / "o.png"),
    ]
    assert main(args) == 0
    assert (tmp_path / "m.png").is_file() and "score:" in capsys.readouterr().out


def test_model_bad_bundle_exit_2(tmp_path, bundle, capsys):
    out = ["--out", str(tmp_path / "m.png"), "--overlay", str(tmp_path / "o.png")]
    segment = ["segment", "sample:astronaut.png", "--point", "100,100", *out]
    assert main([*segment, "--model", str(bundle / "decoder.tflite")]) == 2  # a file, not a bundle
    _one_line_error(capsys)
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    (bad / "encoder.tflite").write_bytes(b"garbage" * 100)
    assert main([*segment, "--model", str(bad)]) == 2
    assert "encoder.tflite" in _one_line_error(capsys)
    with pytest.raises(UserError, match="not a .tflite"):  # the runtime's own check, card aside
        LiteRTBackend(bad, TEST_SMALL, K)


def test_export_bad_arguments_exit_2(tmp_path, capsys):
    webgpu = ["export", "--target", "executorch-webgpu", "--config", "test-small", "--precision", "int8"]
    assert main([*webgpu, "--out", str(tmp_path / "b")]) == 2
    assert "offers --precision fp32" in _one_line_error(capsys)
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "thesis.txt").write_text("keep me")
    assert main(["export", "--target", "litert", "--config", "test-small", "--out", str(tmp_path / "occupied")]) == 2
    _one_line_error(capsys)
    assert (tmp_path / "occupied" / "thesis.txt").read_text() == "keep me"
    assert main(["export", "--target", "nope", "--out", str(tmp_path / "c")]) == 2
    _one_line_error(capsys)


# ---- fp16 (slow: one more conversion) ------------------------------------------------------------


@pytest.mark.slow
def test_fp16_export_small(tmp_path):
    out = tmp_path / "fp16"
    args = ["export", "--target", "litert", "--config", "test-small", "--precision", "fp16", "--out", str(out)]
    assert main(args) == 0
    card = load_card(out)
    assert card["status"] == "shippable" and card["fidelity"]["end_to_end"]["iou_worst"] >= 0.99
    r = lint_file(out / "encoder.tflite")
    assert r.clean and r.weight_dtypes.get("FLOAT16", 0) > 0
    for f in ("decoder.tflite", "decoder_cpu.tflite", "mask_encoder.tflite"):  # fp32 kept (export.kept)
        assert "FLOAT16" not in lint_file(out / f).weight_dtypes, f
    assert "decoder.tflite" in " ".join(card["extra"]["fp32_kept"])


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_reduced_precision_leaves_the_image_decoders_fp32(precision):
    """fp16 rounds the encoder's and the video graphs' weights, int8 quantises the encoder only; the prompt-side
    graphs convert in fp32 at every precision (measured: fp16 decoder weights cost large its fp16 bar)."""
    from types import SimpleNamespace

    from sam2edge.export.litert import IMAGE_DECODER_FILES, _precision
    from sam2edge.runtime.backends.litert import ENCODER_FILE
    from sam2edge.runtime.video.bundle import VIDEO_GRAPHS

    job = SimpleNamespace(precision=precision)
    assert _precision(job, ENCODER_FILE) == precision
    assert {_precision(job, f) for f in IMAGE_DECODER_FILES} == {"fp32"}
    video = {_precision(job, f"{VIDEO_GRAPHS[role][0]}.tflite") for role in VIDEO_GRAPHS}
    assert video == {"fp32" if precision == "int8" else precision}
