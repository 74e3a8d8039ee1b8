"""A browser run's outputs vs the CPU reference: per-output comparison, status, evidence (``serve.sweep``)."""

from __future__ import annotations

import base64
import statistics

import numpy as np

from sam2edge.checks.fidelity import compare

BACKEND_LABELS = {"wasm": "wasm_xnnpack", "webgpu": "webgpu_mldrift"}
STATUSES = ("pass", "output_mismatch", "fallback", "load_error", "timeout")


def _decode_outputs(result: dict) -> list[tuple[str, np.ndarray]]:
    out = []
    for o in result.get("outputs", []):
        a = np.frombuffer(base64.b64decode(o["b64"]), dtype="<f4").reshape(o["shape"])
        out.append((o["name"], a))
    return out


def _status(res: dict, cfg, accel: str) -> dict:
    """Classify one browser run (already compared) into the record fields."""
    deleg = res.get("delegation") or {}
    full = None
    if accel == "webgpu" and res.get("ok"):
        full = not (deleg.get("cpu_ops") or deleg.get("whole_graph_fell_back"))
    if res.get("timed_out"):
        status = "timeout"
    elif not res.get("ok"):
        status = "load_error"
    elif res["max_rel_diff"] is None or res["max_rel_diff"] > cfg.tolerance:
        status = "output_mismatch"
    elif full is False:
        status = "fallback"
    else:
        status = "pass"
    return {"status": status, "full_delegation": full}


def _compare_outputs(res: dict, ref: list[tuple[str, np.ndarray]]) -> tuple[dict, dict, tuple]:
    """Browser outputs vs the CPU reference, matched by tensor name -> (run, per output, (worst max-rel,
    worst max-abs, lowest cosine)); a count or shape mismatch marks the run failed."""
    per, worst_rel, worst_abs, min_cos = {}, None, None, None
    if not res.get("ok"):
        return res, per, (worst_rel, worst_abs, min_cos)
    got = _decode_outputs(res)
    if len(got) != len(ref):
        res = {**res, "ok": False, "error": f"{len(got)} outputs in the browser, {len(ref)} on the CPU"}
        return res, per, (worst_rel, worst_abs, min_cos)
    ref_by = dict(ref)
    if all(n in ref_by for n, _ in got):  # match by tensor name (orders differ: tensor vs sorted)
        ref = [(n, ref_by[n]) for n, _ in got]
    for (_, a), (rname, b) in zip(got, ref):
        if a.shape != b.shape:
            res = {**res, "ok": False, "error": f"output {rname}: shape {a.shape} vs CPU {b.shape}"}
            break
        c = compare(a, b)
        per[rname] = {k: c[k] for k in ("max_rel", "max_abs", "cosine")}
        per[rname]["all_zero"] = bool(a.size and not np.any(a)) and bool(np.any(b))
        worst_rel = c["max_rel"] if worst_rel is None else max(worst_rel, c["max_rel"])
        worst_abs = c["max_abs"] if worst_abs is None else max(worst_abs, c["max_abs"])
        min_cos = c["cosine"] if min_cos is None else min(min_cos, c["cosine"])
    if not np.isfinite(worst_rel if worst_rel is not None else np.nan):
        worst_rel = float("inf")
    return res, per, (worst_rel, worst_abs, min_cos)


def _result_row(accel: str, res: dict, ref: list[tuple[str, np.ndarray]], cfg) -> dict:
    row = {"backend": BACKEND_LABELS[accel], "accelerator": accel}
    res, per, (worst_rel, worst_abs, min_cos) = _compare_outputs(res, ref)
    res = {**res, "max_rel_diff": worst_rel}
    row.update(_status(res, cfg, accel))
    deleg = dict(res.get("delegation") or {})
    deleg["is_fully_accelerated_claim"] = res.get("is_fully_accelerated_claim")
    runs = res.get("run_ms") or []
    row.update(
        {
            "delegation": deleg,
            "output_match": (worst_rel is not None and worst_rel <= cfg.tolerance) if res.get("ok") else None,
            "max_rel_diff": worst_rel,
            "max_abs_diff": worst_abs,
            "min_cosine": min_cos,
            "per_output": per,
            "latency_p50_ms": round(statistics.median(runs), 3) if runs else None,
            "latency_min_ms": round(min(runs), 3) if runs else None,
            "first_run_ms": _r(res.get("first_run_ms")),
            "compile_ms": _r(res.get("compile_ms")),
            "runs": len(runs),
            "warmup": cfg.warmup,
            "timeout_s": cfg.timeout_s,
            "runtime_variant": res.get("runtime_variant"),
            "threads": res.get("threads"),
            "error": res.get("error"),
        }
    )
    row.update(_evidence(res, per, row["status"]))
    return row


def _evidence(res: dict, per: dict, status: str) -> dict:
    """WebGPU errors from the console, all-zero outputs, and the console tail of a run that did not pass."""
    row = {}
    zero = [n for n, m in per.items() if m["all_zero"]]
    gpu_errors = list(
        dict.fromkeys(
            line.splitlines()[0][:300]
            for line in res.get("console") or []
            if line.startswith(("WebGPU uncaptured error", "WebGPU device lost"))
        )
    )
    if gpu_errors:
        row["webgpu_errors"] = gpu_errors[:5]
    if zero:
        row["evidence"] = f"outputs all zero in the browser (non-zero on the CPU): {', '.join(zero)}" + (
            f"; first WebGPU error: {gpu_errors[0]}" if gpu_errors else ""
        )
    if status != "pass":
        row["console_tail"] = [
            line[:300] for line in (res.get("console") or []) if "INFO: [" not in line and "npu_registry" not in line
        ][-25:]
    return row


def _r(x):
    return None if x is None else round(float(x), 3)
