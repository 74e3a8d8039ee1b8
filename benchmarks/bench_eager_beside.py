"""Upstream eager alone in its process, then beside loaded bundles: the baseline's own cost of sharing a process.

    .venv/bin/python benchmarks/bench_eager_beside.py BUNDLE [BUNDLE ...] [--checkpoint CKPT] [--runs 4]

Upstream eager (``checks.bench``'s upstream subject: Hiera-Tiny at 1024 px, one click a round) is warmed up and
timed for ``--runs`` rounds alone in this process, then the bundles are loaded and warmed up, and ``--runs`` more
rounds time each bundle and then upstream, every call after ``checks.bench.bench.IDLE_S`` idle, as ``sam2edge
bench`` does; then the same rounds with upstream in a process of its own (``checks.bench.isolated``, as ``sam2edge
bench`` times it). Per upstream encode: wall ms, and in this process its user and system CPU seconds and minor
page faults (``getrusage``). Nothing else should run on the CPU meanwhile.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
from pathlib import Path

import torch

from sam2edge.checks.bench import bench as B
from sam2edge.config import HIERA_TINY
from sam2edge.errors import UserError


def _timed(subject) -> dict[str, float]:
    """One upstream round (encode + clicks); the encode's wall ms and the round's CPU seconds and faults (NaN
    for a subject in its own process: getrusage sees this process only)."""
    if subject.process == "own":
        enc, _ = B._round(subject, B.IDLE_S)
        return {"encoder_ms": enc, "user_s": math.nan, "sys_s": math.nan, "minor_faults": math.nan}
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    enc, _ = B._round(subject, B.IDLE_S)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "encoder_ms": enc,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minor_faults": r1.ru_minflt - r0.ru_minflt,
    }


def _row(label: str, rounds: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    cpu = " | ".join(
        "-" if math.isnan(med[k]) else f"{med[k]:.{d}f}" for k, d in (("user_s", 2), ("sys_s", 2), ("minor_faults", 0))
    )
    enc = [r["encoder_ms"] for r in rounds]
    return f"| {label} | {med['encoder_ms']:.0f} ({min(enc):.0f}-{max(enc):.0f}) | {cpu} |"


def _beside(bundles, upstream, runs: int) -> list[dict]:
    """``runs`` rounds of every bundle, each followed by one timed upstream round."""
    out = []
    for _ in range(runs):
        for b in bundles:
            B._round(b, B.IDLE_S)
        out.append(_timed(upstream))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--checkpoint", help="upstream's weights (default: synthetic)")
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args(argv)
    missing = [str(b) for b in args.bundles if not (b / "card.json").is_file()]
    if missing:
        print(
            f"error: not a bundle (no card.json): {', '.join(missing)}; give `sam2edge export` folders", file=sys.stderr
        )
        return 2
    if args.runs < 1:
        print(f"error: --runs {args.runs}: give 1 or more", file=sys.stderr)
        return 2
    try:  # an unreadable checkpoint or bundle: its one-line reason
        upstream = B.open_upstream_subject(HIERA_TINY, args.checkpoint, own_process=False)
        B.warm_up(upstream, 1, 1)
        alone = [_timed(upstream) for _ in range(args.runs)]  # before any bundle is in the process
        bundles = [B.open_bundle_subject(b, 2) for b in args.bundles]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for b in bundles:
        B.warm_up(b, 1, 1)
    beside = _beside(bundles, upstream, args.runs)
    isolated = B.open_upstream_subject(HIERA_TINY, args.checkpoint, threads=torch.get_num_threads())
    try:
        B.warm_up(isolated, 1, 1)
        own = _beside(bundles, isolated, args.runs)
    finally:
        isolated.runner.close()
    print("| upstream eager | encoder ms p50 (min-max) | user s | system s | minor faults |")
    print("|---|---|---|---|---|")
    print(_row("alone in its process", alone))
    print(_row(f"beside {len(bundles)} bundle(s), interleaved", beside))
    print(_row("beside: the slowest round", [max(beside, key=lambda r: r["encoder_ms"])]))
    print(_row(f"its own process, beside {len(bundles)} bundle(s) in this one", own))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
