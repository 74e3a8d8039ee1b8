"""The eager model's profile and ``profile_bundle``: one bundle's runtime profile next to upstream's.

Eager = upstream Meta ``sam2`` modules with the bundle's weights (the bench's baseline subject), run on
the bench's inputs. Two views of the same timed runs:
  by_type     ``torch.profiler`` self CPU time per aten operator (ms per call of encode / decode);
  by_module   inclusive wall time of every module up to ``MODULE_DEPTH`` dots deep (forward hooks),
              e.g. ``image_encoder.trunk.blocks.3`` or ``sam_mask_decoder.transformer.layers.0``.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path

import torch

from sam2edge.bundle import load_card, write_json
from sam2edge.checks.bench.bench import _prompts, loadavg, machine
from sam2edge.checks.bench.profile import PROFILERS, NodeTime, summarise
from sam2edge.checks.fidelity.verify import bundle_config, open_backend
from sam2edge.errors import UserError

MODULE_DEPTH = 3


def _module_hooks(model: torch.nn.Module, acc: dict[str, float]) -> list:
    """Forward pre/post hooks adding each shallow module's inclusive wall ms to ``acc``."""
    handles, starts = [], {}
    for name, mod in model.named_modules():
        if not name or name.count(".") >= MODULE_DEPTH:
            continue

        def pre(_m, _a, name=name):
            starts[name] = time.perf_counter()

        def post(_m, _a, _o, name=name):
            acc[name] = acc.get(name, 0.0) + (time.perf_counter() - starts.pop(name)) * 1e3

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


def _aten_times(prof, calls: int) -> list[NodeTime]:
    return [
        NodeTime(e.key, e.key, e.self_cpu_time_total / 1e3 / calls)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    ]


def _eager_graph(runner, fn, calls: int) -> dict:
    """Profile ``fn`` (one warm call first), which makes ``calls`` encode or decode calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    acc: dict[str, float] = {}
    handles = _module_hooks(runner.model, acc)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        for h in handles:
            h.remove()
    mods = sorted(acc.items(), key=lambda kv: -kv[1])
    return summarise(_aten_times(prof, calls)) | {
        "calls": calls,
        "by_module": [{"module": k, "ms": v / calls} for k, v in mods[:25]],
        "source": "torch.profiler self CPU time per aten op; forward hooks for module inclusive time",
    }


def profile_eager(card: dict, inputs: tuple, runs: int) -> dict:
    """Upstream eager with the bundle's weights: -> {encoder, decoder} profiles."""
    from sam2edge.checks.bench.bench import open_upstream_subject

    runner = open_upstream_subject(bundle_config(card), None, card, own_process=False).runner
    x, prompts = inputs
    feats = runner.encode(x)

    def enc():
        for _ in range(runs):
            runner.encode(x)

    def dec():
        for _ in range(runs):
            for coords, labels in prompts:
                runner.decode(feats, coords, labels, None)

    return {"encoder": _eager_graph(runner, enc, runs), "decoder": _eager_graph(runner, dec, runs * len(prompts))}


def profile_bundle(folder: str | Path, *, threads: int, runs: int = 3, clicks: int = 4, eager: bool = True) -> dict:
    """Runtime profile of one bundle (``PROFILERS[target]``) and, with ``eager``, upstream's -> a record."""
    folder = Path(folder)
    card = load_card(folder)
    target = card["target"]
    if target not in PROFILERS:
        raise UserError(f"no profiler for target {target!r}; profiles exist for {sorted(PROFILERS)}")
    torch.set_num_threads(threads)
    cfg = bundle_config(card)
    inputs = _prompts(cfg, clicks)
    load_start = loadavg()
    backend = open_backend(folder, card, threads=threads)
    now = _dt.datetime.now(_dt.UTC)
    rec = {
        "schema": 1,
        "kind": "profile",
        "subject": f"{target} {card['precision']} {card['resolution']}",
        "bundle": str(folder),
        "target": target,
        "precision": card["precision"],
        "resolution": card["resolution"],
        "threads": threads,
        "runs": runs,
        "clicks_per_run": clicks,
        "machine": machine(),
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "session": f"{now.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}",
        "runtime": PROFILERS[target](folder, backend, inputs, threads, runs),
    }
    if eager:
        rec["eager"] = profile_eager(card, inputs, runs)
    rec["loadavg_1m_start"], rec["loadavg_1m_end"] = load_start, loadavg()
    return rec


def write_profile(rec: dict, folder: str | Path) -> Path:
    """``folder/<date>/profile-<subject>__<session>.json`` beside the bench records."""
    slug = "-".join(rec["subject"].split())
    path = Path(folder) / rec["time"][:10] / f"profile-{slug}__{rec['session']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, rec)
    return path


def format_profile(rec: dict, types: int = 12, nodes: int = 8) -> str:
    """Per graph: operator types (ms per call, share, count) and the slowest nodes; eager modules too."""
    lines = [
        f"profile {rec['subject']} ({rec['threads']} thread(s), {rec['runs']} run(s), load {rec['loadavg_1m_end']})"
    ]
    for who in ("runtime", "eager"):
        for graph, p in rec.get(who, {}).items():
            label = rec["target"] if who == "runtime" else "upstream eager"
            extra = f", whole graph {p['whole_graph_ms']:.2f} ms" if "whole_graph_ms" in p else ""
            lines += ["", f"{label} {graph}: {p['total_ms']:.2f} ms per call summed over nodes{extra} [{p['source']}]"]
            lines += [
                f"  {t['op'][:44]:<44} {t['ms']:>9.3f} ms {t['share']:>6.1%} x{t['count']}"
                for t in p["by_type"][:types]
            ]
            if who == "runtime":  # eager's nodes are its aten operator types, listed above
                lines.append("  slowest nodes:")
                lines += [
                    f"    {n['name'][-60:]:<60} {n['op'][:24]:<24} {n['ms']:>8.3f} ms" for n in p["top_nodes"][:nodes]
                ]
            if "by_module" in p:
                lines.append("  modules (inclusive):")
                lines += [f"    {m['module'][:60]:<60} {m['ms']:>9.3f} ms" for m in p["by_module"][:nodes]]
    return "\n".join(lines)
