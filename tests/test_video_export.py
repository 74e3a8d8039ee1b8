"""``sam2edge export --video`` on every target at test-small: one session-scoped export per target (fp32,
perturbed synthetic video weights with the object-score head lifted, saved as a Meta checkpoint), then
tracking through ``Sam2VideoPredictor.from_export`` compared with the eager predictor frame by frame."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from sam2edge.bundle import load_card
from sam2edge.cards.render import render_markdown
from sam2edge.checks.fidelity.metrics import mask_iou
from sam2edge.cli.main import main
from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from sam2edge.errors import UserError
from sam2edge.runtime.video.bundle import BATCHED, VIDEO_BATCH, VIDEO_GRAPHS, video_file
from sam2edge.runtime.video.predictor import Sam2VideoPredictor
from tests.video_oracles import drifting_clip

# ExecuTorch's --video export lowers ten programs (5.5 min at test-small on a busy 2-core machine): slow. CI
# tracks through the LiteRT and ONNX bundles, whose video runtime ExecuTorch's shares; `pytest -m slow -k
# "test_video_export and executorch"` runs the ExecuTorch bundle's tests.
TARGETS = ("litert", "onnx", pytest.param("executorch", marks=pytest.mark.slow))


@pytest.fixture(scope="session", params=TARGETS)
def video_bundle(request, video_bundle_dir):
    """One ``--video`` export per target and test run (conftest ``video_bundle_dir``, shared by the workers)."""
    out = video_bundle_dir(request.param)
    return request.param, out, load_card(out)


def _track(pred: Sam2VideoPredictor, folder) -> dict[tuple[str, int], np.ndarray]:
    """Objects: a click, a box (frame 0), a mask (frame 1); forward; a correction on frame 2, forward; reverse."""
    state = pred.init_state(video_path=str(folder))
    n, h, w = state.num_frames, state.video_height, state.video_width
    pred.add_new_points_or_box(state, 0, 1, points=np.array([[0.6 * w, 0.3 * h]]), labels=np.array([1]))
    pred.add_new_points_or_box(state, 0, 7, box=np.array([0.05 * w, 0.5 * h, 0.45 * w, 0.9 * h]))
    mask = np.zeros((h, w), bool)
    mask[int(0.1 * h) : int(0.45 * h), int(0.55 * w) : int(0.9 * w)] = True
    pred.add_new_mask(state, 1, 3, mask)  # mask prompt: the host downsampler + mask-as-output
    out = {("fwd", f): m.numpy() for f, _, m in pred.propagate_in_video(state)}
    pred.add_new_points_or_box(
        state, 2, 1, points=np.array([[0.2 * w, 0.2 * h]]), labels=np.array([0]), clear_old_points=False
    )
    out.update({("fix", f): m.numpy() for f, _, m in pred.propagate_in_video(state)})
    out.update({("rev", f): m.numpy() for f, _, m in pred.propagate_in_video(state, n - 1, reverse=True)})
    return out


def test_bundle_tracks_like_eager(video_bundle, video_checkpoint, tmp_path):
    """from_export has the eager API; per frame and object, mask IoU >= 0.999 (fp32) on a clip that is not
    the export's own, with objects really present (masks neither empty nor full)."""
    target, folder, card = video_bundle
    clip = tmp_path / "clip"
    drifting_clip(clip, frames=5, size=(176, 144), step=11)
    eager = Sam2VideoPredictor.from_checkpoint(str(video_checkpoint), TEST_SMALL, VIDEO_TEST_SMALL)
    bundle = Sam2VideoPredictor.from_export(folder)
    bundle.backend.pad_from = 2  # 2 or 3 objects too through the 4-object graphs, padded (default: full chunks)
    assert bundle.backend.name == f"{target}-bundle"
    assert bundle.backend.run.loaded() == ()  # each graph's runtime session is made on its first call
    want, got = _track(eager, clip), _track(bundle, clip)
    assert set(bundle.backend.run.loaded()) == {*VIDEO_GRAPHS, *(r + BATCHED for r in VIDEO_GRAPHS)}
    assert want.keys() == got.keys() and len(want) == 15
    fg = [float((m > 0).mean()) for m in want.values()]
    assert 0.0 < min(fg) and max(fg) < 1.0, fg
    for key, ref in want.items():
        for o in range(ref.shape[0]):
            iou = mask_iou(got[key][o] > 0, ref[o] > 0)
            assert iou >= 0.999, f"{target} {key} object {o}: IoU {iou:.5f}"


def test_five_objects_run_batched_like_eager(video_bundle, video_checkpoint, tmp_path):
    """Five objects through a bundle's batched graphs: each frame that tracks all five runs 4 objects in one call of
    each batched graph and the fifth through the single-object graphs (fewer than 4: one per call, the default);
    per frame and object IoU >= 0.999 vs eager."""
    target, folder, _ = video_bundle
    clip = tmp_path / "clip"
    drifting_clip(clip, frames=4, size=(176, 144), step=11)
    eager = Sam2VideoPredictor.from_checkpoint(str(video_checkpoint), TEST_SMALL, VIDEO_TEST_SMALL)
    bundle = Sam2VideoPredictor.from_export(folder)
    calls: list[str] = []
    runs = bundle.backend.run

    class Recorded(dict):
        def __getitem__(self, role):
            return lambda feed: (calls.append(role), runs[role](feed))[1]

    clicks = [(0, 0.6, 0.3), (0, 0.25, 0.7), (0, 0.8, 0.75), (1, 0.4, 0.4), (1, 0.7, 0.55)]

    def track(pred, record: bool):
        state = pred.init_state(video_path=str(clip))
        w, h = state.video_width, state.video_height
        for i, (f, x, y) in enumerate(clicks):
            pred.add_new_points_or_box(state, f, 10 + i, points=np.array([[x * w, y * h]]), labels=np.array([1]))
        pred.propagate_in_video_preflight(state)
        if record:
            bundle.backend.run = Recorded()
        out = [m.numpy() for _, _, m in pred.propagate_in_video(state)]
        out += [m.numpy() for _, _, m in pred.propagate_in_video(state, 3, reverse=True)]
        return out

    want, got = track(eager, False), track(bundle, True)
    for k, (a, b) in enumerate(zip(want, got, strict=True)):
        assert a.shape[0] == b.shape[0] == 5
        for o in range(5):
            iou = mask_iou(b[o] > 0, a[o] > 0)
            assert iou >= 0.999, f"{target} step {k} object {o}: IoU {iou:.5f}"
    # frames 0 and 1 (forward and reverse) track the 2 and 3 objects not prompted there: one call per object and
    # stage; frames 2 and 3 (forward and reverse) track all 5: 4 + 1 per stage
    five = ["memory-attention" + BATCHED, "memory-attention", "video-decoder" + BATCHED, "video-decoder"]
    five += ["memory-encoder" + BATCHED, "memory-encoder"]
    assert calls[:2] == ["memory-attention"] * 2 and calls[15:21] == five, calls
    assert (calls.count("memory-attention" + BATCHED), calls.count("memory-attention")) == (4, 14), calls


def test_card_documents_video_graphs(video_bundle):
    """card.json: every video graph an artifact with its tensors, the slot layout; the export measured the clip
    per frame with the fp32 bar; the card renders a video section."""
    target, folder, card = video_bundle
    card = load_card(folder)
    video = card["extra"]["video"]
    files = {a["file"]: a["role"] for a in card["artifacts"]}
    for role, (_, ins, outs) in VIDEO_GRAPHS.items():
        for r in (role, role + BATCHED):
            assert files[video_file(target, r)] == r
            assert list(video["graphs"][r]["inputs"]) == list(ins)
            assert list(video["graphs"][r]["outputs"]) == list(outs)
    assert video["graphs"]["memory-attention"]["inputs"]["mem_feats"][0] == VIDEO_TEST_SMALL.memory_slots
    assert video["batch"] == VIDEO_BATCH == 4
    batched = video["graphs"]["memory-attention" + BATCHED]
    assert batched["inputs"]["mem_feats"][0] == 4 * VIDEO_TEST_SMALL.memory_slots
    assert batched["inputs"]["vision"][0] == 1 and batched["outputs"]["pix_feat"][0] == 4
    e = TEST_SMALL.image_embedding_size
    tokens = VIDEO_TEST_SMALL.memory_slots * e * e + VIDEO_TEST_SMALL.max_obj_ptrs * 2
    assert video["slot_layout"]["key_tokens"] == tokens
    fid = card["fidelity"]["video"]
    assert fid["bars"] == {"min_video_iou_worst": 0.999} and fid["iou_worst"] >= 0.999 and not fid["failures"]
    assert set(fid["per_frame_iou"]) == {"forward", "correction", "corrected", "reverse"}
    text = render_markdown(card, card["fidelity"], [], [], None)
    assert "## Video (tracking)" in text and f"`{video_file(target, 'memory-attention')}`" in text


@pytest.mark.parametrize("video_bundle", ["litert"], indirect=True)
def test_litert_video_graphs_gpu_clean(video_bundle):
    """LiteRT: each video graph lint-clean (rank <= 4, no banned op) and resident on the GPU delegate: one
    partition, every op on the GPU, GPU-vs-CPU cosine >= 0.9999 (the export refuses otherwise: no --allow-dirty)."""
    target, folder, card = video_bundle
    card = load_card(folder)
    assert card["extra"]["gpu_clean"] is True
    gpu = card["fidelity"]["checks"]["gpu_delegate"]["files"]
    for role in (*VIDEO_GRAPHS, *(r + BATCHED for r in VIDEO_GRAPHS)):
        f = video_file("litert", role)
        lint = card["extra"]["lint"][f]
        assert lint["max_rank"] <= 4 and "banned ops = NONE" in lint["verdict"], (f, lint)
        g = gpu[f]
        assert g["verdict"] == "resident" and g["kind"] == "video" and g["ops_gpu"] == g["ops_total"], (f, g)
        assert all(o["cosine"] >= 0.9999 for o in g["outputs"].values()), (f, g["outputs"])


@pytest.mark.parametrize("video_bundle", ["litert"], indirect=True)
def test_litert_graphs_take_constant_weights(video_bundle, tmp_path):
    """No FULLY_CONNECTED of a LiteRT ``--video`` bundle has weights computed in the graph (the slow form XNNPACK
    does not take, ``dynamic_weight_products``); the check finds the form in a graph that has it."""
    import litert_torch
    import torch

    from sam2edge.checks.tflite.slice import dynamic_weight_products, load_model

    _, folder, _ = video_bundle
    files = sorted(folder.glob("*.tflite"))
    assert {video_file("litert", r) for r in VIDEO_GRAPHS} <= {f.name for f in files}
    assert {f.name: dynamic_weight_products(load_model(f)) for f in files} == {f.name: [] for f in files}

    class Scores(torch.nn.Module):  # upstream's key layout: q @ k^T with the keys as rows
        def forward(self, q, k):
            return torch.softmax(q @ k.transpose(1, 2), -1)

    path = tmp_path / "scores.tflite"
    sample = {"q": torch.randn(1, 16, 8), "k": torch.randn(1, 40, 8)}
    litert_torch.convert(Scores().eval(), sample_kwargs=sample).export(str(path))
    assert len(dynamic_weight_products(load_model(path))) == 1


@pytest.mark.slow  # the ExecuTorch --video bundle (see TARGETS)
@pytest.mark.parametrize("video_bundle", ["executorch"], indirect=True)
def test_executorch_video_delegation_named(video_bundle):
    """ExecuTorch: the census of every video program names each operator left outside XNNPACK."""
    target, folder, card = video_bundle
    census = load_card(folder)["extra"]["delegation"]
    for role in VIDEO_GRAPHS:
        c = census[video_file("executorch", role)]
        why = load_card(folder)["extra"]["outside_delegate_why"][video_file("executorch", role)]
        assert c["delegates"] >= 1 and c["delegated_ops"] > 0.9 * c["total_ops"], c
        assert set(why) == set(c["outside_delegate"]) and all(why.values()), (c, why)


@pytest.mark.slow
def test_executorch_fp16_video_bundle_ships(video_checkpoint, tmp_path):
    """ExecuTorch fp16 ``--video`` (5 min at test-small on 2 cores, hence slow): shippable, each program
    within its size limit (convolutions at fp32, as XNNPACK stores them), the video bars met, and no scalar
    cast of the fp16 graphs left outside XNNPACK (constants folded before partitioning)."""
    from sam2edge.export.pipeline import run_export

    out = tmp_path / "et16"
    card = run_export(
        "executorch",
        "test-small",
        "fp16",
        out,
        checkpoint=str(video_checkpoint),
        video=True,
        options={"batch": 0, "video_batch": 1},  # no batched graphs: not under test here
    )
    assert card["status"] == "shippable", card["fidelity"]["failures"]
    for name, s in card["extra"]["sizes"].items():
        assert s["bytes"] <= s["limit_bytes"], (name, s)
    video = card["fidelity"]["video"]
    assert video["iou_worst"] >= 0.95 and video["iou_median"] >= 0.99 and not video["failures"]
    for role in VIDEO_GRAPHS:
        c = card["extra"]["delegation"][video_file("executorch", role)]
        assert c["outside_delegate"].get("dim_order_ops", 0) <= 16, c  # the I/O casts and bool -> float only


@pytest.mark.parametrize("video_bundle", ["onnx"], indirect=True)
def test_verify_and_tamper(video_bundle, tmp_path):
    """`verify` re-measures the clip (ONNX, the fastest); a modified video graph is refused by from_export."""
    from sam2edge.checks.fidelity.verify import verify_bundle

    target, folder, _ = video_bundle
    report = verify_bundle(folder, clicks=2)
    assert report["passed"], report["failures"]
    assert report["video"]["iou_worst"] >= 0.999 and "reverse" in report["video"]["per_frame_iou"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    victim = copy / video_file("onnx", "memory-attention")
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError, match="memory_attention.onnx"):
        Sam2VideoPredictor.from_export(copy)
    card = load_card(folder)
    del card["extra"]["video"]
    (copy / "card.json").write_text(__import__("json").dumps(card))
    with pytest.raises(UserError, match="has no video graphs"):
        Sam2VideoPredictor.from_export(copy)


@pytest.mark.parametrize("target", [pytest.param("litert", marks=pytest.mark.slow), "onnx"])  # litert: 85 s of export
def test_int8_video_bundle_quantises_only_the_frame_encoder(target, video_bundle_dir, video_checkpoint, tmp_path):
    """``--precision int8 --video``: the frame encoder is the int8 encoder; the three video graphs compute what
    the fp32 bundle's do, bit for bit; the clip is measured at int8's clip bars (worst 0.95, median 0.99), the
    status follows them, and the card says what stayed fp32 and why."""
    from sam2edge.export.pipeline import run_export
    from sam2edge.export.video import samples
    from sam2edge.runtime.backends.onnx import has_vnni
    from sam2edge.runtime.video.bundle import open_video_bundle

    out = tmp_path / "int8"
    options = {"batch": 0, "video_batch": 1} | ({"gpu_check": "skip"} if target == "litert" else {})
    card = run_export(target, "test-small", "int8", out, checkpoint=str(video_checkpoint), clicks=4, video=True,
                      force=True, options=options)  # fmt: skip
    fid = card["fidelity"]["video"]
    assert fid["bars"] == {"min_video_iou_worst": 0.95, "min_video_iou_median": 0.99}
    assert fid["iou_worst"] >= 0.95, fid["per_frame_iou"]  # the worst-frame bar holds at test-small
    passed = fid["iou_median"] >= 0.99 and card["fidelity"]["end_to_end"]["iou_worst"] >= 0.95
    assert (card["status"] == "shippable") == passed
    assert "video graphs (memory attention, memory encoder, video decoder)" in card["extra"]["fp32_kept"]
    if target == "onnx" and has_vnni():  # the u8 x s8 frame encoder this CPU runs tracked the clip as well
        vnni = card["fidelity"]["checks"]["int8_vnni"]
        assert vnni["shipped"] and vnni["video"]["iou_worst"] >= 0.95, vnni
    int8, _ = open_video_bundle(out)
    fp32, _ = open_video_bundle(video_bundle_dir(target))
    s = TEST_SMALL.image_size
    image = np.random.default_rng(0).standard_normal((1, 3, s, s)).astype(np.float32)  # preprocessed frame
    assert not np.array_equal(int8.encode_frame(image).vision, fp32.encode_frame(image).vision)  # the int8 encoder
    for role, named in samples(TEST_SMALL, VIDEO_TEST_SMALL, card["extra"]["video"]["num_tokens"]).items():
        feed = {k: v.numpy() for k, v in named.items()}
        got, want = int8.run[role](feed), fp32.run[role](feed)
        assert all(np.array_equal(got[k], want[k]) for k in VIDEO_GRAPHS[role][2]), role


@pytest.mark.parametrize(
    "argv, says",
    [(["--target", "executorch-webgpu", "--precision", "fp32"], "--video is not offered")],
)
def test_cli_video_refusals(argv, says, tmp_path, capsys):
    assert main(["export", *argv, "--config", "test-small", "--video", "--out", str(tmp_path / "b")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error:")]
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "b").exists()


def test_memory_attention_fits_gpu_textures_at_full_size():
    """The memory attention's new big axis (7 x 4096 + 64 keys at 1024 px) fits one GPU texture side under
    the encoder's texture rule (``layers.texture_rows``) with one head: no key split is needed; one more
    spatial slot would not fit (the bound this layout sits under)."""
    from sam2edge.config import HIERA_TINY, VIDEO_TINY
    from sam2edge.model.layers import Rewrites, texture_rows

    e, v = HIERA_TINY.image_embedding_size, VIDEO_TINY
    keys = v.memory_slots * e * e + v.max_obj_ptrs * (HIERA_TINY.d_model // v.mem_dim)
    assert keys == 7 * 4096 + 64
    limit = Rewrites().texture_limit
    d = HIERA_TINY.d_model // v.attn_heads
    assert texture_rows(v.attn_heads, d, keys) <= limit  # cross-attention: q k^T and softmax(.) v
    assert texture_rows(v.attn_heads, d, e * e) <= limit  # self-attention
    assert texture_rows(v.attn_heads, d, keys + e * e) > limit  # an 8th slot would need a key split


def test_fp16_video_graphs_export_and_unlift():
    """Each fp16-wrapped video graph goes through ``torch.export`` and back to a module (ExecuTorch's lowering
    starts there). A wrapper whose submodule was named ``graph`` broke it: GraphModule has its own ``graph``."""
    import torch

    from sam2edge.export import video as vid
    from sam2edge.export.half import HalfGraph
    from sam2edge.model.sam2_video import build_sam2_video

    model = build_sam2_video(TEST_SMALL, VIDEO_TEST_SMALL)
    samples = vid.samples(TEST_SMALL, VIDEO_TEST_SMALL, 8)
    for role, graph in vid.MODULES.items():
        half = HalfGraph(graph(model)).eval()
        args = tuple(samples[role].values())
        with torch.no_grad():
            module = torch.export.export(half, args, strict=False).module()
            got, want = module(*args), half(*args)
        assert all(g.dtype == torch.float32 for g in got), role
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), role


@pytest.mark.parametrize("target", ["onnx", pytest.param("litert", marks=pytest.mark.slow)])
def test_large_stand_in_video_bundle_tracks_like_eager(target, tmp_path):
    """``export --video`` of another size (test-small-l: large's trunk and window specs, 384 px, a 24 x 24 memory
    grid) tracks as the eager predictor on its checkpoint, found from the tensors on both sides."""
    from sam2edge.config import get_config, get_video_config
    from sam2edge.export.pipeline import run_export
    from sam2edge.weights.load import save_checkpoint
    from sam2edge.weights.video import synthetic_video_state_dict
    from tests.video_oracles import OBJ_SCORE_LIFT

    cfg, vcfg = get_config("test-small-l"), get_video_config("test-small-l")
    sd = synthetic_video_state_dict(cfg, vcfg, seed=5)
    sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += OBJ_SCORE_LIFT
    ckpt = tmp_path / "large_stand_in.pt"
    save_checkpoint(sd, "meta", ckpt)
    options = {"batch": 0, "video_batch": 1} | ({"gpu_check": "skip"} if target == "litert" else {})
    card = run_export(target, "test-small-l", "fp32", tmp_path / "b", checkpoint=str(ckpt), clicks=4, video=True,
                      options=options)  # fmt: skip
    assert card["config"] == "test-small-l" and card["extra"]["video"]
    clip = tmp_path / "clip"
    drifting_clip(clip, frames=4, size=(176, 144), step=11)
    eager = Sam2VideoPredictor.from_checkpoint(str(ckpt))
    assert eager.backend.cfg == cfg
    want, got = _track(eager, clip), _track(Sam2VideoPredictor.from_export(tmp_path / "b"), clip)
    assert want.keys() == got.keys()
    assert any((m > 0).any() for m in want.values())
    for key, ref in want.items():
        for o in range(ref.shape[0]):
            iou = mask_iou(got[key][o] > 0, ref[o] > 0)
            assert iou >= 0.999, f"{target} {key} object {o}: IoU {iou:.5f}"
