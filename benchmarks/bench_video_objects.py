"""Per tracked frame for 1, 2 and 4 objects: what a second object costs, against upstream SAM2VideoPredictor.

Subjects, one process, advancing frame by frame in lockstep (interleaved): upstream SAM2VideoPredictor eager
(each object run separately through memory attention, decoder and memory encoder), sam2edge eager (objects in
one batch, ``runtime.video.batch``) and ``--video`` bundles of ``--targets`` (objects in chunks of 4 through the
batched graphs; one object through the single-object graphs). Same perturbed weights (object score lifted) and
the same drifting-window clip as ``bench_video.py``; the objects are clicks on frame 0. Reported: the median
total per tracked frame over the steady state (frames >= 7: every memory slot filled) for each object count,
and the marginal cost of the second object, (t(2) - t(1)) / t(1), and of each of objects 2-4, (t(4) - t(1)) /
(3 t(1)).

EdgeTAM subjects (``--edgetam CKPT``, an original-layout EdgeTAM checkpoint at the full config ``edgetam``): sam2edge
eager EdgeTAM (objects batched) from those weights, and ``--edgetam-bundles`` (``--video`` bundles of the same
weights, e.g. bench_edgetam.py's workdir), tracked in the same lockstep; their "vs upstream" is against upstream
SAM 2.1-tiny (a different model: the speed reference). ``--flops FILE`` (count_video_flops.py --json) adds the
FLOP bound on the second object to the record's notes.

Usage: .venv/bin/python benchmarks/bench_video_objects.py [--config sam2.1-hiera-tiny] [--frames 9]
       [--objects 1,2,4] [--threads 2] [--targets litert,onnx] [--workdir DIR] (exports reused, see bench_video)
       [--warmup-frames 1] [--edgetam CKPT] [--edgetam-bundles DIR,DIR] [--flops FILE]
       [--record benchmarks/records/NN-name.json]   (--config test-small: a smoke run)
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

from bench_video import FULL, STAGES, H, W, build, bundle_runner, bundle_runners, session, wrap_backend  # noqa: E402

from sam2edge import __version__  # noqa: E402
from sam2edge.checks.bench.records import machine  # noqa: E402
from sam2edge.config import get_config, get_video_config  # noqa: E402
from sam2edge.model import UPSTREAM  # noqa: E402
from sam2edge.runtime.video.backend import EagerVideoBackend  # noqa: E402
from sam2edge.runtime.video.predictor import Sam2VideoPredictor  # noqa: E402
from tests.video_oracles import drifting_clip  # noqa: E402

NAMES = {
    "upstream": "upstream SAM2VideoPredictor (objects one by one)",
    "sam2edge": "sam2edge eager (objects batched)",
    "litert-fp32": "LiteRT fp32 bundle (4-object graphs)",
    "onnx-fp32": "ONNX fp32 bundle (4-object graphs)",
    "executorch-fp32": "ExecuTorch fp32 bundle (4-object graphs)",
    "edgetam-eager": "EdgeTAM sam2edge eager (objects batched)",
}
GOAL = 0.5  # a second object's cost, as a fraction of the first's


def edgetam_runners(ckpt: str, folders: list[str], threads: int) -> dict:
    """name -> (predictor, timers): sam2edge eager EdgeTAM from ``ckpt`` and the EdgeTAM bundles ``folders``."""
    from sam2edge.weights.video import load_video_weights

    cfg, vcfg = get_config("edgetam"), get_video_config("edgetam")
    mapped, _ = load_video_weights(ckpt, cfg, vcfg)
    backend = EagerVideoBackend.from_state_dict(mapped, cfg, vcfg, UPSTREAM)
    runners = {"edgetam-eager": (Sam2VideoPredictor(backend, fill_hole_area=0), wrap_backend(backend))}
    for folder in folders:
        target = json.loads((Path(folder) / "card.json").read_text()).get("target", Path(folder).name)
        NAMES[f"edgetam-{target}"] = f"EdgeTAM {target} fp32 bundle ({Path(folder).name})"
        runners[f"edgetam-{target}"] = bundle_runner(Path(folder), threads)
    return runners


def flop_notes(path: str) -> list[str]:
    """Record notes from count_video_flops.py's JSON: per config, shared vs per-object GFLOP and the bound."""
    notes = []
    for r in json.loads(Path(path).read_text()):
        notes.append(
            f"FLOPs at 1024 px ({r['config']}, benchmarks/count_video_flops.py; matrix products and convolutions): "
            f"shared per frame {r['encoder_gflop']} GFLOP encoder + {r['shared_memory_attention_gflop']} memory "
            f"attention (layer 0 before the cross-attention scores); per object {r['per_object_gflop']} GFLOP "
            f"(memory attention {r['memory_attention_per_object_gflop']}, decoder {r['decoder_per_object_gflop']}, "
            f"memory encoder {r['memory_encoder_per_object_gflop']}). At equal FLOP rates a second object costs "
            f"{r['second_object_bound']:.2f}x of the first: "
            + ("0.5x is within reach." if r["second_object_bound"] <= GOAL else "0.5x is out of reach exactly.")
        )
    return notes


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
    goal = "; ".join(
        f"{NAMES.get(k, k)} {v['second']:.2f}x ({'met' if v['second'] <= GOAL else 'not met'})"
        for k, v in summary.items()
        if v["second"] is not None
    )
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
            f"Goal: a second object costs <= {GOAL}x of the first. " + goal + ".",
            *(flop_notes(args.flops) if args.flops else []),
            *(
                [
                    "EdgeTAM rows: sam2edge eager EdgeTAM and EdgeTAM --video bundles of one set of original-layout "
                    "weights (the same lockstep clip and clicks); their 'vs upstream' is against upstream SAM 2.1-tiny "
                    "(a different model: the speed reference). The original EdgeTAM code is not a subject here (one "
                    "object: benchmarks/bench_edgetam.py)."
                ]
                if args.edgetam
                else []
            ),
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
    ap.add_argument("--edgetam", help="original-layout EdgeTAM checkpoint: add EdgeTAM subjects (full config)")
    ap.add_argument("--edgetam-bundles", default="", help="comma-separated EdgeTAM --video bundles (with --edgetam)")
    ap.add_argument("--flops", help="count_video_flops.py --json output, for the record's notes")
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
        if args.edgetam:
            folders = [f for f in args.edgetam_bundles.split(",") if f]
            runners.update(edgetam_runners(args.edgetam, folders, args.threads))
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
