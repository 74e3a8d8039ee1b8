"""ONNX encoder: fp32 vs dynamic int8 vs static (calibrated, QDQ) int8, one interleaved run, 2 threads.

    .venv/bin/python benchmarks/bench_int8_static.py --work DIR [--config sam2.1-hiera-tiny] [--runs 5] [--fidelity]
        [--peer PEER_DIR] [--clicks 4]

Builds into ``DIR`` (a new folder) the synthetic checkpoint's ONNX encoder as the export makes it (``EncoderGraph``
with ONNX's rewrites, onnxruntime BASIC optimisation), unsmoothed and smoothed (``export.smooth``), and quantises
it: dynamic s8 (``export.onnx_int8``, the VNNI file), static s8 (``export.onnx_static``, products' outputs left
fp32, the shipped form) and static s8 with every product's output quantised too; and the smoothed dynamic file of
an encoder traced with onnxruntime's fused ``MultiHeadAttention`` (``Rewrites.attention_impl="ort_mha"``, a
contrib op: onnxruntime only, so no bundle ships it). Then times every file in
interleaved rounds (one encode each) and prints the medians; ``--fidelity`` adds the export's own end-to-end
measure (40 clicks vs eager fp32, fp32 ONNX decoder) per file. A ``--work`` folder that already holds the
files is timed as it is (no rebuild). ``--peer DIR`` (a peer export, ``checks.bench.peer``, made there from the
same synthetic weights when DIR does not exist) adds the peer's encoder to the rounds, and per round ``--clicks``
one-point clicks through the peer's decoder and through ours (decoder.onnx, fp32, as every int8 bundle ships it),
on features of the same photo. Run the timing under ``/work/bin/quiet``-style
exclusive use of the CPU: the static calibration alone needs several GB at 1024 px.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from sam2edge.config import get_config
from sam2edge.export import onnx as eo
from sam2edge.export import onnx_int8 as i8
from sam2edge.export import onnx_static as st
from sam2edge.export.pipeline import export_model
from sam2edge.export.wrappers import EncoderGraph, PointDecoderGraph
from sam2edge.model.fused_attention import DOMAIN as MHA_DOMAIN
from sam2edge.runtime.backends import onnx as ob
from sam2edge.weights import synthetic_state_dict

# file stem -> quantiser of (optimised fp32 graph, destination, config)
VARIANTS = {
    "dynamic": lambda src, dst, cfg: i8.quantize_int8(src, dst, i8.VNNI_WEIGHTS),
    "static": lambda src, dst, cfg: st.quantize_static_int8(src, dst, cfg),
    "static-q-outputs": lambda src, dst, cfg: st.quantize_static_int8(src, dst, cfg, quantize_outputs=True),
}


def _trace(module, args, path: Path, role: str, allowed_domains: tuple[str, ...] = ()) -> None:
    names_in, names_out, dynamic = eo.IO[role]
    raw = path.with_name(f"raw_{path.name}")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(raw), dynamo=False, opset_version=eo.OPSET, do_constant_folding=True,
                          custom_opsets={MHA_DOMAIN: 1}, input_names=list(names_in), output_names=list(names_out),
                          dynamic_axes=dynamic)  # fmt: skip
    eo.optimize(raw, path, allowed_domains)
    raw.unlink()


def build(work: Path, config: str) -> tuple[list[str], dict]:
    """Every encoder file (name list, fp32 first) and its census; the fp32 decoder as decoder.onnx."""
    cfg = get_config(config)
    sd = synthetic_state_dict(cfg)
    names, census = [], {}
    for label, precision in (("plain", "fp32"), ("smoothed", "int8")):  # export_model smooths the int8 encoder
        model = export_model(sd, cfg, precision, eo.ONNX_REWRITES).eval()
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
    # onnxruntime's fused MultiHeadAttention in place of MatMul-Softmax-MatMul (an onnxruntime-only graph, so not
    # in a bundle), smoothed and dynamically quantised as the export's VNNI file
    model = export_model(sd, cfg, "int8", replace(eo.ONNX_REWRITES, attention_impl="ort_mha")).eval()
    fused = work / "fp32_fused-attention.onnx"
    _trace(EncoderGraph(model), eo.example_inputs(cfg)[0], fused, "encoder", (MHA_DOMAIN,))
    census[FUSED] = VARIANTS["dynamic"](fused, work / FUSED, cfg)
    fused.unlink()
    return [*names, FUSED], census


FUSED = "dynamic_fused-attention.onnx"  # the smoothed dynamic file with Rewrites.attention_impl "ort_mha"
PEER_ENCODER, PEER_CLICK, CLICK = "peer encoder.onnx", "peer decoder.onnx (one click)", "decoder.onnx (one click)"


def _clickers(work: Path, peer: Path | None, config: str, x: np.ndarray) -> dict:
    """name -> a zero-argument one-click decode: ours (fp32 decoder.onnx) and the peer's, on features of ``x``."""
    from sam2edge.checks.bench.peer import PeerRunner

    cfg = get_config(config)
    ours = ob.OnnxBackend.from_files(work / "fp32_plain.onnx", work / "decoder.onnx", cfg, threads=2)
    feats = ours.encode(x)
    s = cfg.image_size
    coords, labels = np.array([[[0.4 * s, 0.55 * s], [0.0, 0.0]]], np.float32), np.array([[1.0, -1.0]], np.float32)
    out = {CLICK: lambda: ours.decode(feats, coords, labels, None)}
    if peer is not None:
        runner = PeerRunner(peer, cfg, 2)
        pf = runner.encode(x)
        out[PEER_CLICK] = lambda: runner.decode(pf, coords, labels)
    return out


def timings(work: Path, names: list[str], runs: int, peer: Path | None, config: str, clicks: int) -> dict:
    """Interleaved rounds: every encoder once, then ``clicks`` clicks of each decoder; ms per call."""
    from sam2edge.checks.photos import photo
    from sam2edge.runtime.preprocess import preprocess

    sessions = {n: ob.make_session(work / n, threads=2) for n in names}
    if peer is not None:
        from sam2edge.checks.bench.peer import ENCODER_FILE

        sessions[PEER_ENCODER] = ob.make_session(peer / ENCODER_FILE, threads=2)
    x = preprocess(photo("astronaut.png"), get_config(config).image_size).numpy()
    calls = {n: (lambda sess=sess: sess.run(None, {"image": x})) for n, sess in sessions.items()}
    clickers = _clickers(work, peer, config, x)
    for f in [*calls.values(), *clickers.values()]:  # warm-up
        f()
    out: dict[str, list[float]] = {n: [] for n in [*calls, *clickers]}
    for _ in range(runs):
        for n, f in [*calls.items(), *((n, f) for n, f in clickers.items() for _ in range(clicks))]:
            t = time.perf_counter()
            f()
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
    p.add_argument("--peer", type=Path, help="a peer export folder (made there when it does not exist)")
    p.add_argument("--clicks", type=int, default=4, help="clicks per decoder per round (default 4)")
    a = p.parse_args(argv)
    if a.work.exists():
        names = ["fp32_plain.onnx", *(f"{v}_{lab}.onnx" for lab in ("plain", "smoothed") for v in VARIANTS), FUSED]
        names = [n for n in names if (a.work / n).is_file()]
        census: dict = {}
    else:
        a.work.mkdir(parents=True)
        names, census = build(a.work, a.config)
    if a.peer is not None and not a.peer.exists():
        from sam2edge.checks.bench.peer import ensure_peer
        from sam2edge.checks.fidelity.upstream import upstream_from_state_dict

        cfg = get_config(a.config)
        sd = synthetic_state_dict(cfg)
        source = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}
        ensure_peer(a.peer, upstream_from_state_dict(sd, cfg), cfg, source)
    t = timings(a.work, names, a.runs, a.peer, a.config, a.clicks)
    iou = fidelity(a.work, names, a.config) if a.fidelity else {}
    print("| subject | median ms | min ms | quantised products | mask IoU worst (median) |\n|---|---|---|---|---|")
    for n in t:
        q = census.get(n, {}).get("quantized_matmuls", census.get(n, {}).get("MatMulInteger", "-"))
        e = iou.get(n)
        cell = f"{e['iou_worst']:.4f} ({e['iou_median']:.4f})" if e else "-"
        print(f"| {n} | {statistics.median(t[n]):.1f} | {min(t[n]):.1f} | {q} | {cell} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
