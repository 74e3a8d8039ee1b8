"""ONNX graph forms: the shipped graph next to exact re-expressions of it, interleaved on 2 threads.

    .venv/bin/python benchmarks/bench_onnx_forms.py --work DIR [--graph encoder|decoder] [--config sam2.1-hiera-tiny]
        [--runs 5] [--forms NAME,...] [--peer PEER_DIR] [--profile] [--gap 0.25]

Each form is ``export.onnx.ONNX_REWRITES`` with the fields in ``FORMS[graph]`` replaced; its graph is traced and
optimised as the export does (``EncoderGraph`` / ``PointDecoderGraph``, onnxruntime BASIC optimisation) from the
synthetic checkpoint. Encoders also get their int8 file, quantised as the int8 export's VNNI file (smoothed,
``onnx_int8.quantize_int8`` with s8 weights, nothing kept fp32); decoders ship fp32 at every precision. Every
file's outputs are compared with the first form's fp32 file's (an encode of a real photo; a one-point click on
random features), largest difference relative to the output's scale, then all are timed in interleaved rounds
(one call each, after ``--gap`` seconds idle), with the peer's encoder or decoder (``--peer``, a
``checks.bench.peer`` export; its click on its own features of the photo) as the yardstick. ``--profile`` adds
each file's onnxruntime profile, summed per operator type. A ``--work`` folder that holds the files is timed as it
is. Nothing else should run on the CPU meanwhile.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from sam2edge.checks.bench.bench import IDLE_S
from sam2edge.checks.bench.peer import ENCODER_FILE as PEER_ENCODER
from sam2edge.config import get_config
from sam2edge.export import onnx as eo
from sam2edge.export import onnx_int8 as i8
from sam2edge.export.pipeline import export_model
from sam2edge.export.wrappers import EncoderGraph, PointDecoderGraph
from sam2edge.runtime.backends import onnx as ob
from sam2edge.weights import synthetic_state_dict

# graph -> form name -> the ONNX_REWRITES fields it replaces; the first is the earlier form, the reference
FORMS = {
    "encoder": {
        "fused-whole": {"qkv": "fused", "image_query_chunk": 0},  # q / k / v sliced from one product, attention whole
        "split-whole": {"image_query_chunk": 0},
        "fused-chunk512": {"qkv": "fused"},
        "shipped": {},  # ONNX_REWRITES: q / k / v as three products, global attention in 512-query slices
        "chunk1024": {"image_query_chunk": 1024},
        "maxima": {"q_pool": "maxima"},
        "permuted": {"score_keys": "permuted"},  # the keys permuted once to (B, heads, d, N) (before: rows, fused)
    },
    "decoder": {
        "native": {"transposed_conv": "native", "upscale_layout": "nchw"},  # onnxruntime's ConvTranspose, NCHW
        "shipped": {},  # ONNX_REWRITES: the upscaling as GEMMs, channels-last
        "matmul-nchw": {"upscale_layout": "nchw"},
        "projected": {"token_fold": "projected"},  # the cross-attentions project the image (upstream's products)
    },
}
GRAPHS = {"encoder": EncoderGraph, "decoder": PointDecoderGraph}
PRECISIONS = {"encoder": ("fp32", "int8"), "decoder": ("fp32",)}  # decoders ship fp32 at every precision


def _click(cfg) -> tuple[np.ndarray, np.ndarray]:
    """The one-point click every decoder (ours and the peer's) is timed on: coords (1, 2, 2), labels (1, 2)."""
    s = cfg.image_size
    return np.array([[[0.4 * s, 0.55 * s], [0.0, 0.0]]], np.float32), np.array([[1.0, -1.0]], np.float32)


PEER = "peer fp32"
GAP_S = IDLE_S  # idle seconds before each timed call, as `sam2edge bench` waits (onnxruntime's workers spin after one)


def build(work: Path, config: str, graph: str, forms: list[str]) -> list[str]:
    """fp32_FORM.onnx (and for encoders int8_FORM.onnx) per form: the file names, in that order."""
    cfg = get_config(config)
    sd = synthetic_state_dict(cfg)
    names = []
    for form in forms:
        rw = replace(eo.ONNX_REWRITES, **FORMS[graph][form])
        for precision in PRECISIONS[graph]:  # export_model smooths the int8 encoder, as the export does
            model = export_model(sd, cfg, precision, rw).eval()
            raw, opt = work / f"raw_{precision}_{form}.onnx", work / f"opt_{precision}_{form}.onnx"
            names_in, names_out, dynamic = eo.IO[graph]
            args = eo.example_inputs(cfg)[0 if graph == "encoder" else 1]
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(GRAPHS[graph](model), args, str(raw), dynamo=False, opset_version=eo.OPSET,
                                  do_constant_folding=True, input_names=list(names_in),
                                  output_names=list(names_out), dynamic_axes=dynamic)  # fmt: skip
            eo.optimize(raw, opt)
            raw.unlink()
            dst = work / f"{precision}_{form}.onnx"
            if precision == "int8":
                i8.quantize_int8(opt, dst, i8.VNNI_WEIGHTS)
                opt.unlink()
            else:
                opt.rename(dst)
            names.append(dst.name)
        print("built", form, flush=True)
    return names


def feeds(graph: str, config: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The feed every file of ``graph`` gets (an encode of astronaut.png, or a one-point click on random features
    of the encoder's shapes) and the preprocessed photo (the peer's click runs on its own features of it)."""
    from sam2edge.checks.photos import photo
    from sam2edge.runtime.preprocess import preprocess

    cfg = get_config(config)
    x = preprocess(photo("astronaut.png"), cfg.image_size).numpy()
    if graph == "encoder":
        return {"image": x}, x
    rng, e, c = np.random.default_rng(0), cfg.image_embedding_size, cfg.d_model
    shapes = {
        "image_embeddings": (1, c, e, e),
        "feat_s0": (1, c // 8, 4 * e, 4 * e),
        "feat_s1": (1, c // 4, 2 * e, 2 * e),
    }
    feed = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    coords, labels = _click(cfg)
    feed |= {
        "point_coords": coords,
        "point_labels": labels,
        "mask_input": np.zeros((1, 1, 4 * e, 4 * e), np.float32),
        "has_mask_input": np.zeros(1, np.float32),
    }
    return feed, x


def gflop(config: str, graph: str, form: str, sd: dict) -> tuple[float, dict[str, float]]:
    """A call's matrix-product and convolution GFLOP in ``form`` (torch's FlopCounterMode on the fp32 model of
    weights ``sd``, 2 FLOPs a multiply-add) and, for decoders, their split over the mask decoder's parts."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = get_config(config)
    model = export_model(sd, cfg, "fp32", replace(eo.ONNX_REWRITES, **FORMS[graph][form])).eval()
    args = eo.example_inputs(cfg)[0 if graph == "encoder" else 1]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        GRAPHS[graph](model)(*args)
    parts = {}
    if graph == "decoder":
        counts = {k: sum(v.values()) / 1e9 for k, v in counter.get_flop_counts().items()}
        md = f"{GRAPHS[graph].__name__}.model.sam_mask_decoder"
        parts = {f"two-way layer {i}": counts[f"{md}.transformer.layers.{i}"] for i in range(cfg.decoder_depth)}
        parts["final attention"] = counts[f"{md}.transformer.final_attn_token_to_image"]
        parts["upscaling and heads"] = counts[md] - counts[f"{md}.transformer"]
        parts["prompt encoder"] = counts["Global"] - counts[md]
    return counter.get_total_flops() / 1e9, parts


def peer_gflop(config: str, graph: str) -> float:
    """The peer's encode or click: upstream's operations (``checks.bench.bench.model_flops``), GFLOP."""
    from sam2edge.checks.bench.bound import model_flops

    return model_flops(get_config(config))[f"{graph}_gflop"]


def agreement(work: Path, names: list[str], feed: dict) -> dict[str, float]:
    """name -> largest |difference| of any output from the first file's, relative to that output's largest
    |value|."""
    outs = {n: ob.make_session(work / n, threads=2).run(None, feed) for n in names}
    ref = outs[names[0]]
    return {
        n: max(float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)) for a, b in zip(o, ref, strict=True))
        for n, o in outs.items()
    }


def _peer_call(peer: Path, graph: str, config: str, x: np.ndarray):
    """The peer's encode of ``x``, or its one-point click on its own features of ``x``."""
    from sam2edge.checks.bench.peer import PeerRunner

    if graph == "encoder":
        sess = ob.make_session(peer / PEER_ENCODER, threads=2)
        return lambda: sess.run(None, {"image": x})
    cfg = get_config(config)
    runner = PeerRunner(peer, cfg, 2)
    feats, (coords, labels) = runner.encode(x), _click(cfg)
    return lambda: runner.decode(feats, coords, labels)


def timings(
    work: Path, names: list[str], runs: int, feed: dict, peer=None, gap: float = GAP_S
) -> dict[str, list[float]]:
    """Interleaved rounds, one call per file (and ``peer``, a zero-argument call) each, each after ``gap``
    seconds idle (the previous session's threads spin-wait for tens of ms after a call and would take half of
    two cores from the next one); ms per call."""
    sessions = {n: ob.make_session(work / n, threads=2) for n in names}
    calls = {n: (lambda s=s: s.run(None, feed)) for n, s in sessions.items()} | ({PEER: peer} if peer else {})
    for f in calls.values():  # warm-up
        f()
    out: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(runs):
        for n, f in calls.items():
            time.sleep(gap)
            t = time.perf_counter()
            f()
            out[n].append(1000 * (time.perf_counter() - t))
    return out


def profile(path: Path, feed: dict, runs: int = 3) -> dict[str, float]:
    """onnxruntime's profile of ``runs`` calls after a warm-up: operator type -> ms per call."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.enable_profiling = 2, True
    so.profile_file_prefix = str(path.with_suffix(""))
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per: collections.Counter = collections.Counter()
    for e in kernels[len(kernels) // (runs + 1) :]:  # the warm-up call's kernels come first
        per[e["args"]["op_name"]] += e["dur"] / 1000 / runs
    return dict(per.most_common())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--graph", choices=tuple(FORMS), default="encoder")
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--forms", help="comma-separated names of FORMS[graph] (default: all)")
    ap.add_argument("--peer", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--gap", type=float, default=GAP_S, help="idle seconds before each timed call (0: back to back)")
    args = ap.parse_args(argv)
    forms = args.forms.split(",") if args.forms else list(FORMS[args.graph])
    unknown = [f for f in forms if f not in FORMS[args.graph]]
    if unknown:
        print(
            f"error: unknown {args.graph} form(s) {unknown}; choose from {', '.join(FORMS[args.graph])}",
            file=sys.stderr,
        )
        return 2
    if args.peer is not None and not (args.peer / PEER_ENCODER).is_file():
        print(f"error: {args.peer} holds no peer encoder.onnx; make one with checks.bench.peer", file=sys.stderr)
        return 2
    if args.runs < 1:
        print(f"error: --runs {args.runs}: give 1 or more", file=sys.stderr)
        return 2
    if not 0 <= args.gap <= 10:
        print(f"error: --gap {args.gap}: give idle seconds between 0 and 10", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    names = [f"{p}_{f}.onnx" for f in forms for p in PRECISIONS[args.graph]]
    if not all((args.work / n).is_file() for n in names):
        names = build(args.work, args.config, args.graph, forms)
    feed, x = feeds(args.graph, args.config)
    rel = agreement(args.work, names, feed)
    peer = _peer_call(args.peer, args.graph, args.config, x) if args.peer else None
    ms = timings(args.work, names, args.runs, feed, peer, args.gap)
    base = statistics.median(ms[PEER]) if peer else None
    sd = synthetic_state_dict(get_config(args.config))
    flops = {f: gflop(args.config, args.graph, f, sd) for f in forms}
    gf = {n: flops[n.split("_", 1)[1].removesuffix(".onnx")][0] for n in names}
    if peer:
        gf[PEER] = peer_gflop(args.config, args.graph)
    print(f"| {args.graph} file | GFLOP | median ms | {'/ peer | ' if base else ''}max rel. diff vs the first fp32 |")
    print(f"|---|---|---|{'---|' if base else ''}---|")
    for n, t in ms.items():
        med = statistics.median(t)
        ratio = f" {med / base:.3f}x |" if base else ""
        diff = f"{rel[n]:.2e}" if n in rel else "-"
        print(f"| {n} | {gf[n]:.2f} | {med:.1f} |{ratio} {diff} |")
    for f, (_, parts) in flops.items():
        if parts:
            print(f"{f}: GFLOP by part:", ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
    if args.profile:
        for n in names:
            top = profile(args.work / n, feed)
            print(n, ", ".join(f"{op} {t:.1f}" for op, t in list(top.items())[:10]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
