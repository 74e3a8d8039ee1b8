"""``sam2edge card render DIR [--records DIR ...]``: README.md (model card) from card.json + evidence.

Every number in the card comes from card.json, fidelity.json, the bench records that match the
bundle's artifacts (SHA-256) and the sweep records under ``DIR/sweep/``. Matching bench records
are copied into ``DIR/records/``; card.json's ``records`` lists what was found; a latency chart
``latency.png`` is drawn from the records; manifest.json is rewritten.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("render",), help="render README.md")
    p.add_argument("bundle", help="bundle folder holding card.json")
    p.add_argument(
        "--records",
        action="append",
        default=None,
        help="folder of bench records to search (repeatable; default: ./records and DIR/records)",
    )


def run(args: argparse.Namespace) -> int:
    from sam2edge.cards.render import render_bundle

    folder = Path(args.bundle)
    search = [Path(r) for r in args.records] if args.records else [Path("records")]
    out = render_bundle(folder, search)
    print(
        f"wrote {out['readme']} ({out['bench']} bench records, {out['sweep']} sweep records"
        f"{', chart ' + str(out['chart']) if out['chart'] else ''})"
    )
    return 0
