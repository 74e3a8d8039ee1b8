"""Full-size memory attention under LiteRT: the key layouts and key-bias forms of ``Rewrites``, int8, one run.

    python benchmarks/bench_memory_attention.py [--variants rows transposed bias-folded bias-folded-int8]
        [--runs 3] [--threads 2]

Builds the full-size Hiera-Tiny memory-attention graph (perturbed random weights, every memory and pointer
slot filled) with each variant of ``VARIANTS`` (``rope_keys`` "rows" / "transposed"; ``key_bias`` "folded" on
the transposed keys; "bias-folded-int8" with dynamic-range int8 weights), converts each with the LiteRT
exporter's converter, checks them against eager fp32 of
upstream's layout and times ``invoke`` interleaved. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sam2edge.config import HIERA_TINY, VIDEO_TINY
from sam2edge.export.litert import NamedOutputs, convert_graph
from sam2edge.export.video import MemoryAttentionGraph
from sam2edge.model import Rewrites
from sam2edge.model.memory_attention import rope_tables
from sam2edge.model.sam2_video import build_sam2_video
from sam2edge.runtime.video.bundle import VIDEO_GRAPHS

VARIANTS = {  # name -> (rewrites, LiteRT precision of export.litert.convert_graph)
    "rows": (Rewrites(rope_keys="rows"), "fp32"),
    "transposed": (Rewrites(rope_keys="transposed", key_bias="added"), "fp32"),
    "bias-folded": (Rewrites(rope_keys="transposed", key_bias="folded"), "fp32"),
    "bias-folded-int8": (Rewrites(rope_keys="transposed", key_bias="folded"), "int8"),  # dynamic-range weights
}


def sample_inputs() -> dict[str, torch.Tensor]:
    cfg, v = HIERA_TINY, VIDEO_TINY
    e, c, k, p = cfg.image_embedding_size, cfg.d_model, v.memory_slots, v.max_obj_ptrs
    cos, sin = rope_tables(c, e, v.attn_heads, v.rope_theta)
    values = (
        torch.randn(1, c, e, e),
        torch.randn(k, v.mem_dim, e, e),
        (torch.arange(k, dtype=torch.float32) % v.num_maskmem)[None],
        torch.ones(1, k),
        torch.randn(p, c),
        torch.linspace(0, 1, p)[None],
        torch.ones(1, p),
        cos,
        sin,
    )
    return dict(zip(VIDEO_GRAPHS["memory-attention"][1], values))


def main() -> None:
    from ai_edge_litert.interpreter import Interpreter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = ap.parse_args()
    torch.manual_seed(0)
    base = build_sam2_video(HIERA_TINY, VIDEO_TINY, Rewrites(rope_keys="rows")).eval()
    sd = {k: t + 0.02 * torch.randn_like(t) for k, t in base.state_dict().items()}
    x = sample_inputs()
    feed = {n: t.numpy() for n, t in x.items()}
    runners, outs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.variants:
            rewrites, precision = VARIANTS[layout]
            model = build_sam2_video(HIERA_TINY, VIDEO_TINY, rewrites).eval()
            model.load_state_dict(sd)
            graph = MemoryAttentionGraph(model).eval()
            with torch.no_grad():
                outs[f"{layout} eager"] = graph(**x).numpy()
            path = Path(tmp) / f"memory_attention_{layout}.tflite"
            convert_graph(NamedOutputs(graph, ("pix_feat",)), x, path, precision)
            it = Interpreter(model_path=str(path), num_threads=args.threads)
            runners[layout] = it.get_signature_runner()
            outs[f"{layout} litert"] = runners[layout](**feed)["pix_feat"]
    base.load_state_dict(sd)
    with torch.no_grad():
        ref = MemoryAttentionGraph(base).eval()(**x).numpy()  # upstream's key layout and bias add
    for name, out in outs.items():
        print(f"{name}: max |out - rows eager| {np.abs(out - ref).max():.3g} (scale {np.abs(ref).max():.3g})")
    times = {layout: [] for layout in args.variants}
    for _ in range(args.runs):
        for layout, run in runners.items():
            t0 = time.perf_counter()
            run(**feed)
            times[layout].append((time.perf_counter() - t0) * 1e3)
    print("| variant | invoke ms (each run) | median |\n|---|---|---|")
    for layout, ms in times.items():
        print(f"| {layout} | {' '.join(f'{t:.0f}' for t in ms)} | {np.median(ms):.0f} |")


if __name__ == "__main__":
    main()
