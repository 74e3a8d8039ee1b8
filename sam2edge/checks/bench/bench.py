"""Benchmarks: load time, encoder and per-click decoder latency, peak RSS, compute bound.

A *subject* is one thing timed: an export bundle (its runtime from ``BACKENDS``) or upstream eager (Meta's
``sam2`` modules with the same weights, in a process of its own: ``checks.bench.isolated``). ``run_bench`` loads
every subject (timed, one after another, each followed by its warm-up rounds), then runs the timed rounds
interleaved: round r times every subject once, in an order rotated by r, so slow drifts of the machine (other
jobs, heat) hit all subjects alike.

One round of a subject = encode one real photo (1x3xSxS, astronaut) + decode ``clicks``
prompts on it (point, point+negative, box, box+point, ...). ``first_click_ms`` of a round =
its encode + its first decode. In timed rounds every call follows ``IDLE_S`` idle: a runtime's threads
spin-wait for tens of ms after a call (onnxruntime 20-100 ms), and spinning beside the next call took half of
two cores from it (an ONNX click 16 -> 41 ms), so a subject is timed as if it ran alone.

Memory: ``peak_rss_mb`` is the process's high-water mark (VmHWM, reset before each subject's load where the
kernel allows) after load + warm-up; ``rss_delta_mb`` is how much that subject added to it (upstream: its own).

Compute bound: model FLOPs (``torch.utils.flop_counter``, the eager model at the subject's
resolution) / fp32 GEMM throughput measured here (2048^3 ``torch.mm``, same thread count).
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

import sam2edge
from sam2edge.bundle import load_card
from sam2edge.checks.bench.bound import compute_bound, gemm_gflops
from sam2edge.checks.bench.peer import check_peer_folder
from sam2edge.checks.bench.records import (  # noqa: F401
    PEER,
    UPSTREAM,
    add_ratios,
    add_scaling,
    command_line,
    format_table,
    git_commit,
    loadavg,
    machine,
    package_version,
    reset_peak_rss,
    rss_mb,
    vector_extensions,
    write_records,
)
from sam2edge.checks.fidelity import click_set, photo
from sam2edge.checks.fidelity.verify import bundle_config, model_prompt, open_backend, reference_weights
from sam2edge.config import HIERA_TINY, Sam2Config
from sam2edge.progress import Progress, stage
from sam2edge.runtime.preprocess import preprocess
from sam2edge.targets import TARGETS

BENCH_PHOTO = "astronaut.png"
# runtime (card.json target) -> the package whose version identifies it
RUNTIME_PACKAGES: dict[str, str] = {name: t.runtime_package for name, t in TARGETS.items()} | {
    UPSTREAM: "sam2",
    PEER: "onnxruntime",
}


def stats(samples: list[float]) -> dict:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "mean": statistics.fmean(samples),
        "n": len(samples),
        "samples": [round(s, 3) for s in samples],
    }


@dataclass
class Subject:
    """One timed runner and what it measured. Times in ms, load in s."""

    label: str
    runtime: str
    runner: object
    cfg: Sam2Config
    bundle: dict | None
    precision: str
    threads_applied: bool
    load_s: float = 0.0
    peak_rss_mb: float = 0.0
    rss_delta_mb: float = 0.0
    encoder_ms: list[float] = field(default_factory=list)
    decoder_ms: list[float] = field(default_factory=list)
    first_click_ms: list[float] = field(default_factory=list)
    inputs: tuple = ()
    peer: dict | None = None  # the peer subject's export (path, exporter, files' SHA-256)
    process: str = "bench"  # "bench": runs in the bench's process; "own": in a child (``checks.bench.isolated``)


def _prompts(cfg: Sam2Config, clicks: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    img = photo(BENCH_PHOTO)
    x = preprocess(img, cfg.image_size).numpy()  # 1x3xSxS
    prompts = [model_prompt(p, img.shape[:2], cfg.image_size) for p in click_set(clicks, photos=(BENCH_PHOTO,))]
    return x, prompts


def _timed_load(make) -> tuple[object, float, float]:
    """-> (runner, load seconds, RSS MB before loading); the peak RSS is reset first."""
    reset_peak_rss()
    before, _ = rss_mb()
    t0 = time.perf_counter()
    runner = make()
    return runner, time.perf_counter() - t0, before


def open_bundle_subject(folder: str | Path, threads: int) -> Subject:
    """Load a bundle's runtime (timed) with ``threads`` (every backend: ``from_bundle(folder, *, threads)``)."""
    folder = Path(folder)
    card = load_card(folder)
    cfg = bundle_config(card)
    runner, load_s, before = _timed_load(lambda: open_backend(folder, card, threads=threads))
    bundle = {
        "path": str(folder),
        "target": card["target"],
        "precision": card["precision"],
        "resolution": card["resolution"],
        "config": card["config"],
        "status": card["status"],
        "artifacts": {a["file"]: a["sha256"] for a in card["artifacts"]},
    }
    s = Subject(
        f"{card['target']} {card['precision']} {card['resolution']}",
        card["target"],
        runner,
        cfg,
        bundle,
        card["precision"],
        True,  # every backend takes from_bundle(..., threads=)
        load_s=load_s,
    )
    s.rss_delta_mb = before  # finished by warm_up
    return s


def _reference(cfg: Sam2Config, checkpoint: str | None, card: dict | None) -> tuple[dict, dict]:
    """The weights every baseline runs: ``checkpoint``, else ``card``'s recorded source (state dict, provenance)."""
    from sam2edge.weights import load_weights

    return reference_weights(card, cfg, checkpoint) if card is not None else load_weights(checkpoint, cfg)


def open_upstream_subject(
    cfg: Sam2Config, checkpoint: str | None, card: dict | None = None, threads: int = 1, own_process: bool = True
) -> Subject:
    """Upstream eager with the weights of ``checkpoint`` (or of ``card``'s recorded source); load timed from the
    weights in memory (module build + load_state_dict). ``own_process``: in a child process
    (``checks.bench.isolated``: loaded bundles slowed it in theirs), else here (a profiler's hooks reach it)."""
    from sam2edge.checks.bench.isolated import IsolatedUpstream
    from sam2edge.checks.fidelity.upstream import UpstreamRunner, upstream_from_state_dict

    sd, _ = _reference(cfg, checkpoint, card)
    label = f"{UPSTREAM} fp32 {cfg.image_size}"
    if own_process:
        runner = IsolatedUpstream(sd, cfg, threads)
        return Subject(label, UPSTREAM, runner, cfg, None, "fp32", True, load_s=runner.load_s, process="own")
    runner, load_s, before = _timed_load(lambda: UpstreamRunner(upstream_from_state_dict(sd, cfg), cfg))
    s = Subject(label, UPSTREAM, runner, cfg, None, "fp32", True, load_s=load_s)
    s.rss_delta_mb = before
    return s


def open_peer_subject(
    folder: str | Path, cfg: Sam2Config, checkpoint: str | None, card: dict | None, threads: int
) -> Subject:
    """The peer's export (``checks.bench.peer``) in ``folder``, exported there first from the baselines'
    weights when the folder does not exist (untimed); load = creating the two onnxruntime sessions."""
    from sam2edge.checks.bench.peer import PeerRunner, ensure_peer, file_digests
    from sam2edge.checks.fidelity.upstream import upstream_from_state_dict

    sd, prov = _reference(cfg, checkpoint, card)
    info = ensure_peer(folder, upstream_from_state_dict(sd, cfg), cfg, prov)
    del sd
    runner, load_s, before = _timed_load(lambda: PeerRunner(folder, cfg, threads))
    peer = {"path": str(folder), **{k: info[k] for k in ("peer", "opset", "exporter", "upstream")}}
    peer["files"] = file_digests(folder)  # the files timed (another export's files dropped in show here)
    s = Subject(f"peer onnx fp32 {cfg.image_size}", PEER, runner, cfg, None, "fp32", True, load_s=load_s)
    s.rss_delta_mb, s.peer = before, peer
    return s


# seconds idle before each timed call: longer than any runtime's spin-wait after a call (measured 20-100 ms)
IDLE_S = 0.25


def _round(s: Subject, idle: float = 0.0) -> tuple[float, list[float]]:
    """One encode and its clicks (ms each), each call after ``idle`` seconds idle."""
    x, prompts = s.inputs
    time.sleep(idle)
    t0 = time.perf_counter()
    feats = s.runner.encode(x)
    enc = _elapsed(s.runner, t0)
    decs = []
    for coords, labels in prompts:
        time.sleep(idle)
        t0 = time.perf_counter()
        s.runner.decode(feats, coords, labels, None)
        decs.append(_elapsed(s.runner, t0))
    return enc, decs


def _elapsed(runner, t0: float) -> float:
    """ms of the call that began at ``t0``: as the runner measured it where it runs in another process
    (``last_ms``, the pipe's transfer left out), else the wall time here."""
    own = getattr(runner, "last_ms", None)
    return own if own is not None else (time.perf_counter() - t0) * 1e3


def warm_up(s: Subject, warmup: int, clicks: int) -> None:
    s.inputs = _prompts(s.cfg, clicks)
    for _ in range(warmup):
        _round(s)
    if s.process == "own":  # its memory is its process's
        own = s.runner.stats()
        s.peak_rss_mb, s.rss_delta_mb = own["peak_rss_mb"], own["rss_delta_mb"]
        return
    cur, peak = rss_mb()
    s.peak_rss_mb = peak
    s.rss_delta_mb = max(peak, cur) - s.rss_delta_mb


def _open_subjects(bundles, upstream, peer, threads, warmup, clicks, cfg, checkpoint) -> list[Subject]:
    """The bundles, then the baselines (upstream eager, the peer's export), each loaded and warmed up in turn;
    the baselines run the first bundle's weights (its recorded checkpoint) and resolution unless given."""
    card = load_card(Path(bundles[0])) if bundles and checkpoint is None else None
    cfg = cfg or (bundle_config(load_card(Path(bundles[0]))) if bundles else HIERA_TINY)
    opens = [(f"load {b}", partial(open_bundle_subject, b, threads)) for b in bundles]
    if upstream:
        what = f"load upstream eager ({cfg.image_size}px)"
        opens.append((what, partial(open_upstream_subject, cfg, checkpoint, card, threads)))
    if peer is not None:
        what = f"load the peer's export {peer} (exported there first if it does not exist)"
        opens.append((what, partial(open_peer_subject, peer, cfg, checkpoint, card, threads)))
    subjects = []
    for what, open_subject in opens:
        stage(what)
        s = open_subject()
        stage(f"warm up {s.label} ({warmup} round(s))")
        warm_up(s, warmup, clicks)
        subjects.append(s)
    labels = [s.label for s in subjects]
    for s in subjects:  # two bundles of one target, precision and size (a before / after): name their folders
        if labels.count(s.label) > 1 and s.bundle is not None:
            s.label = f"{s.label} [{Path(s.bundle['path']).name}]"
    return subjects


def time_rounds(subjects: list[Subject], runs: int) -> None:
    """``runs`` timed rounds, every subject once per round, order rotated each round."""
    with Progress("bench: timed rounds", runs * len(subjects), unit="round") as bar:
        for r in range(runs):
            k = r % len(subjects)
            for s in subjects[k:] + subjects[:k]:
                enc, decs = _round(s, IDLE_S)
                s.encoder_ms.append(enc)
                s.decoder_ms.extend(decs)
                s.first_click_ms.append(enc + decs[0])
                bar.step(note=s.label)


def run_bench(bundles: list[str | Path], *, threads: int | list[int], **kw) -> dict:
    """``bench_once`` at each thread count in turn (one count: as it is); records of every count, ratios
    to upstream within a count, and each subject's speed-up over its fewest-thread run (``add_scaling``)."""
    counts = [threads] if isinstance(threads, int) else list(threads)
    outs = [bench_once(bundles, threads=t, **kw) for t in counts]
    records = [r for o in outs for r in o["records"]]
    add_scaling(records)
    return {"session": outs[0]["session"], "records": records}


def bench_once(
    bundles: list[str | Path],
    *,
    upstream: bool,
    threads: int,
    runs: int,
    warmup: int,
    clicks: int,
    upstream_cfg: Sam2Config | None = None,
    upstream_checkpoint: str | None = None,
    bound: bool = False,
    peer: str | Path | None = None,
) -> dict:
    """Load, warm up and time every subject (interleaved); -> {session, subjects: [records], bound}.
    ``peer``: a folder for the peer's export (``checks.bench.peer``), timed as one more baseline."""
    for b in bundles:  # every card valid before anything is loaded
        load_card(Path(b))
    if peer is not None:
        check_peer_folder(peer)
    torch.set_num_threads(threads)
    load_before = loadavg()
    subjects = _open_subjects(bundles, upstream, peer, threads, warmup, clicks, upstream_cfg, upstream_checkpoint)
    try:
        time_rounds(subjects, runs)
    finally:
        for s in (s for s in subjects if s.process == "own"):
            s.runner.close()
    bounds = {}
    if bound:
        stage("compute bound: model FLOPs and GEMM throughput")
        g = gemm_gflops(threads)
        for s in subjects:
            if s.cfg not in bounds:
                bounds[s.cfg] = compute_bound(s.cfg, g)
    now = _dt.datetime.now(_dt.UTC)
    session = f"{now.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
    env = {"machine": machine(), "loadavg_1m_start": load_before, "loadavg_1m_end": loadavg()}
    records = [to_record(s, threads, runs, warmup, clicks, session, now, env, bounds.get(s.cfg)) for s in subjects]
    add_ratios(records)
    return {"session": session, "records": records}


def to_record(s: Subject, threads, runs, warmup, clicks, session, now, env, bound) -> dict:
    """The JSON record of one subject's run (schema 1, provenance measured)."""
    pkg = RUNTIME_PACKAGES.get(s.runtime)
    rec = {
        "schema": 1,
        "kind": "bench",
        "provenance": "measured",
        "subject": s.label,
        "runtime": s.runtime,
        "runtime_version": f"{pkg} {package_version(pkg)}" if pkg else "unknown",
        "version": f"sam2edge {sam2edge.__version__}",
        "precision": s.precision,
        "resolution": s.cfg.image_size,
        "bundle": s.bundle,
        "machine": env["machine"],
        "threads": threads,
        "threads_applied": s.threads_applied,
        "date": now.strftime("%Y-%m-%d"),
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "session": session,
        "command": command_line(),
        "commit": git_commit(),
        "runs": runs,
        "warmup": warmup,
        "clicks_per_run": clicks,
        "idle_s": IDLE_S,  # idle before each timed call
        "process": s.process,  # "own": timed in a process of its own (upstream eager)
        "loadavg_1m_start": env["loadavg_1m_start"],
        "loadavg_1m_end": env["loadavg_1m_end"],
        "load_s": s.load_s,
        "peak_rss_mb": s.peak_rss_mb,
        "rss_delta_mb": s.rss_delta_mb,
        "encoder_ms": stats(s.encoder_ms),
        "decoder_ms": stats(s.decoder_ms),
        "first_click_ms": stats(s.first_click_ms),
    }
    if s.peer:
        rec["peer"] = s.peer
    if bound:
        rec["compute_bound"] = bound
    return rec
