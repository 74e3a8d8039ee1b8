"""EdgeTAM per tracked frame, steady state: the original EdgeTAM predictor (eager), sam2edge's EdgeTAM bundles and
upstream SAM 2.1-tiny's ``SAM2VideoPredictor``, one command, the same thread count.

Subjects (one object, a click on frame 0, forward propagation over a drifting-window clip of a real photo; frames
from index 7 on are timed, when all 7 memory slots are filled: the conditioning frame + 6 previous):
  original   ``edgetam-dimos`` (tests/edgetam_oracle.py: a child process with its own ``sys.path``), seeded
             perturbed weights, eager PyTorch; stages timed by wrapping its own methods and modules
  bundles    sam2edge ``export --video`` of those same weights (through the checkpoint key map, as ``edgetam.pt``
             would load) for each ``--targets`` entry (``TARGET`` at fp32 or ``TARGET:PRECISION``), tracked by
             ``Sam2VideoPredictor.from_export``'s backend;
             its memory-encoder graph holds the perceiver, so its perceiver time is inside "memory encoder"
  sam2.1-tiny  upstream ``SAM2VideoPredictor`` (Meta's ``sam2``; official yaml at 1024 px, test-small widths for a
             reduced ``--config``), its own perturbed weights (a different model: the speed reference)
Stages: encoder, perceiver, memory attention, decoder (prompt encoder + mask decoder + pointer), memory encoder.
Hole filling is off for every subject (upstream and the original skip it on a CPU).

Writes a JSON record (machine, date, command, per-subject medians per stage, ratios, bundle sizes) under
benchmarks/records/ (never over an existing file) and prints a table. Timings taken on a loaded machine mean
nothing: run it on a quiet one.

Usage: .venv/bin/python benchmarks/bench_edgetam.py [--config edgetam] [--runs 8] [--threads 2]
       [--targets litert,onnx,executorch] [--workdir DIR] [--record PATH]
       (--config test-small-edgetam --runs 1: a smoke run of every subject)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sam2edge.checks.bench.records import machine  # noqa: E402
from sam2edge.config import (  # noqa: E402
    HIERA_TINY,
    TEST_SMALL,
    VIDEO_TEST_SMALL,
    VIDEO_TINY,
    get_config,
    get_video_config,
)
from sam2edge.runtime.video.predictor import Sam2VideoPredictor  # noqa: E402
from tests.video_oracles import drifting_clip, upstream_video_predictor  # noqa: E402

STAGES = ("encoder", "perceiver", "memory attention", "decoder", "memory encoder")
FULL = 7  # frame index from which all 7 memory slots are filled
W, H = 320, 240
RECORDS = ROOT / "benchmarks" / "records"


class Timers:
    """Seconds per stage since the last ``take``; ``inner`` stages are subtracted from the stage that calls them."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)

    def wrap(self, obj, attr: str, stage: str, outer: str | None = None) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t
                self.acc[stage] += dt
                if outer:
                    self.acc[outer] -= dt

        setattr(obj, attr, timed)

    def take(self) -> dict[str, float]:
        out = {s: self.acc.get(s, 0.0) for s in STAGES}
        self.acc.clear()
        return out


def track(pred, timers: Timers, clip: Path, frames: int) -> list[dict[str, float]]:
    """One click on frame 0, forward propagation; per-frame stage seconds of the frames >= FULL."""
    state = pred.init_state(video_path=str(clip))
    pred.add_new_points_or_box(state, 0, 1, points=[[W * 0.45, H * 0.4]], labels=[1])
    pred.propagate_in_video_preflight(state)
    timers.take()
    rows = []
    for f, _, _ in pred.propagate_in_video(state):
        split = timers.take()
        if f >= FULL:
            rows.append(split)
        if f + 1 >= frames:
            break
    return rows


ORIGINAL_SCRIPT = """
import time, types
from collections import defaultdict
import sam2.sam2_video_predictor as svp


class Fp32Torch(types.ModuleType):  # the original stores memories as bfloat16, which fails on a CPU
    def __getattr__(self, name):
        return torch.float32 if name == "bfloat16" else getattr(torch, name)


svp.torch = Fp32Torch("torch")
torch.set_num_threads(IN["threads"])
torch.set_grad_enabled(False)
model = build_original(IN["config"], 0, video=True)
model.fill_hole_area = 0
OUT["state"] = {k: v.clone() for k, v in model.state_dict().items()}
acc = defaultdict(float)


def wrap(obj, attr, stage, outer=None):
    fn = getattr(obj, attr)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            dt = time.perf_counter() - t
            acc[stage] += dt
            if outer:
                acc[outer] -= dt

    setattr(obj, attr, timed)


wrap(model, "forward_image", "encoder")
wrap(model, "_prepare_memory_conditioned_features", "memory attention")
wrap(model, "_forward_sam_heads", "decoder")
wrap(model, "_encode_new_memory", "memory encoder")
wrap(model.spatial_perceiver, "forward", "perceiver", outer="memory encoder")
state = model.init_state(video_path=IN["clip"])
model.add_new_points_or_box(state, 0, 1, points=[[IN["w"] * 0.45, IN["h"] * 0.4]], labels=[1])
model.propagate_in_video_preflight(state)
acc.clear()
rows = []
for f, _, _ in model.propagate_in_video(state):
    split = {s: acc.get(s, 0.0) for s in IN["stages"]}
    acc.clear()
    if f >= IN["full"]:
        rows.append(split)
    if f + 1 >= IN["frames"]:
        break
OUT["rows"] = rows
"""


def original(config: str, clip: Path, frames: int, threads: int) -> tuple[list[dict], dict]:
    """(per-frame splits, state dict) of the original EdgeTAM predictor, in its own process."""
    from tests.edgetam_oracle import run_original

    os.environ["SAM2EDGE_TEST_THREADS"] = str(threads)
    args = dict(config=config, clip=str(clip), frames=frames, threads=threads, w=W, h=H, full=FULL, stages=STAGES)
    out = run_original(ORIGINAL_SCRIPT, args)
    return out["rows"], out["state"]


def bundles(state: dict, config: str, targets: list[str], workdir: Path, threads: int) -> dict:
    """target -> (predictor, timers, folder) of each fp32 ``--video`` bundle of the original's weights."""
    from sam2edge.export.pipeline import run_export
    from sam2edge.runtime.video.bundle import open_video_bundle
    from sam2edge.weights.video import load_video_weights

    ckpt = workdir / "original-edgetam.pt"  # the original's state dict, as the official edgetam.pt holds it
    if not ckpt.exists():
        torch.save({"model": state}, ckpt)
    cfg, vcfg = get_config(config), get_video_config(config)
    mapped, source = load_video_weights(str(ckpt), cfg, vcfg)
    out = {}
    for entry in targets:
        target, _, precision = entry.partition(":")
        precision = precision or "fp32"
        folder = workdir / f"bundle-{config}-{target}-{precision}"
        if not (folder / "card.json").exists():  # a --workdir bundle of an earlier run (same weights) is reused
            options = {"batch": 0}  # no batched decoder, and LiteRT without its GPU check: not measured here
            options.update({"gpu_check": "skip"} if target == "litert" else {})
            with contextlib.redirect_stderr(io.StringIO()):
                run_export(target, config, precision, folder, weights=(mapped, source), video=True, options=options)
        backend, _ = open_video_bundle(folder, threads=threads)
        timers = Timers()
        for attr, stage in (
            ("encode_frame", "encoder"),
            ("no_memory", "memory attention"),
            ("memory_attention", "memory attention"),
            ("decode", "decoder"),
            ("encode_memory", "memory encoder"),
        ):
            timers.wrap(backend, attr, stage)
        out[entry.replace(":fp32", "")] = (Sam2VideoPredictor(backend, fill_hole_area=0), timers, folder)
    return out


def sam21_tiny(config: str) -> tuple:
    """(predictor, timers) of upstream SAM 2.1-tiny (test-small widths for a reduced EdgeTAM config)."""
    full = get_config(config).image_size == 1024
    cfg, vcfg = (HIERA_TINY, VIDEO_TINY) if full else (TEST_SMALL, VIDEO_TEST_SMALL)
    up = upstream_video_predictor(cfg, vcfg, seed=0, official_yaml=full)
    up.fill_hole_area = 0
    timers = Timers()
    for attr, stage in (
        ("forward_image", "encoder"),
        ("_prepare_memory_conditioned_features", "memory attention"),
        ("_forward_sam_heads", "decoder"),
        ("_encode_new_memory", "memory encoder"),
    ):
        timers.wrap(up, attr, stage)
    return up, timers


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median ms per stage and of the per-frame totals."""
    out = {s: statistics.median(r[s] for r in rows) * 1e3 for s in STAGES}
    out["total"] = statistics.median(sum(r.values()) for r in rows) * 1e3
    return out


def sizes(folder: Path) -> dict:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    return {"files": files, "total_mb": round(sum(files.values()) / 1e6, 3)}


def table_record(out: dict, config: str) -> dict:
    """``out`` as a published record (``sam2edge.table/1``, rendered by ``sam2edge report``): one row per subject,
    median ms per stage, total, the ratios; the raw per-frame timings kept under ``raw``."""
    keys = {s: s.replace(" ", "_") for s in STAGES}
    up, orig = out["subjects"]["sam2.1-tiny-upstream"], out["subjects"]["original-edgetam"]
    rows = []
    for name, r in out["subjects"].items():
        med = r["median_ms"]
        row = {
            "subject": name,
            **{keys[s]: round(med[s], 1) for s in STAGES if s in med},
            "total": round(med["total"], 1),
        }
        row["vs_sam21_tiny"] = f"{med['total'] / up['median_ms']['total']:.2f}x"
        row["vs_original"] = f"{med['total'] / orig['median_ms']['total']:.2f}x"
        target = name.removeprefix("sam2edge-")
        if target in out["bundle_sizes"]:
            row["size_mb"] = out["bundle_sizes"][target]["total_mb"]
        rows.append(row)
    m = out["machine"]
    return {
        "schema": "sam2edge.table/1",
        "id": f"edgetam-{config}-{out['date'][:10]}",
        "title": f"EdgeTAM per tracked frame, steady state ({config}, {out['threads']} threads, one object)",
        "date": out["date"][:10],
        "command": out["command"],
        "machine": {"cpu": m["cpu"], "cores": m["cores"], "vector_extensions": m["vector_extensions"]},
        "sam2edge": {"version": __import__("sam2edge").__version__},
        "columns": [
            ["subject", "subject"],
            *[[keys[s], f"{s} (ms)"] for s in STAGES],
            ["total", "total (ms)"],
            ["vs_sam21_tiny", "vs SAM 2.1-tiny upstream"],
            ["vs_original", "vs original EdgeTAM"],
            ["size_mb", "bundle (MB)"],
        ],
        "rows": rows,
        "notes": [out["notes"], f"clip: {out['clip']}"],
        "raw": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="edgetam", help="edgetam, or test-small-edgetam for a smoke run")
    ap.add_argument("--runs", type=int, default=8, help="steady-state frames timed per subject (after 7 filling)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--targets",
        default="litert,onnx,executorch",
        help="comma-separated bundle targets, each TARGET (fp32) or TARGET:PRECISION (e.g. onnx:fp16)",
    )
    ap.add_argument("--workdir", help="keep the bundles here and reuse them later (default: a temporary folder)")
    ap.add_argument("--record", help="JSON record path (default: benchmarks/records/edgetam-CONFIG-DATE.json)")
    args = ap.parse_args()
    now = datetime.datetime.now(datetime.UTC)
    record = Path(args.record or RECORDS / f"edgetam-{args.config}-{now:%Y%m%dT%H%M%SZ}.json")
    if record.exists():  # never written over
        raise SystemExit(f"error: {record} exists; name a new file with --record")
    if args.runs < 1:
        raise SystemExit("error: --runs must be at least 1")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    frames = FULL + args.runs
    targets = [t for t in args.targets.split(",") if t]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "clip"
        drifting_clip(clip, frames, (W, H), step=min(9, (512 - 20 - W) // frames))
        rows, state = original(args.config, clip, frames, args.threads)
        results["original-edgetam"] = {"rows": rows}
        print("original EdgeTAM done", file=sys.stderr, flush=True)
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        subjects = bundles(state, args.config, targets, workdir, args.threads)
        bundle_sizes = {t: sizes(folder) for t, (_, _, folder) in subjects.items()}
        up, up_timers = sam21_tiny(args.config)
        with contextlib.redirect_stderr(io.StringIO()):  # upstream's tqdm bars
            for target, (pred, timers, _) in subjects.items():
                results[f"sam2edge-{target}"] = {"rows": track(pred, timers, clip, frames)}
            results["sam2.1-tiny-upstream"] = {"rows": track(up, up_timers, clip, frames)}
    for r in results.values():
        r["median_ms"] = medians(r["rows"])
    fastest = min((k for k in results if k.startswith("sam2edge-")), key=lambda k: results[k]["median_ms"]["total"])
    best, orig = results[fastest]["median_ms"], results["original-edgetam"]["median_ms"]
    up_ms = results["sam2.1-tiny-upstream"]["median_ms"]
    ratios = {
        "fastest_bundle": fastest,
        "bundle_over_sam21_tiny": best["total"] / up_ms["total"],
        "bundle_over_original": best["total"] / orig["total"],
        "encoder_bundle_over_original": best["encoder"] / orig["encoder"],
    }
    m = machine()
    out = {
        "benchmark": "bench_edgetam",
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": m,
        "config": args.config,
        "threads": args.threads,
        "clip": {"frames": frames, "size": [W, H], "timed_from_frame": FULL, "objects": 1},
        "notes": "bundle 'memory encoder' includes the perceiver (one graph); hole filling off for every subject",
        "subjects": results,
        "ratios": ratios,
        "bundle_sizes": bundle_sizes,
    }
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(table_record(out, args.config), indent=1))
    print(f"{args.config}, {args.threads} threads, {args.runs} steady-state frame(s) of {W}x{H}; {m['cpu']}")
    print(f"{'subject':<24} " + " ".join(f"{s:>16}" for s in STAGES) + f" {'total ms':>9}")
    for name, r in results.items():
        med = r["median_ms"]
        print(f"{name:<24} " + " ".join(f"{med[s]:16.1f}" for s in STAGES) + f" {med['total']:9.1f}")
    print(json.dumps(ratios))
    print("bundle sizes MB: " + ", ".join(f"{t} {s['total_mb']}" for t, s in bundle_sizes.items()))
    print(f"record: {record}")


if __name__ == "__main__":
    main()
