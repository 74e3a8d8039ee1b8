"""The command line the benchmark scripts share: their inputs checked before any work, each problem one line
(None: nothing wrong), refused as ``error: ...`` with exit status 2, and no file of the user's written over.

A script builds its parser, then ``parsed(parser, argv, problem)``, where ``problem(args)`` is the first of
its checks that fails (``first``): ``missing_files``, ``at_least``, ``new_file``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

DEFAULT_CONFIG = "sam2.1-hiera-tiny"  # the size the robustness set and the speed records use


def add_checkpoints(parser: argparse.ArgumentParser, default_config: str = DEFAULT_CONFIG) -> None:
    """Positional CHECKPOINT... and ``--config`` (one of ``sam2edge.config.CONFIGS``)."""
    from sam2edge.config import CONFIGS

    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--config", default=default_config, choices=sorted(CONFIGS))


def missing_files(paths: Iterable[str | Path], give: str) -> str | None:
    """The first of ``paths`` that is not a file: '<path>: no such file; <give>'."""
    missing = [p for p in paths if not Path(p).is_file()]
    return f"{missing[0]}: no such file; {give}" if missing else None


def at_least(flag: str, value: int, least: int = 1) -> str | None:
    """'<flag> <value>: give <least> or more' where ``value`` is below ``least``."""
    return f"{flag} {value}: give {least} or more" if value < least else None


def new_file(path: str | Path | None, flag: str) -> str | None:
    """Where a script would write ``path`` (None: it writes nothing): refused where it exists (an input
    included: it is never overwritten) or its folder does not."""
    if path is None or str(path) == "":
        return None
    if Path(path).exists():
        return f"{path} exists; name a new file for {flag} (it is never overwritten)"
    if not Path(path).parent.is_dir():
        return f"{path}: its folder does not exist; create it or name a file in an existing folder"
    return None


def first(*problems: str | None) -> str | None:
    """The first problem that is one (checks written in the order a user should fix them)."""
    return next((p for p in problems if p), None)


def parsed(
    parser: argparse.ArgumentParser, argv: list[str] | None, problem: Callable[[argparse.Namespace], str | None]
) -> argparse.Namespace | None:
    """The parsed arguments, or None after printing ``error: <problem>`` in one line (the caller returns 2)."""
    args = parser.parse_args(argv)
    found = problem(args)
    if found:
        print(f"error: {found}", file=sys.stderr)
        return None
    return args


def refusing(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` with a ``UserError`` raised on the way (a file that is not a checkpoint of ``--config``, say)
    printed as ``error: ...`` in one line, exit status 2."""
    import functools

    from sam2edge.errors import UserError

    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return run
