"""Bench records: the machine they were measured on, the ratio to upstream, file names, writing, and the
printed table (``bench.bench``)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

from sam2edge.bundle import write_json

SCHEMA = "sam2edge.record/1"  # the common record every benchmark writes and ``sam2edge report`` renders

UPSTREAM = "upstream-eager"
PEER = "peer-onnx"  # record ``runtime`` of the peer's export (``checks.bench.peer``)
# baseline runtime -> the name in its ratio keys (``encoder_vs_upstream``, ``decoder_vs_peer``, ...)
BASELINES: dict[str, str] = {UPSTREAM: "upstream", PEER: "peer"}
# ratio table: (header, ratio key, shown even when no record has it)
RATIO_COLUMNS = (
    ("enc/upstream", "encoder_vs_upstream", True),
    ("dec/upstream", "decoder_vs_upstream", True),
    ("1st/upstream", "first_click_vs_upstream", True),
    ("enc/peer", "encoder_vs_peer", False),
    ("dec/peer", "decoder_vs_peer", False),
    ("enc/bound", "encoder_vs_bound", True),
    ("dec/bound", "decoder_vs_bound", True),
)


# x86 /proc/cpuinfo ``flags`` and ARM ``Features`` names that decide the kernels runtimes pick: SIMD width,
# int8 dot products (VNNI, asimddp, i8mm), fp16 (f16c conversion only; avx512_fp16 / asimdhp arithmetic), bf16
VECTOR_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx_vnni_int8",
    "avx512_bf16",
    "avx512_fp16",
    "avx_ne_convert",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "asimdhp",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
)


def vector_extensions(cpuinfo: str) -> list[str]:
    """The SIMD / matrix extensions among ``VECTOR_FLAGS`` that /proc/cpuinfo's first flags line (x86
    ``flags``, ARM ``Features``) names, in ``VECTOR_FLAGS`` order."""
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", cpuinfo, re.M)
    have = set(m.group(1).split()) if m else set()
    return [f for f in VECTOR_FLAGS if f in have]


# extensions with fp16 arithmetic in SIMD registers; without them runtimes compute fp16 through fp32 (f16c converts)
FP16_ARITHMETIC_FLAGS = ("avx512_fp16", "asimdhp")


def fp16_arithmetic(extensions: list[str]) -> str:
    """How this CPU runs fp16 graphs, from its ``vector_extensions``: "native" (XNNPACK's fp16 kernels add and
    multiply in fp16, reductions included), "through fp32" (each operation converts to fp32 and rounds its result)."""
    return "native" if any(f in extensions for f in FP16_ARITHMETIC_FLAGS) else "through fp32"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cpu_model(cpuinfo: str) -> str | None:
    """The CPU's name in /proc/cpuinfo text (x86 ``model name``; ARM boards: ``Hardware`` / ``cpu model``)."""
    m = re.search(r"^(?:model name|Hardware|cpu model)\s*:\s*(.+)$", cpuinfo, re.M)
    return m.group(1).strip() if m else None


def cpu_generation(cpuinfo: str) -> str | None:
    """x86 ``cpu family`` and ``model`` numbers ("family 26, model 2"): CPUs sold under one name (``model
    name: AMD EPYC`` on cloud machines) differ in generation, and their timings with them; ARM: ``CPU part``."""
    fam = re.search(r"^cpu family\s*:\s*(\d+)$", cpuinfo, re.M)
    mod = re.search(r"^model\s*:\s*(\d+)$", cpuinfo, re.M)
    if fam and mod:
        return f"family {fam.group(1)}, model {mod.group(1)}"
    part = re.search(r"^CPU part\s*:\s*(\S+)$", cpuinfo, re.M)
    return f"part {part.group(1)}" if part else None


def cpu_name(m: dict) -> str:
    """A record's ``machine`` as one name: "AMD EPYC (family 26, model 2)"."""
    gen = f" ({m['cpu_generation']})" if m.get("cpu_generation") else ""
    return f"{m.get('cpu', 'unknown CPU')}{gen}"


# what a table record (``cards.report``) keeps of ``machine()``
TABLE_MACHINE_KEYS = ("cpu", "cpu_generation", "cores", "vector_extensions")


def table_machine(m: dict | None = None) -> dict:
    """The ``TABLE_MACHINE_KEYS`` of ``m`` (a record's ``machine``; by default this machine's): a key the record
    lacks (an older record) is None."""
    m = machine() if m is None else m
    return {k: m.get(k) for k in TABLE_MACHINE_KEYS}


def machine(cpuinfo: str | None = None) -> dict:
    """What the numbers were measured on: the CPU model, its generation and its vector extensions (from
    ``cpuinfo``, by default /proc/cpuinfo), cores, OS, Python and torch versions."""
    import torch

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    extensions = vector_extensions(cpuinfo)
    return {
        "cpu": cpu_model(cpuinfo) or platform.processor() or "unknown",
        "cpu_generation": cpu_generation(cpuinfo),
        "vector_extensions": extensions,
        "fp16_arithmetic": fp16_arithmetic(extensions),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB, from /proc (ru_maxrss where /proc is absent)."""
    try:
        status = Path("/proc/self/status").read_text()
        cur = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
        peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
        return cur, peak
    except (OSError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return peak, peak


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def add_ratios(records: list[dict]) -> None:
    """Each record's medians over the same-resolution, same-thread-count record of each baseline in
    ``BASELINES`` (upstream eager, the peer's export) and over the compute bound."""
    base = {(r["runtime"], r["resolution"], r["threads"]): r for r in records if r["runtime"] in BASELINES}
    for r in records:
        ratios = {}
        for runtime, name in BASELINES.items():
            b = base.get((runtime, r["resolution"], r["threads"]))
            if b is not None:
                for key in ("encoder_ms", "decoder_ms", "first_click_ms"):
                    ratios[f"{key[:-3]}_vs_{name}"] = r[key]["median"] / b[key]["median"]
        if "compute_bound" in r:
            b = r["compute_bound"]
            ratios["encoder_vs_bound"] = r["encoder_ms"]["median"] / b["encoder_bound_ms"]
            ratios["decoder_vs_bound"] = r["decoder_ms"]["median"] / b["decoder_bound_ms"]
        if ratios:
            r["ratios"] = ratios


def add_scaling(records: list[dict]) -> None:
    """With one subject timed at several thread counts: each record's ``thread_scaling`` = its fewest-thread
    median over this record's median (encoder, decoder), e.g. 1.8 = 1.8x faster with 2 threads than 1."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["subject"], []).append(r)
    for recs in by.values():
        base = min(recs, key=lambda r: r["threads"])
        if len(recs) < 2:
            continue
        for r in recs:
            r["thread_scaling"] = {
                "base_threads": base["threads"],
                **{k[:-3]: base[k]["median"] / r[k]["median"] for k in ("encoder_ms", "decoder_ms")},
            }


def record_name(rec: dict) -> str:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", rec["subject"]).strip("-")
    return f"{rec['date']}/{slug}__{rec['session']}.json"


def write_records(records: list[dict], folder: str | Path) -> list[Path]:
    """One JSON file per record: ``folder/<date>/<subject>__<session>.json``."""
    out = []
    for rec in records:
        p = Path(folder) / record_name(rec)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, rec)
        out.append(p)
    return out


def format_table(records: list[dict]) -> str:
    """Plain-text table: medians (and min-max) per subject, ratios when present."""
    head = (
        f"{'subject':<40} {'load s':>7} {'encoder ms p50 (min-max)':>26} {'decoder ms p50 (min-max)':>26}"
        f" {'1st click ms':>12} {'peak RSS MB':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        e, d, f = r["encoder_ms"], r["decoder_ms"], r["first_click_ms"]
        lines.append(
            f"{_label(r):<40} {r['load_s']:>7.2f} {_mm(e):>26} {_mm(d):>26} {f['median']:>12.1f}"
            f" {r['peak_rss_mb']:>11.0f}"
        )
    if any("ratios" in r for r in records):
        shown = [c for c in RATIO_COLUMNS if c[2] or any(c[1] in r.get("ratios", {}) for r in records)]
        lines += ["", f"{'subject':<40} " + " ".join(f"{head:>12}" for head, _, _ in shown)]
        for r in records:
            q = r.get("ratios", {})
            lines.append(f"{_label(r):<40} " + " ".join(f"{_x(q.get(key)):>12}" for _, key, _ in shown))
        b = next((r["compute_bound"] for r in records if "compute_bound" in r), None)
        if b:
            lines.append(
                f"compute bound: encoder {b['encoder_gflop']:.1f} GFLOP, decoder {b['decoder_gflop']:.2f} GFLOP"
                f" at {b['gemm_gflops']:.0f} GFLOP/s (fp32 GEMM here) -> {b['encoder_bound_ms']:.0f} ms,"
                f" {b['decoder_bound_ms']:.1f} ms"
            )
    return "\n".join([*lines, _machine_line(records)])


def _machine_line(records: list[dict]) -> str:
    m = records[0].get("machine", {}) if records else {}
    return f"machine: {cpu_name(m)}, {m.get('cores')} cores; {' '.join(m.get('vector_extensions', []))}"


def _label(r: dict) -> str:
    """Subject, plus its thread count and scaling when the run timed several counts."""
    if "thread_scaling" not in r:
        return r["subject"]
    return f"{r['subject']} @{r['threads']}t ({r['thread_scaling']['encoder']:.2f}x)"


def _mm(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def git_commit(cwd: str | Path | None = None) -> str:
    """The checkout's commit (``+dirty`` when tracked files differ), or ``unknown`` outside a git checkout."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=cwd, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def command_line() -> str:
    """This process's command line as a shell would take it: ``python benchmarks/bench_x.py ...`` for a script,
    ``sam2edge bench ...`` for the console command (``-m sam2edge`` included)."""
    head = sys.argv[0]
    if head.endswith("__main__.py"):
        return shlex.join(["sam2edge", *sys.argv[1:]])
    if head.endswith(".py"):
        return shlex.join(["python", head, *sys.argv[1:]])
    return shlex.join([Path(head).name, *sys.argv[1:]])


def from_bench(rec: dict) -> dict:
    """A ``sam2edge bench`` record (kind ``bench``) in the common schema: table = resolution and thread count, row =
    subject, figures = medians (encoder, click, first click), load time, peak RSS and the ratios. A record
    written before bench records named their command keeps ``command`` None (``sam2edge report`` refuses it)."""
    figures = {
        "encoder_ms": rec["encoder_ms"]["median"],
        "click_ms": rec["decoder_ms"]["median"],
        "first_click_ms": rec["first_click_ms"]["median"],
        **{f"{k}_x": v for k, v in rec.get("ratios", {}).items()},
        "load_s": rec["load_s"],
        "peak_rss_mb": rec["peak_rss_mb"],
    }
    version = rec.get("version", "").removeprefix("sam2edge ")
    return {
        "schema": SCHEMA,
        "table": f"{rec['resolution']} px, {rec['threads']} threads ({rec['runs']} interleaved runs)",
        "row": rec["subject"],
        "figures": figures,
        "command": rec.get("command"),
        "date": rec["date"],
        "machine": rec["machine"],
        "sam2edge": {"version": version, "commit": rec.get("commit", "unknown")},
    }


def make_record(table: str, row: str, figures: dict, command: str | None = None, **extra) -> dict:
    """A record in the common schema: which table and row it fills, every figure (name -> number; the name's
    suffix is its unit: ``_ms``, ``_mb``, ``_x`` ratio), the command that measured it (default: this process's
    command line), the date (UTC), the machine (``machine()``), sam2edge's version and commit. ``extra`` keys
    (e.g. ``threads``, ``notes``) are kept as they are."""
    from sam2edge import __version__

    return {
        "schema": SCHEMA,
        "table": table,
        "row": row,
        "figures": dict(figures),
        "command": command or command_line(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "sam2edge": {"version": __version__, "commit": git_commit()},
        **extra,
    }


def write_record(rec: dict, folder: str | Path) -> Path:
    """Write ``rec`` (``make_record``) as ``folder/<date>__<table>__<row>.json``; never over an existing file
    (a numbered suffix is added instead)."""
    slug = "__".join(re.sub(r"[^A-Za-z0-9.]+", "-", rec[k]).strip("-").lower() for k in ("date", "table", "row"))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    p, n = folder / f"{slug}.json", 1
    while p.exists():
        n += 1
        p = folder / f"{slug}__{n}.json"
    write_json(p, rec)
    return p
