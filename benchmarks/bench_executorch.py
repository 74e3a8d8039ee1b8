"""ExecuTorch (an XNNPACK bundle) vs upstream eager ``sam2``: encoder and per-click latency, one run.

    .venv/bin/python benchmarks/bench_executorch.py --bundle /tmp/et_full/fp32 [--threads 2] [--repeats 5]

Both sides get the same weights (the bundle's checkpoint, synthetic by default), the same real photo
(astronaut, preprocessed to S x S) and the same thread count (ExecuTorch's threadpool is reset to it).
Encoder: one ``encode`` (encoder.pte; upstream: ``image_encoder`` + conv_s0/s1 + no_mem_embed). Click: one
positive click through prompt encoding + mask decoder (decoder.pte with the prompt encoder inside;
upstream: ``sam_prompt_encoder`` + ``sam_mask_decoder``). One warm-up each, then the median of
``--repeats`` encoder runs and ``--clicks`` click runs, the two subjects interleaved run by run so that
machine drift hits both alike. Ratio = ExecuTorch / upstream (< 1 = faster than upstream).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """One warm-up call per function, then ``repeats`` rounds calling each once (times in seconds)."""
    for fn in fns.values():
        fn()
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[k].append(time.perf_counter() - t0)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True, help="bundle folder written by `sam2edge export --target executorch`")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed encoder runs each (median; default 5)")
    p.add_argument("--clicks", type=int, default=20, help="timed click runs each (median; default 20)")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)

    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    from sam2edge.checks.fidelity import compare, photo
    from sam2edge.checks.upstream import UpstreamRunner, upstream_from_state_dict
    from sam2edge.export.bundle import load_card
    from sam2edge.runtime.executorch_backend import ExecuTorchBackend
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.weights import SYNTHETIC, load_weights

    card = load_card(Path(args.bundle))
    _unsafe_reset_threadpool(args.threads)
    ours = ExecuTorchBackend.from_bundle(args.bundle)
    cfg = ours.cfg
    ckpt = card["source"]["checkpoint"]
    sd, _ = load_weights(None if ckpt == SYNTHETIC else ckpt, cfg)
    torch.set_num_threads(args.threads)
    upstream = UpstreamRunner(upstream_from_state_dict(sd, cfg), cfg)

    s = cfg.image_size
    x = preprocess(photo("astronaut.png"), s).numpy()
    coords = np.array([[[0.45 * s, 0.3 * s], [0.0, 0.0]]], np.float32)  # one click + upstream's pad point
    labels = np.array([[1.0, -1.0]], np.float32)

    with torch.inference_mode():
        up_feats = upstream.encode(x)
        feats = ours.encode(x)
        enc = interleaved({"upstream": lambda: upstream.encode(x), "executorch": lambda: ours.encode(x)}, args.repeats)
        click = interleaved(
            {
                "upstream": lambda: upstream.decode(up_feats, coords, labels),
                "executorch": lambda: ours.decode(feats, coords, labels, None),
            },
            args.clicks,
        )
    res = {
        "bundle": str(args.bundle),
        "precision": card["precision"],
        "resolution": s,
        "threads": args.threads,
        "loadavg_1min": os.getloadavg()[0],
        "encoder_runs_s": enc,
        "click_runs_s": click,
    }
    for what, runs in (("encoder", enc), ("click", click)):
        for who in ("upstream", "executorch"):
            res[f"{who}_{what}_s"] = statistics.median(runs[who])
        res[f"{what}_ratio"] = res[f"executorch_{what}_s"] / res[f"upstream_{what}_s"]
    res["image_embeddings_vs_upstream"] = compare(feats.image_embed, up_feats["image_embed"].numpy())

    print(f"bundle {args.bundle}: ExecuTorch XNNPACK {card['precision']} {s}px, {args.threads} threads")
    print(f"{'':<10}{'upstream eager':>16}{'ExecuTorch':>14}{'ratio':>8}")
    for what, n in (("encoder", args.repeats), ("click", args.clicks)):
        up, et = res[f"upstream_{what}_s"], res[f"executorch_{what}_s"]
        print(f"{what:<10}{up * 1e3:>13.1f} ms{et * 1e3:>11.1f} ms{et / up:>7.2f}x  (median of {n})")
    cos = res["image_embeddings_vs_upstream"]["cosine"]
    print(f"ratio = ExecuTorch / upstream (< 1 is faster); image_embeddings cosine vs upstream {cos:.7f}; "
          f"1-min load average {res['loadavg_1min']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
