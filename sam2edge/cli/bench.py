"""``sam2edge bench DIR ... | --upstream [--compare DIR ...] [--threads N] [--runs N --warmup N]``.

Times each bundle (and upstream eager with the same weights) in one session, interleaved;
prints a table; writes one JSON record per subject under ``--records`` (default ``records/``).
``--compare`` adds upstream eager and the compute bound and prints the ratios.
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
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads per runtime (default: all cores)")
    p.add_argument("--runs", type=int, default=5, help="timed rounds (each: 1 encode + --clicks decodes)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per subject after loading")
    p.add_argument("--clicks", type=int, default=4, help="decodes per round (point, point+negative, box, box+point)")
    p.add_argument("--records", default="records", help="folder for the JSON records (default: records/)")
    p.add_argument("--no-records", action="store_true", help="print only")
    p.add_argument("--bound", action="store_true", help="also compute the compute bound (implied by --compare)")
    p.add_argument("--config", choices=sorted(CONFIGS), help="upstream-only: model config (default Hiera-Tiny)")
    p.add_argument("--resolution", type=int, help="upstream-only: input side in pixels")
    p.add_argument("--checkpoint", help="upstream weights (default: the first bundle's recorded checkpoint)")


def run(args: argparse.Namespace) -> int:
    from sam2edge.checks.bench.bench import format_table, run_bench, write_records
    from sam2edge.errors import UserError

    bundles = list(args.bundles) + list(args.compare)
    upstream = args.upstream or bool(args.compare)
    if not bundles and not upstream:
        raise UserError("nothing to time; pass bundle folders, --upstream, or --compare DIR ...")
    for name, v, lo in (
        ("--threads", args.threads, 1),
        ("--runs", args.runs, 1),
        ("--warmup", args.warmup, 0),
        ("--clicks", args.clicks, 1),
    ):
        if v < lo:
            raise UserError(f"{name} {v} must be at least {lo}")
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
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        clicks=args.clicks,
        upstream_cfg=cfg,
        upstream_checkpoint=args.checkpoint,
        bound=args.bound or bool(args.compare),
    )
    print(format_table(out["records"]))
    if not args.no_records:
        for p in write_records(out["records"], args.records):
            print(f"record: {p}")
    return 0
