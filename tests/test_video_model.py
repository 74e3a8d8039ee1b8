"""The video stages are export-friendly (small config): empty slots are exact no-ops, every rewrite agrees,
torch.export traces them with no tensor above rank 4 and no complex tensor, and the HF names map."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import nn

from sam2edge.config import TEST_SMALL, VIDEO_TEST_SMALL
from sam2edge.model import UPSTREAM, Rewrites
from sam2edge.model.sam2_video import build_sam2_video
from sam2edge.weights.video import synthetic_video_state_dict

C, M, E = TEST_SMALL.d_model, VIDEO_TEST_SMALL.mem_dim, TEST_SMALL.image_embedding_size


@pytest.fixture(scope="module")
def sd():
    return synthetic_video_state_dict(TEST_SMALL, VIDEO_TEST_SMALL, seed=3)


def _model(sd, rw=None, **vcfg_changes):
    model = build_sam2_video(TEST_SMALL, dataclasses.replace(VIDEO_TEST_SMALL, **vcfg_changes), rw or Rewrites())
    model.load_state_dict(sd)
    return model


def _memory_inputs(k: int, p: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, C, E, E, generator=g),
        torch.randn(k, M, E, E, generator=g),
        torch.randint(0, 7, (1, k), generator=g).float(),
        torch.randn(p, C, generator=g),
        torch.randn(1, p, generator=g),
    )


@pytest.mark.parametrize("key_bias", ["added", "folded"])
@torch.no_grad()
def test_empty_slots_are_exact_no_ops(sd, key_bias):
    """7 + 16 slots with garbage in the empty ones == a graph holding only the filled slots."""
    rw = Rewrites(key_bias=key_bias)
    vision, feats, tpos, ptrs, ptr_pos = _memory_inputs(7, 16)
    mem_keep, ptr_keep = [0, 1, 4], [0, 2, 3, 9, 15]
    mem_valid = torch.zeros(1, 7)
    mem_valid[0, mem_keep] = 1.0
    ptr_valid = torch.zeros(1, 16)
    ptr_valid[0, ptr_keep] = 1.0
    full = _model(sd, rw).memory_attention_step(vision, feats, tpos, mem_valid, ptrs, ptr_pos, ptr_valid)
    small = _model(sd, rw, memory_slots=3, max_obj_ptrs=5).memory_attention_step(
        vision,
        feats[mem_keep],
        tpos[:, mem_keep],
        torch.ones(1, 3),
        ptrs[ptr_keep],
        ptr_pos[:, ptr_keep],
        torch.ones(1, 5),
    )
    assert (full - small).abs().max() <= 1e-5 * small.abs().max()
    changed = _model(sd, rw).memory_attention_step(vision, feats, tpos, torch.ones(1, 7), ptrs, ptr_pos, ptr_valid)
    assert (changed - full).abs().max() > 1e-3 * full.abs().max()  # the filled slots do matter


class _Stages(nn.Module):
    """Every per-frame stage in one graph, as the export cuts them."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, vision, feats, tpos, mem_valid, ptrs, ptr_pos, ptr_valid, s0, s1, sparse, low, mask):
        m = self.model
        pix = m.memory_attention_step(vision, feats, tpos, mem_valid, ptrs, ptr_pos, ptr_valid)
        dense = m.sam_prompt_encoder.embed_mask(low)
        masks, iou, score, obj_ptrs = m.decode_video(pix, s0, s1, sparse, dense)
        memory = m.encode_memory(vision, masks[:, :1], torch.ones(1, 1), score)
        return pix, masks, iou, score, obj_ptrs, memory, m.downsample_mask(mask), m.no_memory(vision)


def _stage_args():
    vision, feats, tpos, ptrs, ptr_pos = _memory_inputs(7, 16, seed=1)
    valid = torch.tensor([[1.0, 1, 0, 1, 0, 0, 0]]), (torch.arange(16) < 6).float()[None]
    s = TEST_SMALL.image_size
    return (
        vision,
        feats,
        tpos,
        valid[0],
        ptrs,
        ptr_pos,
        valid[1],
        torch.randn(1, C // 8, 4 * E, 4 * E),
        torch.randn(1, C // 4, 2 * E, 2 * E),
        torch.randn(1, 3, C),
        torch.randn(1, 1, 4 * E, 4 * E),
        (torch.rand(1, 1, s, s) > 0.5).float(),
    )


@torch.no_grad()
def test_export_rewrites_agree_with_upstream_ops(sd):
    args = _stage_args()
    ref = _Stages(_model(sd, UPSTREAM))(*args)
    variants = (
        Rewrites(),
        Rewrites(attention_rank=3),
        Rewrites(rope_keys="rows"),
        Rewrites(key_bias="folded"),
        Rewrites(key_bias="folded", attention_rank=3),
    )
    for rw in variants:
        got = _Stages(_model(sd, rw))(*args)
        for name, a, b in zip(("pix", "masks", "iou", "score", "ptrs", "memory", "mask", "nomem"), got, ref):
            assert (a - b).abs().max() <= 1e-4 * b.abs().max(), (rw, name)


def test_stages_export_with_rank_4_and_no_complex(sd):
    ep = torch.export.export(_Stages(_model(sd)), _stage_args())
    for node in ep.graph_module.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(v, torch.Tensor):
                assert v.dim() <= 4, f"rank-{v.dim()} tensor at {node.op} {node.target}"
                assert not v.is_complex(), f"complex tensor at {node.op} {node.target}"


def test_hf_video_names_cover_transformers_sam2_video_model():
    """Names and shapes against transformers' Sam2VideoModel (Hiera-Tiny defaults, random init)."""
    transformers = pytest.importorskip("transformers")
    from sam2edge.config import HIERA_TINY, VIDEO_TINY
    from sam2edge.weights.keymap import HF_VIDEO_ONLY
    from sam2edge.weights.video import map_video_tensors, video_expected_shapes, video_hf_name

    with torch.device("meta"):
        hf = transformers.Sam2VideoModel(transformers.Sam2VideoConfig()).state_dict()
    hf = {k: torch.empty(v.shape) for k, v in hf.items()}
    mapped = map_video_tensors(hf, "hf", HIERA_TINY, VIDEO_TINY, "transformers")
    expected = video_expected_shapes(HIERA_TINY, VIDEO_TINY)
    assert set(mapped) == set(expected)
    used = {video_hf_name(k, 12) for k in expected}
    assert not [k for k in hf if k.startswith(HF_VIDEO_ONLY) and k not in used]


def test_memory_bank_overflow_keeps_nearest_conditioning_frames():
    """More conditioning frames than slots: the farthest give way, counted in ``dropped``."""
    import numpy as np

    from sam2edge.runtime.video.memory_bank import FrameOutput, ObjectMemory, select_memory

    mem = ObjectMemory()
    for t in range(12):
        out = FrameOutput(np.zeros((1, 1, 4 * E, 4 * E), np.float32), np.full((1, C), t, np.float32), np.ones((1, 1)))
        out.maskmem = np.full((1, M, E, E), t, np.float32)
        (mem.cond if t % 3 == 0 else mem.non_cond)[t] = out  # conditioning frames 0, 3, 6, 9
    sel = select_memory(mem, 11, 12, TEST_SMALL, VIDEO_TEST_SMALL, reverse=False)
    # upstream would attend to 4 conditioning frames + frames 5, 7, 8, 10 (6 and 9 are conditioning): 8 > 7
    assert sel.dropped == 1 and len(sel.spatial) == 7
    assert 0 not in sel.spatial and {9, 6, 3, 5, 7, 8, 10} == set(sel.spatial)
    assert sel.inputs.mem_valid.sum() == 7 and (sel.inputs.mem_feats[:, 0, 0, 0] == sel.spatial).all()


@pytest.mark.parametrize("size", ["small", "base-plus", "large"])
def test_every_size_loads_from_its_checkpoint(tmp_path, size):
    """A video checkpoint of each size is detected from its tensors (no config given) and loads strictly; the same
    file with another size's config is one line naming both."""
    from sam2edge.config import SIZES, get_config, get_video_config
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor
    from sam2edge.weights.sizes import SizeError

    reduced = SIZES[size][1]
    cfg, vcfg = get_config(reduced), get_video_config(reduced)
    path = tmp_path / "video.pt"
    torch.save({"model": synthetic_video_state_dict(cfg, vcfg, seed=1)}, path)
    pred = Sam2VideoPredictor.from_checkpoint(str(path))
    assert (pred.backend.cfg, pred.backend.vcfg) == (cfg, vcfg)
    with pytest.raises(SizeError, match=re.escape(f"holds {reduced} weights but the config is test-small;")):
        Sam2VideoPredictor.from_checkpoint(str(path), TEST_SMALL, VIDEO_TEST_SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "base-plus", "large"])
def test_upstream_full_size_video_model_loads(size):
    """Upstream's own video model of each size (build_sam2_video_predictor from its yaml): its state dict names the
    size (detect_config) and every tensor of the video model maps strictly into ours at that size."""
    from sam2edge.config import SIZES, get_config, get_video_config
    from sam2edge.weights.load import expected_shapes, to_sam2edge
    from sam2edge.weights.sizes import detect_config
    from sam2edge.weights.video import map_video_tensors
    from tests.video_oracles import upstream_video_predictor

    full, _, yaml = SIZES[size]
    cfg, vcfg = get_config(full), get_video_config(full)
    sd = upstream_video_predictor(cfg, vcfg, official_yaml=yaml).state_dict()
    assert detect_config(sd) == full
    mapped = to_sam2edge(sd, "meta", expected_shapes(cfg), "upstream")
    mapped.update(map_video_tensors(sd, "meta", cfg, vcfg, "upstream"))
    model = build_sam2_video(cfg, vcfg)
    assert model.load_state_dict(mapped, strict=True) is not None
