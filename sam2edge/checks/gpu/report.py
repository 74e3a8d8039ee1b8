"""GPU-check reports: text for people, compact records for fidelity.json / card.json, export integration.

``format_report`` prints one ``gpu_check.FileReport``; ``bundle_record`` is what an export (``export_check``,
run by ``export.litert``) or ``sam2edge gpu-check DIR --record`` (``record_in_bundle``) stores.
"""

from __future__ import annotations

from pathlib import Path

from sam2edge.checks.gpu.check import BARS, FileReport, check_file, environment
from sam2edge.errors import UserError


def tflite_files(target: str | Path) -> list[Path]:
    """A .tflite file, or every .tflite directly in a folder (sorted; a bundle's CPU-only decoder graphs left out,
    the GPU never loads it); else UserError."""
    from sam2edge.runtime.backends.litert import CPU_ONLY_FILES

    target = Path(target)
    if target.is_dir():
        files = sorted(p for p in target.glob("*.tflite") if p.name not in CPU_ONLY_FILES)
        if not files:
            raise UserError(f"{target} holds no .tflite file; pass a .tflite file or a LiteRT bundle folder")
        return files
    if not target.is_file():
        raise UserError(f"{target} does not exist; pass a .tflite file or a folder of them")
    return [target]


def format_report(r: FileReport) -> str:
    """Human-readable lines for one file; the verdict first."""
    res = r.residency
    lines = [
        f"{r.path}: {r.verdict.upper()} ({r.kind})",
        f"  GPU ops {res.ops_gpu}/{res.ops_total} in {res.partitions} partition(s); "
        f"is_fully_accelerated() said {res.fully_accelerated_claim} (not trusted)",
    ]
    lines += [f"  rejected {x['op']}: {x['reason']}" for x in res.rejected]
    lines += [f"  WebGPU validation error: {e}" for e in res.gpu_errors]
    for name, m in r.outputs.items():
        lines.append(
            f"  {name:<18} GPU vs CPU: cosine {m['cosine']:.7f}  corr {m['correlation']:.7f}  "
            f"max-abs {m['max_abs']:.3g}"
        )
    if r.mask_iou:
        mi = r.mask_iou
        lines.append(
            f"  mask IoU GPU vs CPU over {mi['clicks']} clicks on {len(mi['photos'])} photos: "
            f"median {mi['iou_median']:.5f}, worst {mi['iou_worst']:.5f}, "
            f"same candidate {mi['selection_agreement']:.0%}"
        )
    if r.segments:
        spans = ", ".join(f"{g['nodes'][0]}-{g['nodes'][1] - 1}" for g in r.segments)
        lines.append(
            f"  GPU run in {len(r.segments)} chained pieces ({r.pieces_why or 'whole graph past the deadline'}): "
            f"nodes {spans}; piece cosine vs CPU: " + ", ".join(f"{g['cosine_min']:.7f}" for g in r.segments)
        )
    per_run = f"; GPU {r.seconds['gpu_run_mean']:.3f} s/run" if "gpu_run_mean" in r.seconds else ""
    lines.append(f"  inputs: {r.inputs_source}; {r.runs} run(s){per_run}")
    lines += [f"  why: {f}" for f in r.failures if not f.startswith(("rejected ", "WebGPU validation"))]
    return "\n".join(lines)


# ---- export integration --------------------------------------------------------------------------


def summarize(r: FileReport) -> dict:
    """The compact record of one file that an export writes into fidelity.json / card.json."""
    res = r.residency
    return {
        "verdict": r.verdict,
        "kind": r.kind,
        "ops_gpu": res.ops_gpu,
        "ops_total": res.ops_total,
        "partitions": res.partitions,
        "rejected": res.rejected,
        "gpu_errors": res.gpu_errors,
        "outputs": r.outputs,
        "mask_iou": r.mask_iou,
        "failures": r.failures,
        "inputs": r.inputs_source,
        "segments": r.segments,
        "pieces_why": r.pieces_why,
    }


def bundle_record(reports: list[FileReport]) -> dict:
    """fidelity.json ``checks.gpu_delegate``: environment, bars, one summary per file, all_resident."""
    device = next((r.residency.device for r in reports if r.residency.device), "")
    return record_from({Path(r.path).name: summarize(r) for r in reports}, device)


def record_from(files: dict[str, dict], device: str) -> dict:
    """``bundle_record`` from per-file summaries (``summarize``) and the Vulkan device name."""
    return {
        "environment": environment(device),
        "bars": BARS,
        "files": files,
        "all_resident": all(f["verdict"] == "resident" for f in files.values()),
    }


def record_in_bundle(folder: str | Path, reports: list[FileReport], command: str) -> None:
    """Replace fidelity.json ``checks.gpu_delegate`` of an export bundle, mirror it in card.json, rewrite the
    manifest (``sam2edge gpu-check DIR --record``: re-check a bundle on another device or LiteRT version)."""
    from sam2edge.bundle import record_fidelity

    entry = dict(bundle_record(reports), command=command)
    record_fidelity(Path(folder), ("checks", "gpu_delegate"), entry, "gpu-check --record")


GPU_CHECK_MODES = ("run", "skip")  # export --gpu-check: run the check (results cached by graph SHA-256) or not


def skipped_record(reason: str) -> dict:
    """``checks.gpu_delegate`` of an export whose GPU check was not run: says so, claims nothing."""
    return {"skipped": True, "reason": reason, "environment": environment(""), "bars": BARS, "files": {}}


# verdicts a graph's bytes decide; "failed" (a crashed GPU run) and "device-limit" (a deadline) may be the
# machine's state of the moment, so they are checked again next time
CACHEABLE = ("resident", "partial", "mismatch")


def cached_summary(path: Path) -> tuple[dict, str, bool]:
    """(summary, device, reused) of one .tflite: read back from ``checks.gpu.cache`` for a graph already
    checked (same SHA-256, LiteRT version and bars), else checked now and remembered."""
    from sam2edge.checks.gpu import cache

    key = cache.cache_key(path, BARS) if cache.cache_dir() is not None else None  # off: no SHA-256 to take
    hit = cache.load(key) if key is not None else None
    if hit is not None:
        return hit["summary"], hit["device"], True
    r = check_file(path)
    summary, device = summarize(r), r.residency.device
    if key is not None and summary["verdict"] in CACHEABLE:
        cache.store(key, summary, device)
    return summary, device, False


def export_check(ctx) -> dict:
    """``export.litert.POST_EXPORT_CHECKS`` entry: GPU-check every staged .tflite of a LiteRT export.

    ``ctx``: the exporter's Job (folder, files, allow_dirty, ``state["gpu_check"]`` = "run" or "skip").
    A file that is not ``resident`` refuses the export (UserError naming the file and why) unless
    ``ctx.allow_dirty``. "skip" records that the check was not run. A graph checked before is reused.
    """
    from sam2edge.runtime.backends.litert import CPU_ONLY_FILES

    if getattr(ctx, "state", {}).get("gpu_check", "run") == "skip":
        return skipped_record("not run: exported with --gpu-check skip")
    files, devices, reused = {}, [], []
    for f in sorted(ctx.files):
        if f.endswith(".tflite") and f not in CPU_ONLY_FILES:  # the CPU-only decoder graphs never meet a GPU
            files[f], device, hit = cached_summary(ctx.folder / f)
            devices.append(device)
            reused += [f] if hit else []
    record = record_from(files, next((d for d in devices if d), "")) | {"reused": reused}
    bad = next(((f, s) for f, s in files.items() if s["verdict"] not in ("resident", "device-limit")), None)
    if bad is not None and not getattr(ctx, "allow_dirty", False):
        name, s = bad
        why = s["failures"][0] if s["failures"] else s["verdict"]
        raise UserError(
            f"{name} is {s['verdict']} on LiteRT's GPU delegate ({why}); fix the graph or pass --allow-dirty"
        )
    return record
