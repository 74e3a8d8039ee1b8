"""``sam2edge lint FILE.tflite [--json]``: op census, node count, highest rank, banned ops, verdict.

Exit status: 0 for a GPU-clean graph, 1 when banned ops or >4-D tensors are present,
2 for a file that is not a readable .tflite (one-line error).
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE.tflite", help="TFLite flatbuffer(s) to lint")
    p.add_argument("--json", action="store_true", help="print the report as JSON (a list for several files)")


def run(args: argparse.Namespace) -> int:
    from sam2edge.checks.tflite.lint import format_report, lint_file

    reports = [lint_file(f) for f in args.files]  # every file is parsed before anything is printed
    if args.json:
        docs = [r.to_dict() for r in reports]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        print("\n\n".join(format_report(r) for r in reports))
    return 0 if all(r.clean for r in reports) else 1
