"""ONNX encoder: fp32 vs dynamic int8 vs static (calibrated, QDQ) int8, one interleaved run, 2 threads.

    .venv/bin/python benchmarks/bench_int8_static.py --work DIR [--config sam2.1-hiera-tiny] [--runs 5] [--fidelity]

Builds into ``DIR`` (a new folder) the synthetic checkpoint's ONNX encoder as the export makes it (``EncoderGraph``
with ONNX's rewrites, onnxruntime BASIC optimisation), unsmoothed and smoothed (``export.smooth``), and quantises
it: dynamic s8 (``export.onnx_int8``, the VNNI file), static s8 (``export.onnx_static``, products' outputs left
fp32, the shipped form) and static s8 with every product's output quantised too. Then times every file in
interleaved rounds (one encode each) and prints the medians; ``--fidelity`` adds the export's own end-to-end
measure (40 clicks vs eager fp32, fp32 ONNX decoder) per file. Run the timing under ``/work/bin/quiet``-style
exclusive use of the CPU: the static calibration alone needs several GB at 1024 px.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from sam2edge.config import get_config
from sam2edge.export import onnx as eo
from sam2edge.export import onnx_int8 as i8
from sam2edge.export import onnx_static as st
from sam2edge.export.wrappers import EncoderGraph, PointDecoderGraph
from sam2edge.runtime.backends import onnx as ob
from sam2edge.weights import synthetic_state_dict

# file stem -> quantiser of (optimised fp32 graph, destination, config)
VARIANTS = {
    "dynamic": lambda src, dst, cfg: i8.quantize_int8(src, dst, i8.VNNI_WEIGHTS),
    "static": lambda src, dst, cfg: st.quantize_static_int8(src, dst, cfg),
    "static-q-outputs": lambda src, dst, cfg: st.quantize_static_int8(src, dst, cfg, quantize_outputs=True),
}


def _trace(module, args, path: Path, role: str) -> None:
    names_in, names_out, dynamic = eo.IO[role]
    raw = path.with_name(f"raw_{path.name}")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(raw), dynamo=False, opset_version=eo.OPSET, do_constant_folding=True,
                          input_names=list(names_in), output_names=list(names_out), dynamic_axes=dynamic)  # fmt: skip
    eo.optimize(raw, path)
    raw.unlink()


def build(work: Path, config: str) -> tuple[list[str], dict]:
    """Every encoder file (name list, fp32 first) and its census; the fp32 decoder as decoder.onnx."""
    cfg = get_config(config)
    sd = synthetic_state_dict(cfg)
    names, census = [], {}
    for label, precision in (("plain", "fp32"), ("smoothed", "int8")):  # _model smooths the int8 encoder
        model = eo._model(sd, cfg, precision, eo.ONNX_REWRITES).eval()
        fp32 = work / f"fp32_{label}.onnx"
        _trace(EncoderGraph(model), eo.example_inputs(cfg)[0], fp32, "encoder")
        if label == "plain":
            names.append(fp32.name)
            _trace(PointDecoderGraph(model), eo.example_inputs(cfg)[1], work / "decoder.onnx", "decoder")
        for stem, quantise in VARIANTS.items():
            dst = work / f"{stem}_{label}.onnx"
            census[dst.name] = quantise(fp32, dst, cfg)
            names.append(dst.name)
        print("built", label, flush=True)
    return names, census


def timings(work: Path, names: list[str], runs: int) -> dict[str, list[float]]:
    sessions = {n: ob.make_session(work / n, threads=2) for n in names}
    s = int(sessions[names[0]].get_inputs()[0].shape[-1])
    x = np.random.default_rng(0).standard_normal((1, 3, s, s)).astype(np.float32)
    for sess in sessions.values():  # warm-up
        sess.run(None, {"image": x})
    out: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(runs):
        for n, sess in sessions.items():
            t = time.perf_counter()
            sess.run(None, {"image": x})
            out[n].append(1000 * (time.perf_counter() - t))
    return out


def fidelity(work: Path, names: list[str], config: str) -> dict[str, dict]:
    from sam2edge.checks.fidelity.measure import CachedReference, measure_backend
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend

    cfg = get_config(config)
    ref = CachedReference(EagerBackend.from_state_dict(synthetic_state_dict(cfg), cfg, UPSTREAM))
    out = {}
    for n in names:
        backend = ob.OnnxBackend.from_files(work / n, work / "decoder.onnx", cfg)
        out[n] = measure_backend(ref, backend, "int8", clicks=40)["end_to_end"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="a new folder for the graphs")
    p.add_argument("--config", default="sam2.1-hiera-tiny")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--fidelity", action="store_true", help="also the end-to-end mask IoU of every file")
    a = p.parse_args(argv)
    if a.work.exists():
        print(f"error: {a.work} exists; name a new folder for --work", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True)
    names, census = build(a.work, a.config)
    t = timings(a.work, names, a.runs)
    iou = fidelity(a.work, names, a.config) if a.fidelity else {}
    print("| encoder | median ms | min ms | quantised products | mask IoU worst (median) |\n|---|---|---|---|---|")
    for n in names:
        q = census.get(n, {}).get("quantized_matmuls", census.get(n, {}).get("MatMulInteger", "-"))
        e = iou.get(n)
        cell = f"{e['iou_worst']:.4f} ({e['iou_median']:.4f})" if e else "-"
        print(f"| {n} | {statistics.median(t[n]):.1f} | {min(t[n]):.1f} | {q} | {cell} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
