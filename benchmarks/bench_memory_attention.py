"""The memory attention alone, batched over B objects: ms per call for B = 1, 2, 4, for rewrite variants.

Full memory (every one of the K spatial slots and P pointer slots valid), random weights (timing only), one
process. Prints ms per call and per object, and each variant's max abs difference from the first variant
(the slicing rewrites are exact: the same function).

Usage: .venv/bin/python benchmarks/bench_memory_attention.py [--config sam2.1-hiera-tiny] [--batches 1,2,4]
       [--threads 2] [--reps 2] [--chunks 0,1024]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sam2edge.config import get_config, get_video_config  # noqa: E402
from sam2edge.model.layers import UPSTREAM, Rewrites  # noqa: E402
from sam2edge.model.sam2_video import build_sam2_video  # noqa: E402


def inputs(cfg, vcfg, B: int, model) -> tuple[torch.Tensor, ...]:
    """vision (1, C, e, e) and B objects' full memory banks (see ``memory_attention_step``)."""
    g = torch.Generator().manual_seed(B)
    e, K, P, M = cfg.image_embedding_size, vcfg.memory_slots, vcfg.max_obj_ptrs, vcfg.mem_dim
    vision = torch.randn(1, cfg.d_model, e, e, generator=g)
    if model.spatial_perceiver is None:
        mem = torch.randn(B * K, M, e, e, generator=g)
    else:
        mem = torch.randn(B * K, model.mem_pos.shape[1], M, generator=g)
    tpos = torch.arange(K).float().remainder(vcfg.num_maskmem).repeat(B, 1)
    ptrs = torch.randn(B * P, cfg.d_model, generator=g)
    ptr_pos = torch.linspace(-1, 1, P).repeat(B, 1)
    return vision, mem, tpos, torch.ones(B, K), ptrs, ptr_pos, torch.ones(B, P)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunks", default="0,1024", help="Rewrites.query_chunk values to try")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg, vcfg = get_config(args.config), get_video_config(args.config)
    chunks = [int(c) for c in args.chunks.split(",")]
    variants = {}
    for base, rw in (("upstream ops (sdpa)", UPSTREAM), ("export ops (math, folded)", Rewrites(texture_limit=0))):
        for c in chunks:
            variants[f"{base}, query_chunk={c}"] = dataclasses.replace(rw, query_chunk=c)
    torch.manual_seed(0)
    ref = build_sam2_video(cfg, vcfg, UPSTREAM)
    state = ref.state_dict()
    batches = [int(b) for b in args.batches.split(",")]
    data = {B: inputs(cfg, vcfg, B, ref) for B in batches}
    first = {}
    print(f"{args.config}, {args.threads} threads; ms per call (per object), max |diff| vs the first variant")
    for name, rw in variants.items():
        model = build_sam2_video(cfg, vcfg, rw)
        model.load_state_dict(state, strict=False)
        model.memory_attention_step(*data[batches[0]])  # warm-up
        cells = []
        for B in batches:
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                out = model.memory_attention_step(*data[B])
                times.append(time.perf_counter() - t)
            diff = (out - first[B]).abs().max().item() if B in first else 0.0
            first.setdefault(B, out)
            ms = 1e3 * statistics.median(times)
            cells.append(f"B={B}: {ms:7.0f} ({ms / B:6.0f}) diff {diff:.1e}")
        print(f"{name:<42} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
