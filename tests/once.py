"""Test-run-wide fixtures' storage: under pytest-xdist (`make test` runs two workers on two cores) a
session fixture runs once per worker, so the expensive ones (test-small exports) build their folder once
per test run, here, and every worker reads it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... under pytest-xdist; None without it


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name``, built by ``build(folder)`` once per test run: one worker builds it under a file
    lock, the others wait for it and read. A failed build leaves no ``.done`` mark (the next one retries)."""
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if WORKER else root) / "built-once"  # the parent is shared by this run's workers
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            build(out)
            done.touch()
    return out
