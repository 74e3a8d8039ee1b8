"""``sam2edge web BUNDLE [BUNDLE ...] --out site/``: a static folder (page, LiteRT.js, model files, manifest,
README) that any static host serves; every model stage runs in the browser (``serve.site``)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "bundle",
        nargs="+",
        help="LiteRT bundle folder (`sam2edge export --target litert`; add --video to track); several: one model "
        "exported at several --resolution values (same checkpoint), the page's picker switches between them",
    )
    p.add_argument("--out", required=True, help="new or empty folder to write (or one this command wrote before)")


def run(args: argparse.Namespace) -> int:
    from sam2edge.serve.site import write_site

    out = write_site(args.bundle if len(args.bundle) > 1 else args.bundle[0], args.out)
    print(f"wrote {out}/ (serve it with COOP/COEP headers for threaded wasm; see {out}/README.md)")
    return 0
