"""LiteRT's CPU decoder with other ``Rewrites`` settings, side by side: converted, checked, timed interleaved.

    python benchmarks/bench_cpu_decoder.py layer_norm=native layer_norm=safe [--runs 30] [--threads 2]
    python benchmarks/bench_cpu_decoder.py precision=int8

Each ``FIELD=VALUE`` builds the full-size Hiera-Tiny CPU decoder (``export.litert.CPU_DECODER_REWRITES`` with
that one field replaced; ``precision=int8|fp16``: the shipped graph converted at that precision), random
weights, 14 prompt tokens, given its image projections as the bundle's ``decoder_cpu.tflite`` is; converts it
with the exporter's converter, prints its largest output error against its own eager module, and times
``invoke`` in interleaved rounds beside the shipped settings. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from ai_edge_litert.interpreter import Interpreter

from sam2edge.config import get_config
from sam2edge.export import litert as L
from sam2edge.export.wrappers import GivenTokenDecoderGraph, ImageProjectionsGraph
from sam2edge.model.sam2 import build_sam2


def decoder_sample(model) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """(the CPU decoder graph, its named inputs: the decoder's samples plus the prep graph's projections)."""
    _, kwargs = L.graphs(model, 14)[L.DECODER_FILE]
    prep = L.NamedOutputs(ImageProjectionsGraph(model), L.IMAGE_PROJECTIONS)
    with torch.no_grad():
        given = prep(**{k: kwargs[k] for k in ("image_embeddings", "dense_prompt")})
    return L.NamedOutputs(GivenTokenDecoderGraph(model), L.DECODER_OUTPUTS), {**kwargs, **given}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+", help="FIELD=VALUE of Rewrites, one variant each")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg, base = get_config("sam2.1-hiera-tiny"), L.CPU_DECODER_REWRITES
    variants = {"shipped": (base, "fp32")}
    for spec in args.settings:
        field, value = spec.split("=", 1)
        if field == "precision":
            variants[spec] = (base, value)
            continue
        variants[spec] = (dataclasses.replace(base, **{field: int(value) if value.isdigit() else value}), "fp32")
    torch.manual_seed(0)
    state = {k: torch.randn_like(v) * 0.05 for k, v in build_sam2(cfg, base).state_dict().items()}
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (rw, precision) in variants.items():
            model = build_sam2(cfg, rw)
            model.load_state_dict(state)
            graph, inputs = decoder_sample(model)
            with torch.no_grad():
                want = graph(**inputs)
            path = Path(tmp) / f"{len(runners)}.tflite"
            L.convert_graph(graph, inputs, path, precision)
            run = Interpreter(model_path=str(path), num_threads=args.threads).get_signature_runner()
            feed = {k: v.numpy() for k, v in inputs.items()}
            got = run(**feed)
            err = max(float(np.abs(got[k] - w.numpy()).max() / (w.abs().max() + 1e-12)) for k, w in want.items())
            print(f"{name}: largest output error {err:.3g} of its scale")
            runners[name] = (run, feed)
        times = {n: [] for n in runners}
        for _ in range(args.runs):
            for n, (run, feed) in runners.items():
                t0 = time.perf_counter()
                run(**feed)
                times[n].append((time.perf_counter() - t0) * 1e3)
    for n, t in times.items():
        p10, p90 = np.percentile(t, 10), np.percentile(t, 90)
        print(f"{n:24s} p50 {statistics.median(t):6.2f} ms  (p10 {p10:.2f}, p90 {p90:.2f})")


if __name__ == "__main__":
    main()
