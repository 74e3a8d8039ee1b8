"""Export time with torch.fx's provenance records deep-copied (torch's default) and shared (``export.provenance``).

    .venv/bin/python benchmarks/bench_provenance.py --work DIR [--target executorch] [--config test-small]

Exports the synthetic checkpoint twice, each in a fresh process (imports and caches alike): first with
``shared_provenance`` replaced by a no-op in the pipeline and the ExecuTorch lowering (every pass deep-copies
each node's chain of records), then as shipped. Prints each export's wall seconds and whether every converted file
is byte-identical between the two (sha256). Fp32, no batched decoder, 4 fidelity clicks, LiteRT's GPU check
skipped: the conversion is what differs. ``--work`` must not exist (it is created; nothing is overwritten).
Nothing else should run on the CPU meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from sam2edge.config import CONFIGS

MODES = ("copied", "shared")  # copied: torch's default; shared: export.provenance, as shipped
SUFFIX = {"executorch": ".pte", "litert": ".tflite"}


def _one(target: str, config: str, mode: str, out: Path) -> None:
    """One export in this process; prints {"seconds", "files": {name: sha256}} as JSON."""
    from sam2edge.export import executorch_lower, pipeline
    from sam2edge.export.pipeline import run_export

    if mode == "copied":
        pipeline.shared_provenance = executorch_lower.shared_provenance = contextlib.nullcontext
    options = {"batch": 0, **({"gpu_check": "skip"} if target == "litert" else {})}
    t0 = time.perf_counter()
    run_export(target, config, "fp32", out, checkpoint=None, clicks=4, options=options)
    seconds = time.perf_counter() - t0
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(out.glob(f"*{SUFFIX[target]}"))}
    print(json.dumps({"seconds": seconds, "files": files}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="a folder that does not exist yet")
    p.add_argument("--target", default="executorch", choices=sorted(SUFFIX))
    p.add_argument("--config", default="test-small", choices=sorted(CONFIGS))
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # the child's one export
    args = p.parse_args(argv)
    work = Path(args.work)
    if args.mode:
        _one(args.target, args.config, args.mode, work / args.mode)
        return 0
    if work.exists():
        print(f"error: {work} exists; give a new --work folder (nothing is overwritten)", file=sys.stderr)
        return 2
    work.mkdir(parents=True)
    runs = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--work", str(work), "--target", args.target, "--config", args.config]
        done = subprocess.run([*cmd, "--mode", mode], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"error: the {mode} export failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    same = runs["copied"]["files"] == runs["shared"]["files"]
    print(f"| {args.target} {args.config} | seconds | files |")
    print("|---|---|---|")
    for mode in MODES:
        print(f"| provenance {mode} | {runs[mode]['seconds']:.1f} | {len(runs[mode]['files'])} |")
    print(f"byte-identical files: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
