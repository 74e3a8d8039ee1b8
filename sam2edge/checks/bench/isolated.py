"""Upstream eager timed in a process of its own, so that loaded bundles cannot slow the baseline.

Beside loaded bundles in one process, upstream eager's encode ran 2063 -> 2772 ms p50 (slowest 8356 ms, with 8.38 s
of system CPU: kernel time on its fresh per-call memory; ``benchmarks/bench_eager_beside.py``), which inflated
every "vs upstream" ratio. ``IsolatedUpstream`` keeps the model in a child process (``multiprocessing`` spawn: a
fresh interpreter, nothing of the parent's heap) and has the bench interface of ``UpstreamRunner``:

  parent  ``encode(image)`` / ``decode(feats, coords, labels, mask_input)`` send the inputs over a pipe;
  child   runs ``UpstreamRunner`` with the same inputs, keeps the features of the last encode, and answers
          with the call's milliseconds measured around the call itself (the pipe's transfer is not timed).

``last_ms`` holds the child's time of the last call; ``checks.bench.bench._round`` times a runner that has one by
it. The child loads the weights from a file the parent writes (``torch.save``), and reports its own load time and
RSS (``stats()``) so the record describes the process that ran the model.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from sam2edge.config import Sam2Config
from sam2edge.errors import UserError

START_TIMEOUT_S = 600.0  # the child imports torch and sam2 and builds the model: minutes for the largest size


class UpstreamProcessDied(UserError):
    """The child ended before answering (killed for memory, or a crash in torch): one line, not EOFError."""


def _serve(conn, weights: str, cfg: Sam2Config, threads: int) -> None:
    """The child: load upstream eager, then answer ("encode", x) / ("decode", coords, labels, mask) / ("stats",) /
    ("close",) with the call's milliseconds (or the stats dict) until closed; ("probe",): its pid and the first
    output of its last decode, for tests."""
    import torch

    from sam2edge.checks.bench.records import rss_mb
    from sam2edge.checks.fidelity.upstream import UpstreamRunner, upstream_from_state_dict

    torch.set_num_threads(threads)
    before, _ = rss_mb()
    t0 = time.perf_counter()
    runner = UpstreamRunner(upstream_from_state_dict(torch.load(weights, weights_only=True), cfg), cfg)
    load_s = time.perf_counter() - t0
    conn.send(("ready", load_s))
    feats = decoded = None
    while True:
        msg = conn.recv()
        if msg[0] == "close":
            conn.close()
            return
        if msg[0] == "stats":
            cur, peak = rss_mb()
            conn.send({"load_s": load_s, "peak_rss_mb": peak, "rss_delta_mb": max(cur, peak) - before})
            continue
        if msg[0] == "probe":  # which process ran it, and the first output of its last decode
            conn.send((os.getpid(), None if decoded is None else torch.as_tensor(decoded[0]).detach().numpy()))
            continue
        t0 = time.perf_counter()
        if msg[0] == "encode":
            feats = runner.encode(msg[1])
        else:
            decoded = runner.decode(feats, *msg[1:])
        conn.send((time.perf_counter() - t0) * 1e3)


class IsolatedUpstream:
    """Upstream eager of ``sd`` in a child process, ``threads`` intra-op threads; ``close()`` ends it."""

    name = "upstream-eager (own process)"

    def __init__(self, sd: dict, cfg: Sam2Config, threads: int) -> None:
        import torch

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        with tempfile.TemporaryDirectory(prefix="sam2edge-upstream-") as d:
            path = Path(d) / "weights.pt"
            torch.save(sd, str(path))
            self._proc = ctx.Process(target=_serve, args=(child, str(path), cfg, threads), daemon=True)
            self._proc.start()
            child.close()
            if not self._conn.poll(START_TIMEOUT_S):
                self.close()
                raise UpstreamProcessDied(
                    f"upstream eager's process did not start within {START_TIMEOUT_S:.0f} s; "
                    "free memory and cores (or bench a smaller --config) and run again"
                )
            _, self.load_s = self._ask()
        self.last_ms: float | None = None

    def _ask(self, *msg):
        """Send ``msg`` (none: await the start) and return the child's answer; a child that is gone is one
        UserError line naming the message it did not answer."""
        try:
            if msg:
                self._conn.send(msg)
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(10)
            code = self._proc.exitcode
            raise UpstreamProcessDied(
                f"upstream eager's process ended during {msg[0] if msg else 'start'} (exit code {code}"
                f"{', killed by signal ' + str(-code) if code is not None and code < 0 else ''}); "
                "it may have run out of memory: close other programs or bench a smaller --config, and run again"
            ) from None

    def _call(self, *msg) -> float:
        self.last_ms = self._ask(*msg)
        return self.last_ms

    def encode(self, image: np.ndarray) -> None:
        """Encode ``image`` (1x3xSxS float32) in the child; its features stay there for ``decode``."""
        self._call("encode", np.ascontiguousarray(image))

    def decode(self, feats, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None = None) -> None:
        """Decode the child's last encode with a prompt (``feats`` is ignored: the features live in the child)."""
        self._call("decode", coords, labels, mask_input)

    def stats(self) -> dict:
        """The child's load seconds, peak RSS and RSS growth since before it loaded the model (MB)."""
        return self._ask("stats")

    def probe(self) -> tuple[int, np.ndarray | None]:
        """(the child's pid, the first output of its last decode as numpy): what ran where, for tests."""
        return self._ask("probe")

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            self.close()
