"""Segment everything: sam2edge's generator against upstream ``SAM2AutomaticMaskGenerator`` (same weights),
its building blocks against references, the batched decoder graph, bundles and the CLI (test-small).

Random weights give few confident masks (NOTES), so the parity cases open the filters (every candidate
reaches the output) and also run upstream's defaults on "confident" weights: the perturbed random weights
with the hypernetwork output scaled (sharp logits, stability 0.95-0.99) and the IoU head shifted (predicted
IoU straddles 0.8), so that each default filter and the NMS remove some masks and keep others.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from amg_oracle import confident_, reference_nms, upstream_generator
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import meta_image_path

from sam2edge.bundle import load_card
from sam2edge.checks.fidelity import photo
from sam2edge.checks.fidelity.upstream import upstream_from_state_dict
from sam2edge.cli.main import main
from sam2edge.config import HIERA_TINY, TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.export.batched import BATCH, GPU_TENSOR_BYTES, BatchedTokenDecoderGraph, rows_per_slice, sample_inputs
from sam2edge.model import Rewrites, build_sam2
from sam2edge.runtime.automatic import amg_utils as amg
from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator
from sam2edge.runtime.backends import EagerBackend, decode_batch, decode_loop
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.weights import load_weights

OPEN = dict(pred_iou_thresh=0.0, stability_score_thresh=0.0, box_nms_thresh=1.0)
GRID = dict(points_per_side=8, points_per_batch=16)
CASES = {  # name -> generator kwargs (all at an 8x8 grid unless given)
    "open": dict(OPEN),
    "defaults": {},
    "filters-without-nms": dict(box_nms_thresh=1.0),
    "single-mask": dict(OPEN, multimask_output=False),
    "crops": dict(OPEN, crop_n_layers=1, points_per_side=4, crop_nms_thresh=1.0),
    "crops-defaults": dict(crop_n_layers=1, points_per_side=4),
    "m2m": dict(OPEN, use_m2m=True, points_per_side=4),
}


def mask_of(record: dict) -> np.ndarray:
    seg = record["segmentation"]
    return seg if isinstance(seg, np.ndarray) else amg.rle_to_mask(seg)


def assert_same_masks(ours: list[dict], ref: list[dict], same_order: bool = False) -> None:
    """Same count; each mask matched (same prompt point) at IoU >= 0.99; same keys; scores close."""
    assert len(ours) == len(ref)
    by_point: dict[tuple, list[int]] = {}
    for j, r in enumerate(ref):
        by_point.setdefault(tuple(np.round(r["point_coords"][0], 3)), []).append(j)
    used = set()
    for i, a in enumerate(ours):
        cands = [i] if same_order else by_point.get(tuple(np.round(a["point_coords"][0], 3)), [])
        m = mask_of(a)
        ious = [(m & mask_of(ref[j])).sum() / max((m | mask_of(ref[j])).sum(), 1) for j in cands]
        assert ious and max(ious) >= 0.99, f"mask {i} at {a['point_coords']} has no match (IoU {ious})"
        b = ref[cands[int(np.argmax(ious))]]
        assert id(b) not in used
        used.add(id(b))
        assert a.keys() == b.keys()
        assert abs(a["stability_score"] - b["stability_score"]) <= 1e-3
        assert abs(a["predicted_iou"] - b["predicted_iou"]) <= 1e-3
        assert a["crop_box"] == b["crop_box"] and np.allclose(a["point_coords"], b["point_coords"])


@pytest.fixture(scope="module")
def chelsea() -> np.ndarray:
    return photo("chelsea.png")  # 451 x 300: not square, so the resize and the mask upscaling are exercised


@pytest.fixture(scope="module")
def confident():
    """(upstream image path, sam2edge eager predictor) with identical confident weights."""
    path = confident_(meta_image_path(TEST_SMALL, seed=0))
    return path, Sam2Predictor(EagerBackend.from_state_dict(path.state_dict(), TEST_SMALL))


# ---- parity with upstream's generator ------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_eager_equals_upstream_generator(confident, chelsea, case):
    path, predictor = confident
    kw = {**GRID, **CASES[case]}
    ours = Sam2AutomaticMaskGenerator(predictor, **kw).generate(chelsea)
    ref = upstream_generator(path, TEST_SMALL, **kw).generate(chelsea)
    if case in ("defaults", "filters-without-nms", "crops-defaults"):
        opened_kw = {**GRID, **CASES[case], **OPEN, "crop_nms_thresh": 1.0}
        opened = Sam2AutomaticMaskGenerator(predictor, **opened_kw).generate(chelsea)
        assert 0 < len(ours) < len(opened)  # the filters removed some masks and kept others
    assert_same_masks(ours, ref, same_order=True)
    if case == "m2m":  # ours refines one prompt per call, upstream 16: float rounding differs at the threshold
        return
    for a, b in zip(ours, ref):
        assert np.array_equal(a["segmentation"], b["segmentation"]) and a["bbox"] == b["bbox"]
        assert a["area"] == b["area"] and type(a["area"]) is int


@pytest.mark.parametrize("mode", ["coco_rle", "uncompressed_rle"])
def test_output_modes_equal_upstream(confident, chelsea, mode):
    path, predictor = confident
    kw = dict(GRID, **OPEN, points_per_side=4, output_mode=mode)
    ours = Sam2AutomaticMaskGenerator(predictor, **kw).generate(chelsea)
    ref = upstream_generator(path, TEST_SMALL, **kw).generate(chelsea)
    assert [r["segmentation"] for r in ours] == [r["segmentation"] for r in ref]
    json.dumps(ours)  # RLE records are JSON-ready


def skimage_components(mask: torch.Tensor):
    """Reference for upstream's CUDA ``get_connected_components``: (labels, areas) Nx1xHxW by scikit-image."""
    from skimage.measure import label

    labels, areas = torch.zeros_like(mask, dtype=torch.int32), torch.zeros_like(mask, dtype=torch.int32)
    for i in range(mask.shape[0]):
        lab = label(mask[i, 0].numpy().astype(bool), connectivity=2)
        sizes = np.bincount(lab.ravel())
        sizes[0] = 0
        labels[i, 0], areas[i, 0] = torch.from_numpy(lab), torch.from_numpy(sizes[lab])
    return labels, areas


def test_small_region_removal_equals_upstream(confident, chelsea, monkeypatch):
    import sam2.utils.misc

    monkeypatch.setattr(sam2.utils.misc, "get_connected_components", skimage_components)
    path, predictor = confident
    kw = dict(GRID, **OPEN, points_per_side=4, min_mask_region_area=40)
    ours = Sam2AutomaticMaskGenerator(predictor, **kw).generate(chelsea)
    ref = upstream_generator(path, TEST_SMALL, **kw).generate(chelsea)
    plain = Sam2AutomaticMaskGenerator(predictor, **{**kw, "min_mask_region_area": 0}).generate(chelsea)
    assert sum(not np.array_equal(a["segmentation"], b["segmentation"]) for a, b in zip(ours, plain)) > 0
    assert_same_masks(ours, ref, same_order=True)


# ---- building blocks -----------------------------------------------------------------------------
boxes_st = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 30), st.integers(0, 30)), min_size=0, max_size=25
)


@settings(max_examples=150, deadline=None)
@given(boxes_st, st.data(), st.floats(0.0, 1.0))
def test_nms_equals_brute_force(raw, data, thresh):
    n = len(raw)
    boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in raw], dtype=torch.float32).reshape(-1, 4)
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([0.1, 0.5, 0.7, 0.9]), min_size=n, max_size=n)))
    cats = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=torch.long)
    got = amg.batched_nms(boxes, scores.reshape(-1), cats, thresh)
    assert got.tolist() == reference_nms(boxes, scores.reshape(-1), cats, thresh).tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.data())
def test_rle_and_boxes_equal_upstream(n, h, w, data):
    from pycocotools import mask as mask_utils
    from sam2.utils.amg import batched_mask_to_box, mask_to_rle_pytorch

    bits = data.draw(st.lists(st.booleans(), min_size=n * h * w, max_size=n * h * w))
    masks = torch.tensor(bits).reshape(n, h, w)
    rles = amg.mask_to_rle(masks)
    assert rles == mask_to_rle_pytorch(masks)
    assert torch.equal(amg.batched_mask_to_box(masks), batched_mask_to_box(masks))
    for m, rle in zip(masks.numpy(), rles):
        assert np.array_equal(amg.rle_to_mask(rle), m) and amg.area_from_rle(rle) == m.sum()
        coco = amg.coco_encode_rle(rle)
        assert np.array_equal(mask_utils.decode({**coco, "counts": coco["counts"].encode()}), m)


def test_eager_batched_decode_equals_single_decodes(confident, chelsea):
    _, predictor = confident
    predictor.set_image(chelsea)
    rng = np.random.default_rng(0)
    coords = np.concatenate([rng.uniform(0, 256, (5, 1, 2)), np.zeros((5, 1, 2))], 1).astype(np.float32)
    labels = np.tile(np.array([[1, -1]], np.float32), (5, 1))
    a = decode_batch(predictor.backend, predictor._features, coords, labels)
    b = decode_loop(predictor.backend, predictor._features, coords, labels)
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(1.0, float(np.abs(y).max())), err_msg=f)


# a LiteRT batched-graph budget of two test-small rows: one row's largest tensor is the up-conv input,
# 32 channels x 33^2 fp32 = 139 kB
TWO_ROWS = 2 * 4 * 32 * 33**2


def test_litert_batched_graph_slices_rows_to_fit_gpu_allocations():
    """At 1024 px 64 prompt rows in one tensor exceed a GPU allocation (the zero-stuffed up-convolution input:
    1.1 GB; SwiftShader refuses > 1 GiB): the LiteRT batched graph decodes static slices of rows whose largest
    tensor fits GPU_TENSOR_BYTES, and a sliced graph equals the one-slice graph row for row."""
    e, c = HIERA_TINY.image_embedding_size, HIERA_TINY.d_model
    step = rows_per_slice(HIERA_TINY)
    assert 1 < step < BATCH and step * 4 * c * (2 * e + 1) ** 2 <= GPU_TENSOR_BYTES
    assert rows_per_slice(TEST_SMALL) >= BATCH  # test-small: one slice, the graph CI converts is unsliced
    model = build_sam2(TEST_SMALL, Rewrites()).eval()
    model.load_state_dict(load_weights(None, TEST_SMALL)[0])
    x = sample_inputs(model, 7)
    assert rows_per_slice(TEST_SMALL, TWO_ROWS) == 2
    sliced, whole = BatchedTokenDecoderGraph(model, 7, budget=TWO_ROWS), BatchedTokenDecoderGraph(model, 7)
    assert (sliced.step, whole.step) == (2, 7)  # 4 slices: 2, 2, 2, 1 rows
    with torch.no_grad():
        got, ref = sliced(**x), whole(**x)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.shape[0] == 7
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * max(1.0, float(b.abs().max())))


def test_bad_arguments_are_one_line_errors(confident):
    _, predictor = confident
    with pytest.raises(UserError, match="output_mode"):
        Sam2AutomaticMaskGenerator(predictor, output_mode="png")
    with pytest.raises(UserError, match="exactly one"):
        Sam2AutomaticMaskGenerator(predictor, points_per_side=None)
    with pytest.raises(UserError, match="BxNx2"):
        predictor.set_image(photo("chelsea.png"))
        predictor.predict_batch(np.zeros((3, 2)), np.ones(3))


# ---- bundles -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_upstream():
    sd, _ = load_weights(None, TEST_SMALL)
    return upstream_from_state_dict(sd, TEST_SMALL)


@pytest.mark.parametrize(
    "target",
    ["onnx", pytest.param("litert", marks=pytest.mark.slow), pytest.param("executorch", marks=pytest.mark.slow)],
)  # litert / executorch: 70 / 130 s on 2 busy cores; their batched graphs' own tests below run in CI
def test_bundle_generator_equals_upstream(small_bundle, synthetic_upstream, chelsea, target):
    """Through single decodes (the fallback of a bundle without decoder-batched; the batched graph's own
    tests are below)."""
    kw = dict(GRID, **OPEN)
    predictor = Sam2Predictor.from_export(small_bundle(target))
    predictor.backend.batched = predictor.backend.batched_file = None  # no batched decoder: B single decodes
    ours = Sam2AutomaticMaskGenerator(predictor, **kw).generate(chelsea)
    ref = upstream_generator(synthetic_upstream, TEST_SMALL, **kw).generate(chelsea)
    assert len(ref) == 3 * 64
    assert_same_masks(ours, ref)


def test_cli_everything(small_bundle, tmp_path, capsys):
    bundle = small_bundle("onnx")
    out, overlay = tmp_path / "m.json", tmp_path / "o.png"
    argv = ["everything", "sample:chelsea.png", "--model", str(bundle), "--out", str(out), "--overlay", str(overlay)]
    assert main([*argv, "--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-thresh", "0"]) == 0
    doc = json.loads(out.read_text())
    assert doc["size"] == [300, 451] and len(doc["masks"]) >= 1
    assert set(doc["masks"][0]) == {"segmentation", "area", "bbox", "predicted_iou", "point_coords"} | {
        "stability_score",
        "crop_box",
    }
    assert overlay.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    photo_copy = tmp_path / "p.png"
    shutil.copy(overlay, photo_copy)
    before = photo_copy.read_bytes()
    assert main(["everything", str(photo_copy), "--model", str(bundle), "--overlay", str(photo_copy)]) == 2
    assert main(["everything", str(tmp_path / "missing.png"), "--model", str(bundle)]) == 2
    assert photo_copy.read_bytes() == before
    err = capsys.readouterr().err
    assert "is the input" in err and "does not exist" in err
    # a second run replaces the first run's results; a file sam2edge did not write is refused, nothing written
    assert main([*argv, "--points-per-side", "2"]) == 0 and json.loads(out.read_text())["software"] == "sam2edge"
    user = tmp_path / "notes.json"
    user.write_text('{"mine": 1}')
    fresh = tmp_path / "fresh.png"
    assert (
        main(["everything", "sample:chelsea.png", "--model", str(bundle), "--out", str(user), "--overlay", str(fresh)])
        == 2
    )
    assert user.read_text() == '{"mine": 1}' and not fresh.exists()
    assert "--out " + str(user) + " already exists and sam2edge did not write it" in capsys.readouterr().err


# ---- batched decoder graph, every target -----------------------------------------------------------
BATCHED_FILES = {
    "litert": "decoder_batched.tflite",
    "onnx": "decoder_batched.onnx",
    "executorch": "decoder_batched.pte",
}
NEEDS = {"litert": "litert_torch", "onnx": "onnxruntime", "executorch": "executorch"}


def target_bundle(small_bundle, target: str):
    """The session's test-small bundle of ``target``: its export writes the batched decoder (B = 64, card role
    decoder-batched, sha256 checked at load, fidelity check ``batched_decoder``)."""
    pytest.importorskip(NEEDS[target])
    return small_bundle(target)


@pytest.fixture(scope="module")
def batched_bundle(small_bundle):
    """The test-small LiteRT bundle (its GPU-specific tests below)."""
    return target_bundle(small_bundle, "litert")


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n grid-style prompts (one point + upstream's pad point): coords (n, 2, 2), labels (n, 2)."""
    rng = np.random.default_rng(seed)
    coords = np.concatenate([rng.uniform(0, 256, (n, 1, 2)), np.zeros((n, 1, 2))], 1).astype(np.float32)
    return coords, np.tile(np.array([[1, -1]], np.float32), (n, 1))


def test_batched_graph_is_gpu_clean(batched_bundle):
    from sam2edge.checks.tflite.lint import lint_file

    r = lint_file(batched_bundle / "decoder_batched.tflite")
    assert r.clean and r.max_rank <= 4 and not r.banned, r.verdict
    shapes = {t.name: list(t.shape) for t in r.signatures["serving_default"]["inputs"]}
    assert shapes["sparse_prompt"] == [BATCH, 2, TEST_SMALL.d_model] and shapes["image_embeddings"][0] == 1
    assert load_card(batched_bundle)["extra"]["lint"]["decoder_batched.tflite"]["verdict"] == r.verdict


@pytest.mark.parametrize("target", list(BATCHED_FILES))
def test_batched_graph_equals_single_decodes(small_bundle, chelsea, target):
    """The card lists the batched graph and its export check passed; B + 2 prompts (two calls, the last one
    padded) through it equal the same prompts as single decodes of the bundle's decoder."""
    bundle = target_bundle(small_bundle, target)
    card = load_card(bundle)
    assert {a["role"]: a["file"] for a in card["artifacts"]}["decoder-batched"] == BATCHED_FILES[target]
    check = card["fidelity"]["checks"]["batched_decoder"]
    assert check["prompts"] == BATCH + 3 and check["batch"] == BATCH and not check["failures"]
    predictor = Sam2Predictor.from_export(bundle)
    backend = predictor.backend
    assert (backend.batched_file if target == "litert" else backend.batched) is not None
    predictor.set_image(chelsea)
    coords, labels = _rows(BATCH + 2, list(BATCHED_FILES).index(target))
    a = backend.decode_batch(predictor._features, coords, labels)
    b = decode_loop(backend, predictor._features, coords, labels)
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        assert x.shape == y.shape and x.shape[0] == BATCH + 2
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(1.0, float(np.abs(y).max())), err_msg=f)


def test_sliced_litert_batched_graph_is_gpu_resident(tmp_path):
    """The LiteRT batched graph as full size builds it (several row slices in one graph; forced here at
    test-small by a 2-row budget): lint-clean, every op on the GPU delegate in one partition, GPU = CPU."""
    from sam2edge.checks.gpu.check import _ops_total, run_on
    from sam2edge.checks.gpu.delegate_log import parse_delegate_log
    from sam2edge.checks.gpu.feeds import Feeds
    from sam2edge.checks.tflite.lint import lint_file
    from sam2edge.export.litert import DECODER_OUTPUTS, NamedOutputs, convert_graph

    model = build_sam2(TEST_SMALL, Rewrites()).eval()
    model.load_state_dict(load_weights(None, TEST_SMALL)[0])
    graph = BatchedTokenDecoderGraph(model, 5, budget=TWO_ROWS)  # slices of 2, 2, 1 rows
    x = sample_inputs(model, 5)
    path = tmp_path / "decoder_batched.tflite"
    convert_graph(NamedOutputs(graph, DECODER_OUTPUTS), x, path, "fp32")
    r = lint_file(path)
    assert r.clean and r.max_rank <= 4 and not r.banned, r.verdict
    arrays = {k: v.numpy() for k, v in x.items()}
    feeds = Feeds(arrays=arrays, runs=[{k: k for k in arrays}])
    gpu, _, log = run_on(path, "gpu", feeds)
    cpu, _, _ = run_on(path, "cpu", feeds)
    res = parse_delegate_log(log, _ops_total(path))
    assert res.ops_gpu == res.ops_total > 0 and res.partitions == 1 and not res.rejected and not res.gpu_errors
    with torch.no_grad():
        ref = dict(zip(DECODER_OUTPUTS, graph(**x)))
    for k in cpu:
        scale = max(1.0, float(np.abs(cpu[k]).max()))
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=0, atol=1e-5 * scale, err_msg=k)
        np.testing.assert_allclose(cpu[k], ref[k.split("/")[-1]].numpy(), rtol=0, atol=1e-4 * scale, err_msg=k)


@pytest.mark.parametrize("target", list(BATCHED_FILES))
def test_batched_bundle_generator_equals_upstream(small_bundle, synthetic_upstream, chelsea, target):
    """The generator through the bundle's batched graph (8x8 grid, B = 64: one call) equals upstream's."""
    kw = dict(GRID, **OPEN)
    predictor = Sam2Predictor.from_export(target_bundle(small_bundle, target))
    ours = Sam2AutomaticMaskGenerator(predictor, **kw).generate(chelsea)
    ref = upstream_generator(synthetic_upstream, TEST_SMALL, **kw).generate(chelsea)
    assert len(ref) == 3 * 64
    assert_same_masks(ours, ref)


def test_batched_graph_runs_whole_on_the_gpu_delegate(batched_bundle, chelsea):
    """LiteRT's GPU delegate (software Vulkan, as tests/test_gpu_check.py) takes every op, one partition,
    and its answers equal the CPU's."""
    from sam2edge.checks.gpu.check import _ops_total, run_on
    from sam2edge.checks.gpu.delegate_log import parse_delegate_log
    from sam2edge.checks.gpu.feeds import Feeds
    from sam2edge.runtime.prompts import encode_points, no_mask_dense

    predictor = Sam2Predictor.from_export(batched_bundle)
    predictor.set_image(chelsea)
    backend, f = predictor.backend, predictor._features
    rows = [
        encode_points(np.array([[4.0 * i, 30.0], [0, 0]]), np.array([1, -1]), backend.tables, 256, 2)
        for i in range(BATCH)
    ]
    arrays = dict(
        image_embeddings=f.image_embed,
        feat_s0=f.feat_s0,
        feat_s1=f.feat_s1,
        sparse_prompt=np.concatenate([r[0] for r in rows]),
        sparse_valid=np.concatenate([r[1] for r in rows]),
        dense_prompt=no_mask_dense(backend.tables, TEST_SMALL.image_embedding_size),
    )
    feeds = Feeds(arrays=arrays, runs=[{k: k for k in arrays}])
    path = batched_bundle / "decoder_batched.tflite"
    gpu, _, log = run_on(path, "gpu", feeds)
    cpu, _, _ = run_on(path, "cpu", feeds)
    res = parse_delegate_log(log, _ops_total(path))
    assert res.ops_gpu == res.ops_total > 0 and res.partitions == 1 and not res.rejected and not res.gpu_errors
    for k in cpu:
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=0, atol=1e-5 * max(1.0, float(np.abs(cpu[k]).max())), err_msg=k)


@pytest.mark.parametrize("target", list(BATCHED_FILES))
def test_tampered_batched_decoder_is_refused_at_load(target, small_bundle, tmp_path):
    """decoder_batched.* is a card artifact: one changed byte and the bundle is refused, naming the file."""
    folder = tmp_path / "bundle"
    shutil.copytree(target_bundle(small_bundle, target), folder)
    victim = folder / BATCHED_FILES[target]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError) as e:
        Sam2Predictor.from_export(folder)
    assert victim.name in str(e.value) and "does not match" in str(e.value) and "\n" not in str(e.value)
