"""Encoder (and click) speed of fp32 / fp16 / int8 bundles against the peer, on the robustness set's weights.

    .venv/bin/python benchmarks/bench_precision.py --set /tmp/robustness_set --work /tmp/bench_precision \\
        [--targets litert onnx executorch] [--precisions fp32 fp16 int8] [--members upstream-s1-perturbed] \\
        [--threads 2] [--runs 5] [--include-rejected]

For each checkpoint of the robustness set (``scripts/robustness_set.py``, written into ``--set`` first if
missing) and each target x precision: ``sam2edge export`` into ``--work/<member>/<target>-<precision>`` (kept and
reused on a rerun), then ONE interleaved ``sam2edge bench`` session per checkpoint over every shippable bundle
with ``--peer`` (the samexporter-style ONNX export of the same weights), so every ratio comes from one run.
A bundle its export refused is reported with the refusal line and left out of the timing (``--include-rejected``
writes it with ``--force`` and times it, labelled rejected). Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("litert", "onnx", "executorch")
PRECISIONS = ("fp32", "fp16", "int8")


def _robustness_set():
    spec = importlib.util.spec_from_file_location("robustness_set", ROOT / "scripts" / "robustness_set.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sam2edge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sam2edge.cli.main", *args], capture_output=True, text=True)


def export(ckpt: Path, target: str, precision: str, out: Path, force: bool) -> dict:
    """Export (or reuse) one bundle; {"bundle", "status"} or {"refused": line}."""
    card = out / "card.json"
    if not card.is_file():
        args = ["export", "--target", target, "--precision", precision, "--checkpoint", str(ckpt), "--out", str(out)]
        r = _sam2edge(*args, *(["--force"] if force else []))
        if r.returncode != 0:
            lines = (r.stderr or r.stdout).strip().splitlines()
            return {"refused": lines[-1] if lines else f"exit {r.returncode}"}
    status = json.loads(card.read_text())["status"]
    return {"bundle": str(out), "status": status}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", required=True, help="robustness-set folder (written there if missing)")
    p.add_argument("--work", required=True, help="folder for the bundles, peer exports and bench records")
    p.add_argument("--members", nargs="*", help="robustness-set members (default all 5)")
    p.add_argument("--targets", nargs="*", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--precisions", nargs="*", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--threads", default="2", help="threads per runtime (default 2)")
    p.add_argument("--runs", type=int, default=5, help="timed rounds per subject (default 5)")
    p.add_argument("--include-rejected", action="store_true", help="also time bundles that failed a bar")
    args = p.parse_args(argv)
    work = Path(args.work)
    ckpts = _robustness_set().write_set(Path(args.set), args.members)
    summary = {}
    for member, ckpt in ckpts.items():
        rows = {}
        for target in args.targets:
            for precision in args.precisions:
                out = work / member / f"{target}-{precision}"
                rows[f"{target}-{precision}"] = export(ckpt, target, precision, out, args.include_rejected)
                print(f"{member} {target} {precision}: {rows[f'{target}-{precision}']}", flush=True)
        bundles = [r["bundle"] for r in rows.values() if "bundle" in r]
        if bundles:
            records = work / member / "records"
            bench = ["bench", *bundles, "--peer", str(work / member / "peer"), "--checkpoint", str(ckpt)]
            bench += ["--threads", args.threads, "--runs", str(args.runs), "--records", str(records)]
            r = _sam2edge(*bench)
            print(r.stdout, r.stderr[-2000:] if r.returncode else "", flush=True)
            rows["bench_exit"] = r.returncode
        summary[member] = rows
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"summary: {work / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
