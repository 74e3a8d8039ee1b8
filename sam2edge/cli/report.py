"""``sam2edge report RECORDS... --out docs/benchmarks.md``: measured tables and charts from published records.

Each RECORDS argument is a ``sam2edge.table/1`` JSON file or a folder of them (``benchmarks/records/``). The
Markdown file and one PNG chart per record that asks for one are written beside ``--out``; a file there is
replaced only if this command wrote it (its first lines say so), never a file of the user's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sam2edge.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("records", nargs="+", help="record files or folders of them (benchmarks/records/)")
    p.add_argument("--out", required=True, help="Markdown file to write, e.g. docs/benchmarks.md")
    p.add_argument("--title", default="Benchmarks", help="the document's title")


def _record_files(args: list[str]) -> list[Path]:
    files: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{a} does not exist; pass record files or a folder of them (benchmarks/records/)")
    if not files:
        raise UserError("no records found; pass .json record files or a folder holding them")
    return files


def run(args: argparse.Namespace) -> int:
    from sam2edge.cards.report import HEADER, RecordError, read_record, render
    from sam2edge.io import atomic_path

    out = Path(args.out)
    if out.suffix != ".md":
        raise UserError(f"--out {out} must be a Markdown file name ending in .md")
    try:
        records = [read_record(f) for f in _record_files(args.records)]
        files = render(records, stem=out.stem, title=args.title)
    except RecordError as e:
        raise UserError(f"{e}; fix the record (schema in sam2edge/cards/report.py)") from None
    inputs = {f.resolve() for f in _record_files(args.records)}
    ours = out.is_file() and HEADER in out.read_text(errors="replace")[:400]  # an earlier report's document
    for name in files:
        dest = out.with_name(name)
        if dest.resolve() in inputs:
            raise UserError(f"{dest} is one of the records; choose another --out")
        if dest.exists() and not ours:
            raise UserError(f"{dest} exists and was not written by sam2edge report; choose another --out")
    for name, data in files.items():
        with atomic_path(out.with_name(name)) as tmp:
            tmp.write_bytes(data)
    print(f"wrote {out} ({len(records)} records, {len(files) - 1} charts)")
    return 0
