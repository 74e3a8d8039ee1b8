"""Per tracked frame for 1, 2 and 4 objects: what a second object costs, against upstream SAM2VideoPredictor.

Subjects, one process, advancing frame by frame in lockstep (interleaved): upstream SAM2VideoPredictor eager
(each object run separately through memory attention, decoder and memory encoder), sam2edge eager (objects in
one batch, ``runtime.video.batch``) and ``--video`` bundles of ``--targets`` (objects in chunks of 4 through the
batched graphs; one object through the single-object graphs). Same perturbed weights (object score lifted) and
the same drifting-window clip as ``bench_video.py``; the objects are clicks on frame 0. Reported: the median
total per tracked frame over the steady state (frames >= 7: every memory slot filled) for each object count,
and the marginal cost of the second object, (t(2) - t(1)) / t(1), and of each of objects 2-4, (t(4) - t(1)) /
(3 t(1)).

Usage: .venv/bin/python benchmarks/bench_video_objects.py [--config sam2.1-hiera-tiny] [--frames 9]
       [--objects 1,2,4] [--threads 2] [--targets litert,onnx] [--workdir DIR] (exports reused, see bench_video)
       [--warmup-frames 1] [--record benchmarks/records/NN-name.json]   (--config test-small: a smoke run)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_video import FULL, STAGES, H, W, build, bundle_runners, session  # noqa: E402

from sam2edge import __version__  # noqa: E402
from sam2edge.checks.bench.records import machine  # noqa: E402
from sam2edge.config import get_config, get_video_config  # noqa: E402
from tests.video_oracles import drifting_clip  # noqa: E402

NAMES = {
    "upstream": "upstream SAM2VideoPredictor (objects one by one)",
    "sam2edge": "sam2edge eager (objects batched)",
    "litert-fp32": "LiteRT fp32 bundle (4-object graphs)",
    "onnx-fp32": "ONNX fp32 bundle (4-object graphs)",
    "executorch-fp32": "ExecuTorch fp32 bundle (4-object graphs)",
}


def steady(rows: list[dict[str, float]], first: int) -> dict[str, float]:
    """Median ms per stage and in total over the frames ``first``.. of one subject."""
    out = {s: 1e3 * statistics.median(r[s] for r in rows[first:]) for s in STAGES}
    out["total"] = 1e3 * statistics.median(sum(r.values()) for r in rows[first:])
    return out


def summarise(results: dict[int, dict[str, list]], first: int) -> dict[str, dict]:
    """subject -> {objects: medians} and the marginal costs (needs object counts 1, 2 and 4)."""
    out = {}
    for name in results[min(results)]:
        per = {n: steady(results[n][name], first) for n in results}
        t = {n: per[n]["total"] for n in per}
        second = (t[2] - t[1]) / t[1] if 1 in t and 2 in t else None
        each = (t[4] - t[1]) / (3 * t[1]) if 1 in t and 4 in t else None
        out[name] = {"per_objects": per, "second": second, "each_of_2_4": each}
    return out


def table_record(summary: dict, args, first: int, frames: int) -> dict:
    """The published record (``sam2edge.table/1``): one row per subject and object count."""
    cols = [["subject", "subject"], ["objects", "objects"]]
    cols += [[s.replace(" ", "_"), f"{s} (ms)"] for s in STAGES]
    cols += [["total", "total (ms)"], ["vs_upstream", "vs upstream"], ["second", "2nd object / 1st"]]
    rows = []
    for name, s in summary.items():
        for n, per in s["per_objects"].items():
            base = summary["upstream"]["per_objects"][n]["total"]
            row = {
                "subject": NAMES.get(name, name),
                "objects": n,
                **{k.replace(" ", "_"): round(per[k]) for k in STAGES},
            }
            row.update(total=round(per["total"]), vs_upstream=f"{per['total'] / base:.2f}x")
            if n == 2 and s["second"] is not None:
                row["second"] = f"{s['second']:.2f}x"
            rows.append(row)
    m = machine()
    cmd = " ".join(["python benchmarks/bench_video_objects.py", *sys.argv[1:]])
    each = "; ".join(f"{NAMES.get(k, k)} {v['each_of_2_4']:.2f}x" for k, v in summary.items() if v["each_of_2_4"])
    return {
        "schema": "sam2edge.table/1",
        "id": "video-objects-1024",
        "title": f"Tracking several objects, {args.config}: per tracked frame for 1, 2 and 4 objects "
        f"({get_config(args.config).image_size} px, {args.threads} threads, steady state)",
        "date": dt.date.today().isoformat(),
        "command": cmd,
        "machine": {"cpu": m["cpu"], "cores": m["cores"], "vector_extensions": m["vector_extensions"]},
        "sam2edge": {"version": __version__},
        "columns": cols,
        "rows": rows,
        "notes": [
            f"One quiet process, the subjects advancing frame by frame in lockstep; medians over frames {first}.."
            f"{frames - 1} (every one of the 7 memory slots filled), objects = clicks on frame 0.",
            "2nd object / 1st: (t(2 objects) - t(1 object)) / t(1 object); the frame encoder runs once per frame "
            "for every subject. Each of objects 2-4, (t(4) - t(1)) / (3 t(1)): " + each + ".",
            "Bundles run 4 objects as one call of the 4-object graphs and fewer one object per call through the "
            "single-object graphs (the default: a padded row costs as much as a real one).",
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="sam2.1-hiera-tiny")
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--objects", default="1,2,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default="litert,onnx", help="comma-separated bundle subjects")
    ap.add_argument("--warmup-frames", type=int, default=1, help="untimed frames tracked by every subject first")
    ap.add_argument("--workdir", help="keep the exported bundles here and reuse them (default: a temporary folder)")
    ap.add_argument("--record", help="write the sam2edge.table/1 record here (never over an existing file)")
    args = ap.parse_args()
    if args.record and Path(args.record).exists():
        raise SystemExit(f"error: {args.record} exists; name a new file for --record")
    counts = sorted({int(n) for n in args.objects.split(",")})
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg, vcfg = get_config(args.config), get_video_config(args.config)
    first = min(FULL, args.frames - 1)
    with tempfile.TemporaryDirectory() as tmp:
        drifting_clip(Path(tmp) / "clip", args.frames, (W, H))
        runners, mapped = build(cfg, vcfg)
        runners.pop("sam2edge-export")  # one eager subject: upstream's operations (the bundles have the rest)
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        targets = [t for t in args.targets.split(",") if t]
        runners.update(bundle_runners(mapped, args.config, targets, ["fp32"], workdir, args.threads))
        with contextlib.redirect_stderr(io.StringIO()):
            session(runners, Path(tmp) / "clip", 1, frames=args.warmup_frames)
        results = {}
        for n in counts:
            with contextlib.redirect_stderr(io.StringIO()):  # upstream's tqdm bars
                results[n] = session(runners, Path(tmp) / "clip", n)
            print(f"{n} object(s) done", file=sys.stderr, flush=True)
    summary = summarise(results, first)
    print(
        f"{args.config}, {args.threads} threads, {args.frames} frames of {W}x{H}; median ms per tracked frame, "
        f"frames {first}..{args.frames - 1}"
    )
    print(f"{'subject':<50} {'objects':>7} " + " ".join(f"{s:>16}" for s in STAGES) + f" {'total':>9}")
    for name, s in summary.items():
        for n, per in s["per_objects"].items():
            cells = " ".join(f"{per[k]:16.1f}" for k in STAGES)
            print(f"{NAMES.get(name, name):<50} {n:>7} {cells} {per['total']:9.1f}")
        print(f"{'':<50} 2nd object / 1st: {s['second']}, each of 2-4: {s['each_of_2_4']}")
    if args.record:
        Path(args.record).write_text(json.dumps(table_record(summary, args, first, args.frames), indent=1) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
