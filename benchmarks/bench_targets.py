"""Every export target against upstream eager ``sam2`` in one process: the comparison table.

    .venv/bin/python benchmarks/bench_targets.py BUNDLE [BUNDLE ...] [--threads 2] [--runs 5] [--clicks 4]
        [--peer DIR]

This is ``sam2edge bench --compare`` with the protocol fixed for published numbers: every bundle (LiteRT,
ONNX, ExecuTorch; any precision) and upstream eager with the first bundle's weights are loaded, warmed up
once, then timed in interleaved rounds (one encode + ``--clicks`` decodes each), so that machine drift hits
every subject alike. Printed: load time, encoder and per-click median/min/max, first click (encoder +
decoder), peak RSS, and the ratios against upstream and against the compute bound (model FLOPs / measured
GEMM throughput). ``--peer DIR`` adds the peer's export (``sam2edge.checks.bench.peer``: a stand-in for
samexporter's ONNX export of SAM 2.1, run by onnxruntime) as one more subject, with ratios to it. One JSON
record per subject goes under ``--records`` (default ``records/``) for ``sam2edge card render``.
"""

from __future__ import annotations

import argparse
import sys

from sam2edge.cli.main import main as sam2edge_main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", nargs="+", help="bundle folders written by `sam2edge export`")
    p.add_argument("--threads", default="2", help="threads for every runtime, or a comma list such as 1,2 (default 2)")
    p.add_argument("--runs", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--clicks", type=int, default=4, help="decodes per round (default 4)")
    p.add_argument("--records", default="records", help="folder for the JSON records (default records/)")
    p.add_argument(
        "--peer",
        metavar="DIR",
        help="also time the peer's export (samexporter-style ONNX of upstream's modules, onnxruntime) from DIR;"
        " exported there from the first bundle's weights when DIR does not exist",
    )
    a = p.parse_args(argv)
    return sam2edge_main(
        [
            "bench",
            "--compare",
            *a.bundles,
            "--threads",
            str(a.threads),
            "--runs",
            str(a.runs),
            "--clicks",
            str(a.clicks),
            "--records",
            a.records,
            *(["--peer", a.peer] if a.peer else []),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
