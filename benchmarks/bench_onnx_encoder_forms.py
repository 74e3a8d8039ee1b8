"""ONNX encoder forms: the shipped graph next to exact re-expressions of it, fp32 and dynamic int8, interleaved.

    .venv/bin/python benchmarks/bench_onnx_encoder_forms.py --work DIR [--config sam2.1-hiera-tiny] [--runs 5]
        [--forms fused-whole,shipped,...] [--peer PEER_DIR] [--profile]

Each form is ``export.onnx.ONNX_REWRITES`` with the fields in ``FORMS`` replaced; its encoder is traced and
optimised as the export does (``EncoderGraph``, onnxruntime BASIC optimisation) from the synthetic checkpoint, and
quantised as the int8 export's VNNI file (smoothed, ``onnx_int8.quantize_int8`` with s8 weights, nothing kept
fp32). Every file's outputs are compared with the first form's fp32 file's on a real photo (largest difference
relative to the output's scale), then all are timed in interleaved rounds (one encode each, 2 threads), with
the peer's encoder (``--peer``, a ``checks.bench.peer`` export) as the yardstick. ``--profile`` adds each
file's onnxruntime profile, summed per operator type. A ``--work`` folder that holds the files is timed as it is.
Nothing else should run meanwhile (``/work/bin/quiet``-style exclusive use of the CPU).
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

from sam2edge.config import get_config
from sam2edge.export import onnx as eo
from sam2edge.export import onnx_int8 as i8
from sam2edge.export.wrappers import EncoderGraph
from sam2edge.runtime.backends import onnx as ob
from sam2edge.weights import synthetic_state_dict

# form name -> the ONNX_REWRITES fields it replaces; the first is the earlier form, the reference of the agreement
FORMS = {
    "fused-whole": {"qkv": "fused", "image_query_chunk": 0},  # q / k / v sliced from one product, attention whole
    "split-whole": {"image_query_chunk": 0},
    "fused-chunk512": {"qkv": "fused"},
    "shipped": {},  # ONNX_REWRITES: q / k / v as three products, global attention in 512-query slices
    "chunk1024": {"image_query_chunk": 1024},
    "maxima": {"q_pool": "maxima"},
}
PEER = "peer fp32"


def build(work: Path, config: str, forms: list[str]) -> list[str]:
    """fp32_FORM.onnx and int8_FORM.onnx per form (file names, in that order)."""
    cfg = get_config(config)
    sd = synthetic_state_dict(cfg)
    names = []
    for form in forms:
        rw = replace(eo.ONNX_REWRITES, **FORMS[form])
        for precision in ("fp32", "int8"):  # _model smooths the int8 encoder, as the export does
            model = eo._model(sd, cfg, precision, rw).eval()
            raw, opt = work / f"raw_{precision}_{form}.onnx", work / f"opt_{precision}_{form}.onnx"
            names_in, names_out, dynamic = eo.IO["encoder"]
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(EncoderGraph(model), eo.example_inputs(cfg)[0], str(raw), dynamo=False,
                                  opset_version=eo.OPSET, do_constant_folding=True, input_names=list(names_in),
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


def agreement(work: Path, names: list[str], x: np.ndarray) -> dict[str, float]:
    """name -> largest |difference| of any output from the first file's, relative to that output's largest
    |value|."""
    outs = {n: ob.make_session(work / n, threads=2).run(None, {"image": x}) for n in names}
    ref = outs[names[0]]
    return {
        n: max(float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)) for a, b in zip(o, ref, strict=True))
        for n, o in outs.items()
    }


def timings(work: Path, names: list[str], runs: int, peer: Path | None, x: np.ndarray) -> dict[str, list[float]]:
    """Interleaved rounds, one encode per file each; ms per call."""
    sessions = {n: ob.make_session(work / n, threads=2) for n in names}
    if peer is not None:
        from sam2edge.checks.bench.peer import ENCODER_FILE

        sessions[PEER] = ob.make_session(peer / ENCODER_FILE, threads=2)
    for s in sessions.values():  # warm-up
        s.run(None, {"image": x})
    out: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(runs):
        for n, s in sessions.items():
            t = time.perf_counter()
            s.run(None, {"image": x})
            out[n].append(1000 * (time.perf_counter() - t))
    return out


def profile(path: Path, x: np.ndarray, runs: int = 3) -> dict[str, float]:
    """onnxruntime's profile of ``runs`` encodes after a warm-up: operator type -> ms per encode."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.enable_profiling = 2, True
    so.profile_file_prefix = str(path.with_suffix(""))
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, {"image": x})
    events = json.loads(Path(sess.end_profiling()).read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per: collections.Counter = collections.Counter()
    for e in kernels[len(kernels) // (runs + 1) :]:  # the warm-up encode's kernels come first
        per[e["args"]["op_name"]] += e["dur"] / 1000 / runs
    return dict(per.most_common())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--peer", type=Path)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        print(f"error: unknown form(s) {unknown}; choose from {', '.join(FORMS)}", file=sys.stderr)
        return 2
    if args.peer is not None and not (args.peer / "encoder.onnx").is_file():
        print(f"error: {args.peer} holds no peer encoder.onnx; make one with checks.bench.peer", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    names = [f"{p}_{f}.onnx" for f in forms for p in ("fp32", "int8")]
    if not all((args.work / n).is_file() for n in names):
        names = build(args.work, args.config, forms)
    from sam2edge.checks.photos import photo
    from sam2edge.runtime.preprocess import preprocess

    x = preprocess(photo("astronaut.png"), get_config(args.config).image_size).numpy()
    rel = agreement(args.work, names, x)
    ms = timings(args.work, names, args.runs, args.peer, x)
    base = statistics.median(ms[PEER]) if args.peer else None
    print(f"| file | median ms | {'/ peer | ' if base else ''}max rel. diff vs the first fp32 |")
    print(f"|---|---|{'---|' if base else ''}---|")
    for n, t in ms.items():
        med = statistics.median(t)
        ratio = f" {med / base:.3f}x |" if base else ""
        print(f"| {n} | {med:.0f} |{ratio} {rel[n]:.2e} |" if n in rel else f"| {n} | {med:.0f} |{ratio} - |")
    if args.profile:
        for n in names:
            top = profile(args.work / n, x)
            print(n, ", ".join(f"{op} {t:.0f}" for op, t in list(top.items())[:10]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
