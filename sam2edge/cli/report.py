"""``sam2edge report``: benchmark JSON records -> a Markdown page of measured tables and a latency chart PNG."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("records", nargs="+", help="JSON record files or folders of them (e.g. benchmarks/records/)")
    p.add_argument("--out", required=True, help="Markdown page to write (e.g. docs/benchmarks.md)")
    p.add_argument("--chart", help="latency chart PNG to write (default: <out stem>_latency.png beside --out)")


def run(args: argparse.Namespace) -> int:
    from sam2edge.cards.report import MARK, latency_chart, load_records, markdown
    from sam2edge.errors import UserError

    records = load_records(args.records)
    out = Path(args.out)
    if out.exists() and MARK not in out.read_text(errors="replace"):
        raise UserError(f"{out} exists and was not written by `sam2edge report`; pass another --out")
    chart = Path(args.chart) if args.chart else out.with_name(f"{out.stem}_latency.png")
    drawn = latency_chart(records, chart)
    rel = os.path.relpath(chart, out.parent) if drawn else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(records, rel))
    print(f"wrote {out} ({len(records)} records)" + (f" and {chart}" if drawn else ""))
    return 0
