"""``sam2edge manifest verify DIR`` / ``sam2edge manifest write DIR``.

verify: every file listed in manifest.json must have its SHA-256 and size, and no file may be
unlisted; each problem is printed naming the file, exit 1. write: rebuild manifest.json from the
folder (after an intended change).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("verify", "write"), help="verify the files, or rewrite manifest.json")
    p.add_argument("bundle", help="bundle folder holding manifest.json")


def run(args: argparse.Namespace) -> int:
    from sam2edge.bundle import MANIFEST, verify_manifest, write_manifest
    from sam2edge.errors import UserError

    folder = Path(args.bundle)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; pass a bundle folder written by `sam2edge export`")
    if args.action == "write":
        n = len(write_manifest(folder)["files"])
        print(f"wrote {folder / MANIFEST}: {n} files")
        return 0
    problems = verify_manifest(folder)
    for line in problems:
        print(f"FAIL: {line}")
    if problems:
        print(f"manifest verify: {len(problems)} problem(s) in {folder}")
        return 1
    print(f"OK: every file in {folder / MANIFEST} matches its SHA-256 and size")
    return 0
