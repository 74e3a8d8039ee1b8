"""A minimal progress display on stderr: a redrawn bar on a terminal, a line per step otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, stream=None) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.t0 = time.perf_counter()
        self._last_pct = -1

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        pct = int(100 * self.done / self.total)
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            bar = "#" * (pct // 5) + "." * (20 - pct // 5)
            end = "\n" if self.done == self.total else ""
            self.stream.write(f"\r{self.label} [{bar}] {pct:3d}% {elapsed:6.1f}s {note[:40]:<40}{end}")
        elif pct // 10 != self._last_pct // 10 or self.done == self.total:
            self.stream.write(f"{self.label}: {self.done}/{self.total} ({pct}%) {elapsed:.1f}s {note}\n")
        self._last_pct = pct
        self.stream.flush()


def stage(msg: str) -> None:
    """One line announcing a long step."""
    print(f"-> {msg}", file=sys.stderr, flush=True)
