"""Memory attention over several objects: the shared layer-0 path (the frame's tokens once, object-independent
work once) and query slices give each object exactly its single-object answer, for SAM 2.1 and EdgeTAM widths,
with upstream's operations and with the export rewrites. End to end against upstream SAM2VideoPredictor:
tests/test_video_batch.py (the batched predictor passes one frame row for every object, so it takes this path).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sam2edge.config import get_config, get_video_config
from sam2edge.model.layers import UPSTREAM, Rewrites
from sam2edge.model.sam2_video import build_sam2_video

REWRITES = {"upstream": UPSTREAM, "export": Rewrites(texture_limit=0), "litert": Rewrites()}


def inputs(cfg, vcfg, B: int, model) -> tuple[torch.Tensor, ...]:
    """vision (1, C, e, e) and B objects' memory banks (random), as ``memory_attention_step`` takes them."""
    g = torch.Generator().manual_seed(B)
    e, K, P, M = cfg.image_embedding_size, vcfg.memory_slots, vcfg.max_obj_ptrs, vcfg.mem_dim
    vision = torch.randn(1, cfg.d_model, e, e, generator=g)
    shape = (B * K, M, e, e) if model.spatial_perceiver is None else (B * K, model.mem_pos.shape[1], M)
    tpos = torch.arange(K).float().remainder(vcfg.num_maskmem).repeat(B, 1)
    ptr_pos = torch.linspace(-1, 1, P).repeat(B, 1)
    ptrs = torch.randn(B * P, cfg.d_model, generator=g)
    return vision, torch.randn(*shape, generator=g), tpos, torch.ones(B, K), ptrs, ptr_pos, torch.ones(B, P)


def _model(config: str, rw: Rewrites, seed: int):
    cfg, vcfg = get_config(config), get_video_config(config)
    torch.manual_seed(seed)
    model = build_sam2_video(cfg, vcfg, rw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # no parameter left at its zero init
    return model, cfg, vcfg


def _row(args: tuple[torch.Tensor, ...], b: int, K: int, P: int) -> tuple[torch.Tensor, ...]:
    """Object b's inputs of a batched memory_attention_step call (vision shared)."""
    vision, mem, tpos, valid, ptrs, ptr_pos, ptr_valid = args
    return (
        vision,
        mem[b * K : (b + 1) * K],
        tpos[b : b + 1],
        valid[b : b + 1],
        ptrs[b * P : (b + 1) * P],
        ptr_pos[b : b + 1],
        ptr_valid[b : b + 1],
    )


@pytest.mark.parametrize("config", ["test-small", "test-small-edgetam"])
@pytest.mark.parametrize("rw_name", list(REWRITES))
@pytest.mark.parametrize("seed", [0, 1])
def test_shared_layer0_equals_one_object_at_a_time(config, rw_name, seed):
    model, cfg, vcfg = _model(config, REWRITES[rw_name], seed)
    B, K, P = 3, vcfg.memory_slots, vcfg.max_obj_ptrs
    args = list(inputs(cfg, vcfg, B, model))
    args[3] = torch.tensor([[1.0] * K, [1.0] * (K - 2) + [0.0] * 2, [1.0] + [0.0] * (K - 1)])  # unequal banks
    args[6] = torch.tensor([[1.0] * P, [1.0] * 3 + [0.0] * (P - 3), [0.0] * P])
    args = tuple(args)
    with torch.no_grad():
        shared = model.memory_attention_step(*args)  # vision (1, C, e, e): layer 0 shared
        copied = model.memory_attention_step(torch.cat([args[0]] * B), *args[1:])  # one frame row per object
        alone = torch.cat([model.memory_attention_step(*_row(args, b, K, P)) for b in range(B)])
        chunked_model, _, _ = _model(config, dataclasses.replace(REWRITES[rw_name], query_chunk=48), seed)
        chunked = chunked_model.memory_attention_step(*args)
    scale = alone.abs().max().item()
    assert scale > 1e-2
    for name, out in (("shared", shared), ("copied", copied), ("query slices", chunked)):
        err = (out - alone).abs().max().item()
        assert err <= 1e-5 * scale, f"{name}: max |diff| {err:.2e} vs one object at a time (scale {scale:.2f})"
    # the objects' memories differ, so their answers do
    assert (alone[0] - alone[2]).abs().max().item() > 1e-3 * scale


def test_query_chunk_rejects_negative():
    with pytest.raises(ValueError, match="query_chunk"):
        Rewrites(query_chunk=-1)
