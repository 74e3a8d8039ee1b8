"""onnxruntime (an ONNX bundle) vs upstream eager ``sam2``: encoder and per-click decoder latency, one run.

    .venv/bin/python benchmarks/bench_onnx.py --bundle /tmp/onnx-fp32 [--threads 2] [--repeats 5] [--clicks 20]

Both sides get the same weights (the bundle's checkpoint, synthetic by default), the same real photo
(astronaut, preprocessed to S x S) and the same thread count. Encoder: ``encode`` of one image. Click:
prompt encoder + mask decoder for one positive click (upstream: ``sam_prompt_encoder`` +
``sam_mask_decoder`` as ``SAM2ImagePredictor._predict``; ONNX: ``decoder.onnx``). One warm-up each, then
the two sides alternate run by run (fair under changing machine load); medians. The ratio printed is
onnxruntime time / upstream time (< 1 = faster than upstream).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def timed_pair(a, b, repeats: int) -> tuple[float, float]:
    """Medians of ``a`` and ``b``, run alternately (one warm-up each) so that load drift hits both alike."""
    a()
    b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, runs in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True, help="ONNX bundle folder written by `sam2edge export --target onnx`")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed encoder runs (median; default 5)")
    p.add_argument("--clicks", type=int, default=20, help="timed decoder runs (median; default 20)")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)

    from sam2edge.checks.fidelity import compare, photo
    from sam2edge.checks.upstream import UpstreamRunner, upstream_from_state_dict
    from sam2edge.export.bundle import load_card
    from sam2edge.runtime.onnx_backend import OnnxBackend
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.weights import SYNTHETIC, load_weights

    card = load_card(Path(args.bundle))
    ours = OnnxBackend.from_bundle(args.bundle, threads=args.threads)
    cfg = ours.cfg
    ckpt = card["source"]["checkpoint"]
    sd, _ = load_weights(None if ckpt == SYNTHETIC else ckpt, cfg)
    torch.set_num_threads(args.threads)
    upstream = UpstreamRunner(upstream_from_state_dict(sd, cfg), cfg)

    s = cfg.image_size
    x = preprocess(photo("astronaut.png"), s).numpy()
    coords = np.array([[[0.45 * s, 0.3 * s], [0.0, 0.0]]], np.float32)  # one click + upstream's pad point
    labels = np.array([[1.0, -1.0]], np.float32)

    res = {
        "bundle": str(args.bundle),
        "precision": card["precision"],
        "resolution": s,
        "threads": args.threads,
        "providers": ours.providers,
    }
    with torch.inference_mode():
        up_feats, feats = upstream.encode(x), ours.encode(x)
        res["upstream_encoder_s"], res["onnx_encoder_s"] = timed_pair(
            lambda: upstream.encode(x), lambda: ours.encode(x), args.repeats
        )
        res["upstream_click_s"], res["onnx_click_s"] = timed_pair(
            lambda: upstream.decode(up_feats, coords, labels),
            lambda: ours.decode(feats, coords, labels, None),
            args.clicks,
        )
    res["encoder_ratio"] = res["onnx_encoder_s"] / res["upstream_encoder_s"]
    res["click_ratio"] = res["onnx_click_s"] / res["upstream_click_s"]
    res["image_embeddings_vs_upstream"] = compare(feats.image_embed, up_feats["image_embed"].numpy())

    print(f"bundle {args.bundle}: {card['precision']} {s}px, {args.threads} threads, {ours.providers[0]}")
    print(f"{'':<10}{'upstream eager':>16}{'onnxruntime':>14}{'ratio':>8}")
    for what, key, n in (("encoder", "encoder", args.repeats), ("click", "click", args.clicks)):
        up, on = res[f"upstream_{key}_s"], res[f"onnx_{key}_s"]
        print(f"{what:<10}{up * 1e3:>13.1f} ms{on * 1e3:>11.1f} ms{on / up:>7.2f}x  (median of {n})")
    cos = res["image_embeddings_vs_upstream"]["cosine"]
    print(f"ratio = onnxruntime / upstream (< 1 is faster); image_embeddings cosine vs upstream {cos:.7f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
