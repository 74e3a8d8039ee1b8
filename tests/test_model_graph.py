"""Export-friendliness (small config): switch agreement, rank <= 4, exact ignored slots, baked constants."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from oracles import meta_image_path

from sam2edge.config import TEST_SMALL
from sam2edge.export.wrappers import EncoderGraph, PointDecoderGraph, TokenDecoderGraph
from sam2edge.model import UPSTREAM, Rewrites, build_sam2
from sam2edge.model.layers import attention_chunk
from sam2edge.weights import synthetic_state_dict

ALL_REWRITES = (
    [
        Rewrites(attention_rank=r, attention_impl=a, transposed_conv=t, layer_norm=n, mask_head=h, token_fold=f)
        for r, a, t, n, h, f in itertools.product(
            (4, 3),
            ("math", "sdpa"),
            ("zero_stuff", "native", "matmul"),
            ("scaled", "safe", "native"),
            ("channel_sum", "matmul"),
            ("projected", "folded"),
        )
        # the fold touches only the attention, the matmul transposed conv only the upscaling: one LayerNorm form each
        if (f == "projected" or n == "native") and (t != "matmul" or (n == "native" and f == "projected"))
    ]
    + [  # channels-last upscaling: every transposed conv, norm and mask head form it composes with
        Rewrites(transposed_conv=t, layer_norm=n, mask_head=h, upscale_layout="nhwc")
        for t, n, h in itertools.product(
            ("zero_stuff", "native", "matmul"), ("scaled", "native"), ("channel_sum", "matmul")
        )
    ]
    + [Rewrites(q_pool="maxima"), Rewrites(q_pool="maxima", layer_norm="native", attention_rank=3)]  # pooling
    + [Rewrites(qkv="split"), Rewrites(qkv="split", q_pool="maxima", layer_norm="native", attention_rank=3)]
    + [Rewrites(attention_impl="ort_mha"), Rewrites(attention_impl="ort_mha", token_fold="folded", layer_norm="native")]
    + [Rewrites(image_query_chunk=48), Rewrites(image_query_chunk=48, qkv="split", attention_rank=3)]
    + [Rewrites(softmax="shifted"), Rewrites(softmax="shifted", attention_rank=3, image_query_chunk=48)]
    + [Rewrites(score_keys="rows"), Rewrites(score_keys="rows", attention_rank=3, image_query_chunk=48, qkv="split")]
)  # Hiera's q/k/v projection; onnxruntime's fused attention; Hiera's global attention in query slices; the softmax;
# the score product's keys


@pytest.fixture(scope="module")
def sd():
    return synthetic_state_dict(TEST_SMALL, seed=3)


def _run(model, image, coords, labels, mask):
    with torch.no_grad():
        emb, s0, s1 = model.encode_image(image)
        pe = model.sam_prompt_encoder
        sparse = pe.embed_points(coords, labels)
        masks, iou, obj = model.decode(emb, s0, s1, sparse, pe.embed_mask(mask))
        single, single_iou = model.sam_mask_decoder.single_mask(masks, iou)
    return [emb, s0, s1, sparse, masks, iou, obj, single, single_iou]


@pytest.mark.parametrize("rw", ALL_REWRITES, ids=lambda r: "-".join(str(v) for v in vars(r).values()))
def test_every_switch_setting_agrees(sd, rw):
    torch.manual_seed(0)
    image = torch.randn(1, 3, 256, 256)
    coords, labels = torch.tensor([[[60.0, 80.0], [200.0, 30.0], [0.0, 0.0]]]), torch.tensor([[1.0, 0.0, -1.0]])
    mask = torch.randn(1, 1, 64, 64)
    ref_model, model = build_sam2(TEST_SMALL, UPSTREAM), build_sam2(TEST_SMALL, rw)
    ref_model.load_state_dict(sd)
    model.load_state_dict(sd)
    names = ["image_embed", "feat_s0", "feat_s1", "sparse", "masks", "iou", "obj", "single", "single_iou"]
    for name, a, b in zip(
        names, _run(model, image, coords, labels, mask), _run(ref_model, image, coords, labels, mask)
    ):
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= 1e-5 * scale, f"{rw}: {name} differs beyond 1e-5 x {scale:.3g}"


def test_small_config_matches_meta_modules():
    """The small test config is a faithful shrink: upstream modules built from it agree with ours."""
    ref = meta_image_path(TEST_SMALL, seed=5)
    model = build_sam2(TEST_SMALL)
    model.load_state_dict({k: v for k, v in ref.state_dict().items()})
    image = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        r = ref.encode(image)
        emb, s0, s1 = model.encode_image(image)
    for name, a, b in (
        ("image_embed", emb, r["image_embed"]),
        ("feat_s0", s0, r["feat_s0"]),
        ("feat_s1", s1, r["feat_s1"]),
    ):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max(), name


def _max_rank(graph_module) -> tuple[int, str]:
    worst, where = 0, ""
    for node in graph_module.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(v, torch.Tensor) and v.dim() > worst:
                worst, where = v.dim(), f"{node.op} {node.target}"
    return worst, where


@pytest.mark.parametrize("rank", [4, 3])
def test_exported_graphs_have_no_tensor_above_rank_4(sd, rank):
    """torch.export also proves there is no data-dependent Python control flow (it would not trace)."""
    model = build_sam2(TEST_SMALL, Rewrites(attention_rank=rank))
    model.load_state_dict(sd)
    e = TEST_SMALL.image_embedding_size
    feats = (torch.randn(1, 32, e, e), torch.randn(1, 4, 4 * e, 4 * e), torch.randn(1, 8, 2 * e, 2 * e))
    graphs = {
        "encoder": (EncoderGraph(model), (torch.randn(1, 3, 256, 256),)),
        "token-decoder": (
            TokenDecoderGraph(model),
            (*feats, torch.randn(1, 5, 32), torch.ones(1, 5), torch.randn(1, 32, e, e)),
        ),
        "point-decoder": (
            PointDecoderGraph(model),
            (
                *feats,
                torch.rand(1, 4, 2) * 256,
                torch.tensor([[2.0, 3.0, 1.0, -1.0]]),
                torch.randn(1, 1, 4 * e, 4 * e),
                torch.ones(1),
            ),
        ),
    }
    for name, (graph, args) in graphs.items():
        ep = torch.export.export(graph, args)
        worst, where = _max_rank(ep.graph_module)
        assert worst <= 4, f"{name}: rank-{worst} tensor at {where}"


def test_ignored_slots_are_exact_no_ops(sd):
    model = build_sam2(TEST_SMALL)
    model.load_state_dict(sd)
    e = TEST_SMALL.image_embedding_size
    feats = (torch.randn(1, 32, e, e), torch.randn(1, 4, 4 * e, 4 * e), torch.randn(1, 8, 2 * e, 2 * e))
    coords = torch.tensor([[[60.0, 80.0], [0.0, 0.0]]])
    labels = torch.tensor([[1.0, -1.0]])
    graph = PointDecoderGraph(model)
    no_mask = (torch.zeros(1, 1, 4 * e, 4 * e), torch.zeros(1))
    with torch.no_grad():
        short = graph(*feats, coords, labels, *no_mask)
        padded = graph(
            *feats,
            torch.cat([coords, torch.rand(1, 6, 2) * 256], dim=1),
            torch.cat([labels, torch.full((1, 6), -2.0)], dim=1),
            *no_mask,
        )
        used = graph(
            *feats,
            torch.cat([coords, torch.rand(1, 6, 2) * 256], dim=1),
            torch.cat([labels, torch.ones(1, 6)], 1),
            *no_mask,
        )
    for a, b in zip(padded, short):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max()
    assert (used[0] - short[0]).abs().max() > 1e-3 * short[0].abs().max(), "extra used points must change the answer"


def test_constants_are_rebaked_on_load(sd):
    """pos-embed / image PE / no-mask dense / flipped conv weights follow the loaded weights."""
    image = torch.randn(1, 3, 256, 256)
    other = synthetic_state_dict(TEST_SMALL, seed=9)
    reused = build_sam2(TEST_SMALL)
    reused.load_state_dict(sd)
    reused.load_state_dict(other)
    fresh = build_sam2(TEST_SMALL)
    fresh.load_state_dict(other)
    for name, buf in reused.named_buffers():
        assert torch.equal(buf, dict(fresh.named_buffers())[name]), name
    with torch.no_grad():
        assert torch.equal(reused.encode_image(image)[0], fresh.encode_image(image)[0])


@pytest.mark.parametrize("limit", [8192, 100, 1])
def test_attention_slices_fit_the_texture_limit(limit):
    """Every slice fits ``limit`` texture rows (when one item can), slices are equal but the last, and fewest;
    where one item cannot fit (every shape at ``limit`` 1), slices of one item."""
    fits = 0
    for batch, heads, d, nk in itertools.product((1, 25, 100, 1024), (1, 2, 4, 8), (16, 96), (16, 64, 196, 4096)):
        step = attention_chunk(batch, heads, d, nk, limit)
        rows = heads * -(-max(d, nk) // 4)
        assert 1 <= step <= batch
        if rows <= limit:
            fits += 1
            assert step * rows <= limit, (batch, heads, d, nk, step)
            assert -(-batch // step) == -(-batch // (limit // rows)), "not the fewest slices that fit"
        else:
            assert step == 1, (batch, heads, d, nk, step)
    assert (fits > 0) == (limit > 1), f"limit {limit}: {fits} shapes fit, the case misses its branch"
    assert attention_chunk(1024, 1, 96, 64, 0) == 1024


def test_texture_limit_splits_attention_without_changing_results(sd):
    """A tiny limit forces every attention into window slices: same outputs as the unsplit model."""
    torch.manual_seed(1)
    image = torch.randn(1, 3, 256, 256)
    coords, labels = torch.tensor([[[60.0, 80.0], [0.0, 0.0]]]), torch.tensor([[1.0, -1.0]])
    mask = torch.randn(1, 1, 64, 64)
    whole, sliced = build_sam2(TEST_SMALL, Rewrites(texture_limit=0)), build_sam2(TEST_SMALL, Rewrites(texture_limit=8))
    whole.load_state_dict(sd)
    sliced.load_state_dict(sd)

    def softmaxes(model):
        ep = torch.export.export(EncoderGraph(model), (image,))
        return sum("softmax" in str(n.target) for n in ep.graph_module.graph.nodes)

    assert softmaxes(sliced) > softmaxes(whole), "nothing was sliced"
    for a, b in zip(_run(sliced, image, coords, labels, mask), _run(whole, image, coords, labels, mask)):
        assert (a - b).abs().max().item() <= 1e-6 * b.abs().max().item()


@pytest.mark.parametrize(
    "rw",
    [
        UPSTREAM,
        Rewrites(),
        Rewrites(attention_rank=3, texture_limit=16),
        Rewrites(token_fold="folded"),
        Rewrites(transposed_conv="matmul", mask_head="matmul", upscale_layout="nhwc"),
    ],
    ids=["upstream", "gpu", "rank3-sliced", "folded", "nhwc"],
)
def test_one_image_row_for_many_prompts_equals_repeated_rows(sd, rw):
    """Batched decoding hands the decoder ONE image row for B prompts (the first two-way layer projects it
    once, then broadcasts): every output equals the decode with the image repeated to B rows."""
    model = build_sam2(TEST_SMALL, rw).eval()
    model.load_state_dict(sd)
    g = torch.Generator().manual_seed(0)
    e, c, b = TEST_SMALL.image_embedding_size, TEST_SMALL.d_model, 5
    emb, s0, s1 = (torch.randn(1, ch, s, s, generator=g) for ch, s in ((c, e), (c // 8, 4 * e), (c // 4, 2 * e)))
    coords = torch.rand(b, 2, 2, generator=g) * TEST_SMALL.image_size  # (B, 2, 2)
    labels = torch.tensor([[1.0, -1.0]] * b)  # (B, 2): a click + upstream's pad point
    pe = model.sam_prompt_encoder
    with torch.no_grad():
        sparse = pe.embed_points(coords, labels)  # (B, 2, C)
        shared = model.decode(emb, s0, s1, sparse, pe.no_mask_dense)
        rows = model.decode(*(t.expand(b, -1, -1, -1) for t in (emb, s0, s1)), sparse, pe.no_mask_dense)
    for got, ref in zip(shared, rows):
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * max(1.0, float(ref.abs().max())))


@pytest.mark.parametrize("seed", [3, 1])
@pytest.mark.parametrize("batch", [1, 4])
def test_folded_cross_attention_equals_upstream_at_full_decoder_width(seed, batch):
    """``token_fold`` at SAM 2.1's decoder width (8 heads, inner 128, where the fold saves work): every output
    of a click (and of B prompts sharing one image row) equals upstream's operations to fp32 rounding."""
    from sam2edge.checks.fidelity.checkpoints import TEST_SMALL_WIDE_DECODER as cfg

    sd = synthetic_state_dict(cfg, seed=seed)
    ref, folded = build_sam2(cfg, UPSTREAM), build_sam2(cfg, dataclasses.replace(UPSTREAM, token_fold="folded"))
    ref.load_state_dict(sd)
    folded.load_state_dict(sd)
    g = torch.Generator().manual_seed(seed)
    e, c = cfg.image_embedding_size, cfg.d_model
    emb, s0, s1 = (torch.randn(1, ch, s, s, generator=g) for ch, s in ((c, e), (c // 8, 4 * e), (c // 4, 2 * e)))
    coords = torch.rand(batch, 2, 2, generator=g) * cfg.image_size  # (B, 2, 2)
    labels = torch.tensor([[1.0, -1.0]] * batch)  # a click + the pad point
    with torch.no_grad():
        outs = []
        for model in (ref, folded):
            pe = model.sam_prompt_encoder
            outs.append(model.decode(emb, s0, s1, pe.embed_points(coords, labels), pe.no_mask_dense))
    for got, want in zip(outs[1], outs[0]):
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) <= 1e-5 * scale
        assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.999999


@pytest.mark.parametrize("seed", [3, 1])
@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "mask-input"])
def test_decode_given_its_image_projections_equals_upstream(seed, with_mask):
    """The click's prompt-independent work, computed before the prompt (``image_projections``, LiteRT's
    ``decoder_prep.tflite``), then handed to ``decode(given=...)``: every output equals upstream's decode of
    the same prompt, bit for bit with the same rewrites, at SAM 2.1's decoder width; ignored slots included."""
    from sam2edge.checks.fidelity.checkpoints import TEST_SMALL_WIDE_DECODER as cfg
    from sam2edge.export.litert import CPU_DECODER_REWRITES

    sd = synthetic_state_dict(cfg, seed=seed)
    ref, cpu = build_sam2(cfg, UPSTREAM), build_sam2(cfg, CPU_DECODER_REWRITES)
    ref.load_state_dict(sd)
    cpu.load_state_dict(sd)
    g = torch.Generator().manual_seed(seed)
    e, c = cfg.image_embedding_size, cfg.d_model
    emb, s0, s1 = (torch.randn(1, ch, s, s, generator=g) for ch, s in ((c, e), (c // 8, 4 * e), (c // 4, 2 * e)))
    coords = torch.rand(1, 4, 2, generator=g) * cfg.image_size  # (1, 4, 2)
    labels = torch.tensor([[1.0, 0.0, -1.0, 1.0]])  # (1, 4): the last slot is ignored (valid 0)
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    with torch.no_grad():
        pe = ref.sam_prompt_encoder
        sparse = pe.embed_points(coords, labels)  # (1, 4, C)
        dense = pe.embed_mask(torch.randn(1, 1, 4 * e, 4 * e, generator=g)) if with_mask else pe.no_mask_dense
        want = ref.decode(emb, s0, s1, sparse, dense, valid)
        given = cpu.image_projections(emb, dense)
        assert [tuple(t.shape) for t in given] == [(1, e * e, c // cfg.attention_downsample_rate)] * 3
        got = cpu.decode(emb, s0, s1, sparse, dense, valid, given)
        same = cpu.decode(emb, s0, s1, sparse, dense, valid)
    for a, b, w in zip(got, same, want):
        assert torch.equal(a, b)
        scale = float(w.abs().max())
        assert float((a - w).abs().max()) <= 1e-5 * scale


def test_fused_attention_exports_one_onnxruntime_node_per_attention(sd, tmp_path):
    """``attention_impl="ort_mha"``: the encoder traces to onnxruntime's ``MultiHeadAttention`` (one node per
    Hiera block, no Softmax left), which onnxruntime runs to eager's outputs; a bundle's optimisation step still
    refuses the contrib domain unless asked to let it through."""
    import warnings

    import numpy as np
    import onnx
    import onnxruntime as ort

    from sam2edge.export.onnx import ONNX_REWRITES, example_inputs, optimize
    from sam2edge.model.fused_attention import DOMAIN

    model = build_sam2(TEST_SMALL, dataclasses.replace(ONNX_REWRITES, attention_impl="ort_mha"))
    model.load_state_dict(sd)
    model.eval()
    (image,) = example_inputs(TEST_SMALL)[0]
    raw, opt = tmp_path / "raw.onnx", tmp_path / "opt.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        want = [t.numpy() for t in EncoderGraph(model)(image)]
        torch.onnx.export(
            EncoderGraph(model), (image,), str(raw), dynamo=False, custom_opsets={DOMAIN: 1}, input_names=["image"]
        )
    with pytest.raises(RuntimeError, match="non-standard op domains"):
        optimize(raw, opt)
    optimize(raw, opt, (DOMAIN,))
    ops = [n.op_type for n in onnx.load(str(opt)).graph.node]
    assert ops.count("MultiHeadAttention") == sum(TEST_SMALL.stages) and "Softmax" not in ops, ops
    got = ort.InferenceSession(str(opt), providers=["CPUExecutionProvider"]).run(None, {"image": image.numpy()})
    for w, g in zip(want, got, strict=True):
        assert np.abs(w - g).max() <= 1e-5 * np.abs(w).max()


@pytest.mark.parametrize("keys", ["permuted", "rows"])
def test_key_rows_fuse_the_score_transpose_into_onnxruntimes_product(sd, tmp_path, keys):
    """``score_keys="rows"`` (ONNX's form): onnxruntime runs a one-head block's q k^T as one product with its keys
    transposed in the kernel (FusedMatMul transB), no Transpose node left in that attention; the permuted form
    keeps a Transpose there. Both run to eager's outputs."""
    import warnings

    import numpy as np
    import onnx
    import onnxruntime as ort

    from sam2edge.export.onnx import ONNX_REWRITES, example_inputs, optimize

    assert TEST_SMALL.num_heads == 1  # block 0 (stage 1) attends with one head
    model = build_sam2(TEST_SMALL, dataclasses.replace(ONNX_REWRITES, score_keys=keys)).eval()
    model.load_state_dict(sd)
    (image,) = example_inputs(TEST_SMALL)[0]
    raw, opt, run = tmp_path / "raw.onnx", tmp_path / "opt.onnx", tmp_path / "run.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        want = [t.numpy() for t in EncoderGraph(model)(image)]
        torch.onnx.export(EncoderGraph(model), (image,), str(raw), dynamo=False, input_names=["image"])
    optimize(raw, opt)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(run)  # the graph onnxruntime runs, after its own fusions
    got = ort.InferenceSession(str(opt), so, providers=["CPUExecutionProvider"]).run(None, {"image": image.numpy()})
    for w, g in zip(want, got, strict=True):
        assert np.abs(w - g).max() <= 1e-5 * np.abs(w).max()
    block0 = [n for n in onnx.load(str(run)).graph.node if "/blocks.0/attn/" in n.name]
    transposes = [n.name for n in block0 if n.op_type == "Transpose"]
    fused_t = [n for n in block0 if n.op_type == "FusedMatMul" and any(a.name == "transB" and a.i for a in n.attribute)]
    if keys == "rows":
        assert not transposes and len(fused_t) == 1, (transposes, [n.name for n in block0])
    else:
        assert transposes and not fused_t, [n.name for n in block0]
