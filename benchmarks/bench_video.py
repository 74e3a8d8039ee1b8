"""Per-frame tracking time split by stage, sam2edge eager vs upstream SAM2VideoPredictor, one process.

Stages: encoder (image encoder), memory attention (incl. no-memory conditioning), decoder (prompt
encoder + mask decoder + pointer), memory encoder. Same perturbed weights (object score lifted), the
same drifting-window JPEG clip; the two predictors advance frame by frame in lockstep (interleaved).
Reports per-frame time by stage for 1..--objects objects, and the memory-attention time per frame
index (it grows while the 7 memory slots fill, then stays flat: sam2edge's graph always attends over
every slot, upstream's over the filled ones).

Bundle subjects (``--targets litert,onnx,executorch``): each target is exported with ``--video`` from the
same weights at each ``--precision`` (comma-separated, default fp32) and tracked through
``Sam2VideoPredictor.from_export``'s backend in the same lockstep run, so every per-frame time sits beside
upstream eager's.

Usage: .venv/bin/python benchmarks/bench_video.py [--config sam2.1-hiera-tiny] [--frames 10]
       [--objects 3] [--threads 2] [--targets litert,onnx,executorch] [--precision fp32,int8] [--json out.json]
       [--workdir bench-video]  (keeps the exported bundles; a later run with the same --workdir reuses them)
       [--bundle DIR ...] (time --video bundles exported elsewhere from these weights) [--no-eager]
       [--warmup-frames 3] (tracked untimed by every subject first: first calls grow memory arenas)
       (--config test-small: a smoke run)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sam2edge.checks.bench.records import machine  # noqa: E402
from sam2edge.config import get_config, get_video_config  # noqa: E402
from sam2edge.model import UPSTREAM, Rewrites  # noqa: E402
from sam2edge.runtime.video.backend import EagerVideoBackend  # noqa: E402
from sam2edge.runtime.video.predictor import Sam2VideoPredictor  # noqa: E402
from sam2edge.weights.load import expected_shapes, to_sam2edge  # noqa: E402
from sam2edge.weights.video import map_video_tensors  # noqa: E402
from tests.video_oracles import drifting_clip, upstream_video_predictor  # noqa: E402

STAGES = ("encoder", "memory attention", "decoder", "memory encoder")
FULL = 7  # from this frame index on, all 7 memory slots are filled (the conditioning frame + 6 previous)
W, H = 320, 240


class Timers:
    """Seconds per stage since the last ``take``."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)

    def wrap(self, obj, attr: str, stage: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.acc[stage] += time.perf_counter() - t

        setattr(obj, attr, timed)

    def take(self) -> dict[str, float]:
        out = {s: self.acc.get(s, 0.0) for s in STAGES}
        self.acc.clear()
        return out


def bundle_runners(
    mapped: dict, config: str, targets: list[str], precisions: list[str], tmp: Path, threads: int
) -> dict:
    """name -> (predictor, timers) for each target's ``--video`` bundle at each precision, exported from ``mapped``."""
    from sam2edge.export.pipeline import run_export

    runners = {}
    for target, precision in itertools.product(targets, precisions):
        out = tmp / f"bundle-{config}-{target}-{precision}"
        if not (out / "card.json").exists():  # a --workdir bundle from an earlier run (same weights) is reused
            options = {"gpu_check": "skip"} if target == "litert" else None  # not what this benchmark measures
            with contextlib.redirect_stderr(io.StringIO()):
                source = {"checkpoint": "bench (upstream's perturbed weights)"}
                run_export(
                    target, config, precision, out, weights=(mapped, source), video=True, force=True, options=options
                )
        runners[f"{target}-{precision}"] = bundle_runner(out, threads)
    return runners


def existing_runners(folders: list[str], threads: int) -> dict:
    """name -> (predictor, timers) for ``--video`` bundles exported elsewhere from this benchmark's weights
    (e.g. by an older checkout: a before/after in one run), named by their folder."""
    return {Path(folder).name: bundle_runner(Path(folder), threads) for folder in folders}


def bundle_runner(folder: Path, threads: int) -> tuple[Sam2VideoPredictor, Timers]:
    """(predictor, timers) of one ``--video`` bundle, each backend stage timed."""
    from sam2edge.runtime.video.bundle import open_video_bundle

    backend, _ = open_video_bundle(folder, threads=threads)
    return Sam2VideoPredictor(backend, fill_hole_area=0), wrap_backend(backend)


def wrap_backend(backend) -> Timers:
    timers = Timers()
    for attr, stage in (
        ("encode_frame", "encoder"),
        ("no_memory", "memory attention"),
        ("memory_attention", "memory attention"),
        ("decode", "decoder"),
        ("encode_memory", "memory encoder"),
    ):
        timers.wrap(backend, attr, stage)
    return timers


def build(cfg, vcfg, eager: bool = True):
    """(name -> (predictor, timers)) for upstream and (``eager``) both sam2edge forms, sharing one set of weights;
    also the mapped sam2edge state dict (for bundle subjects)."""
    up = upstream_video_predictor(cfg, vcfg, seed=0, official_yaml=cfg.image_size == 1024 and vcfg.mem_dim == 64)
    sd = {k: v.detach().clone() for k, v in up.state_dict().items()}
    mapped = to_sam2edge(sd, "meta", expected_shapes(cfg), "bench")
    mapped.update(map_video_tensors(sd, "meta", cfg, vcfg, "bench"))
    t_up = Timers()
    for attr, stage in (
        ("forward_image", "encoder"),
        ("_prepare_memory_conditioned_features", "memory attention"),
        ("_forward_sam_heads", "decoder"),
        ("_encode_new_memory", "memory encoder"),
    ):
        t_up.wrap(up, attr, stage)
    runners = {"upstream": (up, t_up)}
    for name, rw in (("sam2edge", UPSTREAM), ("sam2edge-export", Rewrites())) if eager else ():
        backend = EagerVideoBackend.from_state_dict(mapped, cfg, vcfg, rw)
        timers = wrap_backend(backend)
        runners[name] = (Sam2VideoPredictor(backend, fill_hole_area=0), timers)  # upstream skips it on CPU
    return runners, mapped


def session(runners, clip: Path, objects: int, frames: int | None = None) -> dict[str, list[dict[str, float]]]:
    """Prompt ``objects`` clicks on frame 0, then propagate every predictor in lockstep (the first ``frames``,
    default all); per-frame splits."""
    gens, per_frame = {}, {name: [] for name in runners}
    for name, (pred, timers) in runners.items():
        state = pred.init_state(video_path=str(clip))
        for obj in range(1, objects + 1):
            pred.add_new_points_or_box(state, 0, obj, points=[[W * obj / (objects + 1), H * 0.5]], labels=[1])
        pred.propagate_in_video_preflight(state)
        timers.take()
        gens[name] = iter(pred.propagate_in_video(state))
    for i, steps in enumerate(zip(*gens.values())):
        for name, _ in zip(runners, steps):
            per_frame[name].append(runners[name][1].take())  # time of the step just taken
        if frames is not None and i + 1 >= frames:
            break
    return per_frame


def report(results: dict, frames: int) -> None:
    """Median per tracked frame over frames 1.. (slots filling) and, where the clip is long enough, over the
    steady state (frames >= FULL: every memory slot filled, upstream's costliest frames)."""
    for first, what in ((1, f"frames 1..{frames - 1}"), (FULL, f"steady state, frames {FULL}..{frames - 1}")):
        if first >= frames:
            continue
        print(f"\nper tracked frame ({what}), median ms by stage; ratio = total / upstream total")
        print(f"{'objects':>7} {'model':<24} " + " ".join(f"{s:>16}" for s in STAGES) + f" {'total':>9} {'ratio':>6}")
        for objects, per_frame in results.items():
            base = statistics.median(sum(f.values()) for f in per_frame["upstream"][first:])
            for name, rows in per_frame.items():
                med = {s: statistics.median(r[s] for r in rows[first:]) for s in STAGES}
                total = statistics.median(sum(r.values()) for r in rows[first:])
                cells = " ".join(f"{med[s] * 1e3:16.1f}" for s in STAGES)
                print(f"{objects:>7} {name:<24} {cells} {total * 1e3:9.1f} {total / base:6.2f}")
    last = results[max(results)]
    print("\nmemory attention ms per frame index (filled slots grow to 7 by frame 6), most objects:")
    for name, rows in last.items():
        print(f"{name:<16} " + " ".join(f"{r['memory attention'] * 1e3:7.1f}" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--objects", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the per-frame splits here")
    ap.add_argument("--targets", default="", help="comma-separated bundle subjects: litert,onnx,executorch")
    ap.add_argument("--precision", default="fp32", help="comma-separated precisions of the bundles: fp32,fp16,int8")
    ap.add_argument("--bundle", action="append", default=[], help="also time this --video bundle (same weights)")
    ap.add_argument("--no-eager", action="store_true", help="leave out the two sam2edge eager subjects")
    ap.add_argument("--warmup-frames", type=int, default=3, help="untimed frames tracked by every subject first")
    ap.add_argument(
        "--workdir", help="keep the exported bundles here and reuse them in a later run (default: a temporary folder)"
    )
    args = ap.parse_args()
    if args.json and Path(args.json).exists():  # never written over
        raise SystemExit(f"error: {args.json} exists; name a new file for --json")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg, vcfg = get_config(args.config), get_video_config(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        drifting_clip(Path(tmp) / "clip", args.frames, (W, H))
        runners, mapped = build(cfg, vcfg, eager=not args.no_eager)
        runners.update(existing_runners(args.bundle, args.threads))
        targets = [t for t in args.targets.split(",") if t]
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        precisions = [p for p in args.precision.split(",") if p]
        runners.update(bundle_runners(mapped, args.config, targets, precisions, workdir, args.threads))
        results = {}
        with contextlib.redirect_stderr(io.StringIO()):  # untimed: runtimes grow their memory arenas on first calls
            session(runners, Path(tmp) / "clip", 1, frames=args.warmup_frames)
        for objects in range(1, args.objects + 1):
            with contextlib.redirect_stderr(io.StringIO()):  # upstream's tqdm bars
                results[objects] = session(runners, Path(tmp) / "clip", objects)
            print(f"{objects} object(s) done", file=sys.stderr, flush=True)
    m = machine()  # the ratio depends on the CPU: upstream's kernels and ours scale differently per family
    print(f"{args.config}, {args.threads} threads, {args.frames} frames of {W}x{H}")
    print(f"machine: {m['cpu']}, {m['cores']} cores; {' '.join(m['vector_extensions'])}")
    report(results, args.frames)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m, **{str(k): v for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
