"""ONNX export + onnxruntime backend vs the eager predictor (upstream's operations), TEST_SMALL.

One export per session (module fixture); every prompt form is compared with the eager predictor on a
real photo: logits to 1e-4 and binary masks equal wherever the reference logit is not within 1e-4 of
the threshold.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from sam2edge.bundle import validate_fidelity
from sam2edge.checks.bench.records import cpu_name
from sam2edge.checks.fidelity import photo
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.export.onnx import export_onnx
from sam2edge.runtime.backends import BACKENDS, EagerBackend
from sam2edge.runtime.backends import onnx as ob
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import MEAN, STD
from sam2edge.weights import synthetic_state_dict

ATOL = 1e-4
SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}


@pytest.fixture(scope="module")
def sd():
    return synthetic_state_dict(TEST_SMALL)


@pytest.fixture(scope="module")
def bundle(small_bundle):
    """``sam2edge export --target onnx --config test-small --precision fp32`` (the synthetic weights, ``sd``),
    once per session (shared with tests/test_everything.py); no test here writes into it."""
    return small_bundle("onnx")


@pytest.fixture(scope="module")
def pair(bundle, sd):
    """(onnx predictor from the bundle, eager predictor), both with the astronaut photo set."""
    test, ref = Sam2Predictor.from_export(bundle), Sam2Predictor(EagerBackend.from_state_dict(sd, TEST_SMALL))
    img = photo("astronaut.png")
    test.set_image(img)
    ref.set_image(img)
    return test, ref


def assert_same(pair, **prompt):
    test, ref = pair
    for multimask in (True, False):
        tl, ts, tlow = test.predict(**prompt, multimask_output=multimask, return_logits=True)
        rl, rs, rlow = ref.predict(**prompt, multimask_output=multimask, return_logits=True)
        np.testing.assert_allclose(tlow, rlow, atol=ATOL, rtol=0)
        np.testing.assert_allclose(ts, rs, atol=ATOL, rtol=0)
        decided = np.abs(rl) > ATOL
        assert np.array_equal((tl > 0)[decided], (rl > 0)[decided])
        assert 0.0 < (rl > 0).mean() < 1.0  # a non-trivial mask, so the comparison can fail


def test_bundle_files_checker_and_card(bundle):
    assert sorted(p.name for p in bundle.iterdir()) == [
        "card.json",
        "decoder.onnx",
        "decoder_batched.onnx",
        "encoder.onnx",
        "fidelity.json",
        "manifest.json",
    ]
    card = json.loads((bundle / "card.json").read_text())
    assert card["target"] == "onnx" and card["status"] == "shippable" and card["precision"] == "fp32"
    fid = validate_fidelity(json.loads((bundle / "fidelity.json").read_text()))  # the one schema
    assert fid == card["fidelity"]
    assert all(v["cosine"] >= 0.99999 for v in fid["outputs"].values())
    assert fid["end_to_end"]["iou_worst"] >= 0.99
    opt = fid["checks"]["optimization"]
    assert all(v["cosine"] >= 0.9999999 for v in opt["optimized_vs_unoptimized"].values())
    assert all(g["nodes_after"] < g["nodes_before"] for g in opt["graphs"].values())
    for name, ins, outs in (
        ("encoder.onnx", ob.ENCODER_INPUTS, ob.ENCODER_OUTPUTS),
        ("decoder.onnx", ob.DECODER_INPUTS, ob.DECODER_OUTPUTS),
        ("decoder_batched.onnx", ob.BATCHED_INPUTS, ob.DECODER_OUTPUTS),
    ):
        onnx.checker.check_model(str(bundle / name), full_check=True)
        m = onnx.load(str(bundle / name))
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer)
        assert tuple(i.name for i in m.graph.input) == ins and tuple(o.name for o in m.graph.output) == outs
        assert {n.domain for n in m.graph.node} <= {"", "ai.onnx"}
    dec = onnx.load(str(bundle / "decoder.onnx"))
    coords = next(i for i in dec.graph.input if i.name == "point_coords")
    assert coords.type.tensor_type.shape.dim[1].dim_param == "num_points"
    assert not fid["checks"]["batched_decoder"]["failures"]


def test_metadata(bundle):
    for name in ("encoder.onnx", "decoder.onnx"):
        props = {p.key: p.value for p in onnx.load(str(bundle / name)).metadata_props}
        assert props["model_id"] == "sam2.1-hiera-tiny"
        assert "synthetic" in props["checkpoint_sha256"]
        pre = json.loads(props["preprocessing"])
        assert pre["mean"] == list(MEAN) and pre["std"] == list(STD) and pre["resize"] == [256, 256]
        assert "-2 ignored slot" in props["point_labels"] and "2 box top-left" in props["point_labels"]


def test_registered_backend(pair):
    assert BACKENDS["onnx"] is ob.OnnxBackend
    assert pair[0].backend.name == "onnx" and pair[0].backend.providers == ["CPUExecutionProvider"]


def test_dynamic_num_points_one_session(pair):
    """1, 2, 5, 16 points through the same decoder session all equal the eager predictor."""
    test, _ = pair
    session = test.backend.decoder
    rng = np.random.default_rng(1)
    h, w = photo("astronaut.png").shape[:2]
    for n in (1, 2, 5, 16):
        pts = rng.uniform([0, 0], [w, h], size=(n, 2)).astype(np.float32)
        labels = np.arange(n) % 2 == 0
        assert_same(pair, point_coords=pts, point_labels=labels.astype(np.int64))
    assert test.backend.decoder is session


def test_box_only(pair):
    assert_same(pair, box=np.array([120, 40, 380, 300], np.float32))


def test_box_and_points(pair):
    box = np.array([100, 30, 400, 330], np.float32)
    assert_same(pair, box=box, point_coords=np.array([[250, 150], [130, 300]], np.float32), point_labels=[1, 0])


def test_mask_input(pair):
    """Upstream's refinement loop: the low-res logits of one predict fed back, with and without points."""
    _, ref = pair
    _, scores, low = ref.predict(point_coords=[[260, 180]], point_labels=[1])
    mask = low[int(np.argmax(scores))][None]
    assert_same(pair, point_coords=np.array([[300, 200]], np.float32), point_labels=[1], mask_input=mask)
    assert_same(pair, mask_input=mask)


def test_bad_inputs_one_line_errors(pair):
    backend = pair[0].backend
    s, side = TEST_SMALL.image_size, 4 * TEST_SMALL.image_embedding_size
    image = np.zeros((1, 3, s, s), np.float32)
    feats = backend.encode(image)
    nan_image = image.copy()
    nan_image[0, 1, 5, 5] = np.nan
    coords, labels = np.zeros((1, 2, 2), np.float32), np.array([[1, -1]], np.float32)
    cases = {
        "float64": lambda: backend.encode(image.astype(np.float64)),
        "shape": lambda: backend.encode(image[0]),
        "NaN": lambda: backend.encode(nan_image),
        "point_coords must have shape": lambda: backend.decode(feats, coords[0], labels, None),
        "point_coords must be float32": lambda: backend.decode(feats, coords.astype(np.float64), labels, None),
        "point_labels must be in": lambda: backend.decode(feats, coords, labels + 7, None),
        "mask_input must have shape": lambda: backend.decode(
            feats, coords, labels, np.zeros((1, side, side), np.float32)
        ),
    }
    for needle, call in cases.items():
        with pytest.raises(UserError, match=needle) as err:
            call()
        assert "\n" not in str(err.value)


def test_corrupt_files_and_providers(bundle, tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    with open(bad / "decoder.onnx", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(UserError, match="SHA-256"):
        ob.OnnxBackend.from_bundle(bad)
    with pytest.raises(UserError, match="corrupt or not ONNX"):
        ob.make_session(bad / "decoder.onnx")
    monkeypatch.setenv(ob.PROVIDERS_ENV, "NoSuchExecutionProvider")
    with pytest.raises(UserError, match="not available here"):
        ob.OnnxBackend.from_bundle(bundle)


def test_cli_exit_2(bundle, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    (bad / "encoder.onnx").write_bytes(b"not an onnx file")
    argv_sets = [
        ["segment", "sample:astronaut.png", "--point", "10,10", "--model", str(bad), "--out", str(tmp_path / "m.png")],
        ["export", "--target", "onnx", "--resolution", "100", "--config", "test-small", "--out", str(tmp_path / "x")],
    ]
    for argv in argv_sets:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "x").exists()


def test_fp16_export_weights_half_io_float(tmp_path, sd, bundle):
    """fp16 bundle: fp16 encoder weights, fp32 decoders (the single and the batched one), fp32 I/O, a
    smaller encoder, masks within the IoU bar of eager fp32; the batched decoder equals its single decodes; the card
    states the measured IoU and what was kept in fp32, and why."""
    from sam2edge.cards.render import render_markdown

    out = tmp_path / "fp16"
    card = export_onnx(sd, SOURCE, TEST_SMALL, "test-small", "fp16", out, "test", clicks=5)
    assert card["status"] == "shippable" and card["fidelity"]["end_to_end"]["iou_worst"] >= 0.99
    batched = card["fidelity"]["checks"]["batched_decoder"]  # fp16 ships the batched decoder too, checked
    assert batched["prompts"] == batched["batch"] + 3 and not batched["failures"] and batched["mask_iou_worst"] >= 0.99
    shares = (("encoder.onnx", (0.8, 1.0)), ("decoder.onnx", (0.0, 0.0)), ("decoder_batched.onnx", (0.0, 0.0)))
    for name, half_share in shares:
        m = onnx.load(str(out / name))
        floats = [t for t in m.graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
        half = sum(np.prod(t.dims) for t in floats if t.data_type == onnx.TensorProto.FLOAT16)
        assert half_share[0] <= half / sum(np.prod(t.dims) for t in floats) <= half_share[1], name
        io = list(m.graph.input) + list(m.graph.output)
        assert all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in io)
    assert (out / "encoder.onnx").stat().st_size < 0.6 * (bundle / "encoder.onnx").stat().st_size
    assert "decoder.onnx and decoder_batched.onnx (prompt encoder + mask decoder)" in card["extra"]["fp32_kept"]
    text = render_markdown(card, card["fidelity"], [], [], None)
    e2e = card["fidelity"]["end_to_end"]
    assert "## Reduced precision (fp16)" in text and "Kept in fp32, and why:" in text
    assert f"| mask IoU worst | {e2e['iou_worst']:.5f} | >= 0.99 | pass |" in text
    assert f"| mask IoU median | {e2e['iou_median']:.5f} | >= 0.999 |" in text
    machine = card["fidelity"]["machine"]  # the CPU the check ran on (name and generation), and how it computes fp16
    assert machine["fp16_arithmetic"] in ("native", "through fp32") and f"on {machine['cpu']}" in text
    assert f"on {cpu_name(machine)}, fp16 arithmetic {machine['fp16_arithmetic']}" in text
    assert (
        "| decoder.onnx and decoder_batched.onnx (prompt encoder + mask decoder) | in fp16 the two-way transformer"
        in text
    )


def test_card_resolution_disagreeing_with_the_graph_is_one_line(bundle, tmp_path, capsys):
    """card.json says 512 but encoder.onnx takes 256x256: refused at load, one line naming both."""
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    card = json.loads((bad / "card.json").read_text())
    card["resolution"] = 512
    (bad / "card.json").write_text(json.dumps(card))
    with pytest.raises(UserError, match="says resolution 512.*256x256"):
        ob.OnnxBackend.from_bundle(bad)
    out = ["--out", str(tmp_path / "m.png"), "--overlay", str(tmp_path / "o.png")]
    assert main(["segment", "sample:astronaut.png", "--point", "10,10", "--model", str(bad), *out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "resolution" in err
