"""``sam2edge bench DIR ... | --upstream [--compare DIR ...] [--peer DIR] [--threads N] [--runs N --warmup N]``.

Times each bundle (and upstream eager with the same weights) in one session, interleaved;
prints a table; writes one JSON record per subject under ``--records`` (default ``records/``).
``--compare`` adds upstream eager and the compute bound and prints the ratios; ``--peer DIR`` adds the
peer's export (samexporter's kind of ONNX export, ``checks.bench.peer``) as one more baseline.
"""

from __future__ import annotations

import argparse
import os

from sam2edge.config import CONFIGS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundles", nargs="*", help="bundle folders written by `sam2edge export`")
    p.add_argument("--upstream", action="store_true", help="also time upstream eager (Meta's sam2, same weights)")
    p.add_argument(
        "--compare", nargs="+", default=[], metavar="DIR", help="bundles to time against upstream eager and the bound"
    )
    p.add_argument(
        "--threads",
        default=str(os.cpu_count() or 1),
        help="threads per runtime, or a comma list timed one after another for thread scaling, e.g. 1,2"
        " (default: all cores)",
    )
    p.add_argument(
        "--peer",
        metavar="DIR",
        help="also time the peer's export (a stand-in for samexporter's ONNX export of SAM 2.1: upstream's modules"
        " through torch.onnx, run by onnxruntime) from DIR; a DIR that does not exist is exported there first,"
        " from the bundles' weights",
    )
    p.add_argument("--runs", type=int, default=5, help="timed rounds (each: 1 encode + --clicks decodes)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per subject after loading")
    p.add_argument("--clicks", type=int, default=4, help="decodes per round (point, point+negative, box, box+point)")
    p.add_argument("--records", default="records", help="folder for the JSON records (default: records/)")
    p.add_argument("--no-records", action="store_true", help="print only")
    p.add_argument("--bound", action="store_true", help="also compute the compute bound (implied by --compare)")
    p.add_argument("--config", choices=sorted(CONFIGS), help="upstream-only: model config (default Hiera-Tiny)")
    p.add_argument("--resolution", type=int, help="upstream-only: input side in pixels")
    p.add_argument("--checkpoint", help="upstream weights (default: the first bundle's recorded checkpoint)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile each bundle instead of timing it: time per operator type and slowest nodes from the"
        " runtime's profiler, and upstream eager's per-module profile (one JSON record per bundle)",
    )
    p.add_argument("--no-eager", action="store_true", help="with --profile: skip upstream eager's profile")


def parse_threads(text: str) -> list[int]:
    """'2' or '1,2' -> [2] / [1, 2]; anything else is a one-line UserError."""
    from sam2edge.errors import UserError

    try:
        counts = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--threads {text!r} must be a whole number or a comma list such as 1,2") from None
    if not counts or min(counts) < 1:
        raise UserError(f"--threads {text!r}: every count must be at least 1")
    return counts


def run_profiles(args: argparse.Namespace, bundles: list[str], threads: int) -> int:
    from sam2edge.checks.bench.eager_profile import format_profile, profile_bundle, write_profile

    for b in bundles:
        rec = profile_bundle(b, threads=threads, runs=args.runs, clicks=args.clicks, eager=not args.no_eager)
        print(format_profile(rec))
        if not args.no_records:
            print(f"record: {write_profile(rec, args.records)}")
    return 0


def run(args: argparse.Namespace) -> int:
    from sam2edge.checks.bench.bench import format_table, run_bench, write_records
    from sam2edge.errors import UserError

    bundles = list(args.bundles) + list(args.compare)
    upstream = args.upstream or bool(args.compare)
    if not bundles and not upstream and not args.peer:
        raise UserError("nothing to time; pass bundle folders, --upstream, --peer DIR or --compare DIR ...")
    threads = parse_threads(args.threads)
    for name, v, lo in (
        ("--runs", args.runs, 1),
        ("--warmup", args.warmup, 0),
        ("--clicks", args.clicks, 1),
    ):
        if v < lo:
            raise UserError(f"{name} {v} must be at least {lo}")
    if args.profile:
        if not bundles:
            raise UserError("--profile needs bundle folders to profile")
        return max(run_profiles(args, bundles, t) for t in threads)
    cfg = None
    if args.config or args.resolution:
        cfg = CONFIGS[args.config or "sam2.1-hiera-tiny"]
        if args.resolution:
            try:
                cfg = cfg.at_resolution(args.resolution)
            except ValueError as e:
                raise UserError(f"--resolution: {e}") from None
    out = run_bench(
        bundles,
        upstream=upstream,
        threads=threads,
        runs=args.runs,
        warmup=args.warmup,
        clicks=args.clicks,
        upstream_cfg=cfg,
        upstream_checkpoint=args.checkpoint,
        bound=args.bound or bool(args.compare),
        peer=args.peer,
    )
    print(format_table(out["records"]))
    if not args.no_records:
        for p in write_records(out["records"], args.records):
            print(f"record: {p}")
    return 0
