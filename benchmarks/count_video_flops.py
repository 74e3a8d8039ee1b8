"""FLOPs per tracked frame: the shared frame encoder against each object's memory attention, decoder and memory
encoder, and the bound they set on the cost of a second object.

torch.utils.flop_counter.FlopCounterMode on the sam2edge eager model with the export operations (attention written
as q k^T, softmax, @ v, which the counter sees; it does not count a CPU F.scaled_dot_product_attention; memory
values folded: attention over the raw memory, then v_proj, exact and the fewest FLOPs), random weights, full
memory (every one of the K spatial and P pointer slots valid), one frame of ``image_size`` px. It
counts matrix products and convolutions (2 FLOPs a multiply-add), not element-wise work or softmax. Objects beyond
the first share the encoder and the object-independent half of memory-attention layer 0 (norm1, self-attention,
norm2, the cross-attention's q projection): per object = FLOPs(B = 2) - FLOPs(B = 1) of each stage.

The bound: with every FLOP at the same rate, the second object costs per_object / (encoder + shared + per_object)
of the first; at most 0.5 needs per_object <= encoder + shared.

Usage: .venv/bin/python benchmarks/count_video_flops.py [--configs sam2.1-hiera-tiny,edgetam] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_memory_attention import inputs  # noqa: E402

from sam2edge.config import get_config, get_video_config  # noqa: E402
from sam2edge.model.layers import Rewrites  # noqa: E402
from sam2edge.model.sam2_video import build_sam2_video  # noqa: E402
from sam2edge.runtime.video.backend import EagerVideoBackend, FrameFeatures, MemoryInputs  # noqa: E402


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def count(config: str) -> dict[str, float]:
    """GFLOP of one frame: encoder; memory attention, decoder and memory encoder at B = 1 and 2 objects."""
    cfg, vcfg = get_config(config), get_video_config(config)
    torch.manual_seed(0)
    model = build_sam2_video(cfg, vcfg, Rewrites(texture_limit=0, query_chunk=0))
    backend = EagerVideoBackend(model.requires_grad_(False))
    s, e = cfg.image_size, cfg.image_embedding_size
    image = np.random.default_rng(0).standard_normal((1, 3, s, s)).astype(np.float32)
    out = {"encoder": flops(lambda: backend.encode_frame(image))}
    feats: FrameFeatures = backend.encode_frame(image)
    for B in (1, 2):
        vision, *mem = (t.numpy() for t in inputs(cfg, vcfg, B, backend.model))
        m = MemoryInputs(*mem)
        pix = np.repeat(feats.vision, B, axis=0)
        coords, labels = np.zeros((B, 2, 2), np.float32), np.full((B, 2), -1.0, np.float32)
        low = np.random.default_rng(1).standard_normal((B, 1, 4 * e, 4 * e)).astype(np.float32)
        score = np.ones((B, 1), np.float32)
        out[f"memory_attention_b{B}"] = flops(lambda: backend.memory_attention(feats.vision, m))  # noqa: B023
        out[f"decoder_b{B}"] = flops(lambda: backend.decode(pix, feats, coords, labels, None))  # noqa: B023
        out[f"memory_encoder_b{B}"] = flops(lambda: backend.encode_memory(feats.vision, low, False, score))  # noqa: B023
    del vision
    return {k: v / 1e9 for k, v in out.items()}


def summary(config: str, g: dict[str, float]) -> dict[str, float]:
    stages = ("memory_attention", "decoder", "memory_encoder")
    per = {s: g[f"{s}_b2"] - g[f"{s}_b1"] for s in stages}
    shared_ma = g["memory_attention_b1"] - per["memory_attention"]  # layer 0's object-independent half
    per_object = sum(per.values())
    shared = g["encoder"] + shared_ma
    return {
        "config": config,
        "encoder_gflop": round(g["encoder"], 1),
        "shared_memory_attention_gflop": round(shared_ma, 1),
        **{f"{s}_per_object_gflop": round(v, 1) for s, v in per.items()},
        "per_object_gflop": round(per_object, 1),
        "first_object_frame_gflop": round(shared + per_object, 1),
        "second_object_bound": round(per_object / (shared + per_object), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="sam2.1-hiera-tiny,edgetam")
    ap.add_argument("--json", help="also write the summaries here")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    rows = [summary(c, count(c)) for c in args.configs.split(",")]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
