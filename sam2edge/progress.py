"""Progress on stderr from tqdm: bars with count, rate and ETA (a plain line per update when not a terminal).

``Progress(label, total)`` is a bar stepped once per unit of work; ``Stages(label, names)`` is a bar over the
named stages of a long job (export, gpu-check, sweep), each stage's name shown while it runs; ``stage(msg)``
prints one line above any running bar.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def _bar(label: str, total: int, unit: str) -> tqdm:
    return tqdm(total=max(total, 1), desc=label, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True)


class Progress:
    """A bar of ``total`` steps: count, rate and ETA, closed when the last step is done."""

    def __init__(self, label: str, total: int, unit: str = "step") -> None:
        self.bar = _bar(label, total, unit)

    def step(self, n: int = 1, note: str = "") -> None:
        if note:
            self.bar.set_postfix_str(note[:40], refresh=False)
        self.bar.update(n)
        if self.bar.n >= self.bar.total:
            self.bar.close()

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:  # closed before an error is reported, so the error line comes last
        self.close()


class Stages:
    """A bar over the named stages of a job; ``next(name)`` starts a stage (and finishes the previous).
    ``seconds``: wall seconds of every finished stage, by name (a repeated name adds up)."""

    def __init__(self, label: str, total: int) -> None:
        self.bar, self.started = _bar(label, total, "stage"), 0
        self.seconds: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def next(self, name: str) -> None:
        if self.started:
            self.bar.update(1)
        self.finish_stage()
        self._current = (name, time.perf_counter())
        self.started += 1
        self.bar.set_postfix_str(name[:60])

    def extend(self, n: int) -> None:
        """``n`` more stages than announced (a step that runs again)."""
        self.bar.total += n
        self.bar.refresh()

    def finish_stage(self) -> None:
        if self._current is not None:
            name, t0 = self._current
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 3)
            self._current = None

    def close(self) -> None:
        if self.started:
            self.bar.update(1)
        self.bar.close()


def stage(msg: str) -> None:
    """One line announcing a long step (written above any running bar)."""
    tqdm.write(f"-> {msg}", file=sys.stderr)
