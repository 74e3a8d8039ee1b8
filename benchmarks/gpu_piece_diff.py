"""Which operators of a .tflite come back different on the software GPU: pieces run alone on both accelerators.

    python benchmarks/gpu_piece_diff.py FILE.tflite START-END [START-END ...] [--run -1]

Each piece [START, END) of operators (``checks.tflite.slice.piece``) runs on LiteRT's GPU delegate and on the
CPU (``checks.gpu.check.run_on``, the GPU check's worker), fed the CPU's values: the graph's inputs as the GPU
check feeds them (``--run``: which of its feed runs) and the outputs of the pieces before it, so each line is
one piece's own GPU error, not the error carried from earlier pieces. Prints the GPU-vs-CPU cosine and largest
difference of every piece output. Pieces must follow one another from operator 0 (each reads what the earlier
ones wrote). It found the LayerNorm ADD that the delegate merges into its FULLY_CONNECTED reader
(``checks.tflite.slice._risky_outputs``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sam2edge.checks.fidelity.metrics import compare  # noqa: E402
from sam2edge.checks.gpu import check as gpu_check  # noqa: E402
from sam2edge.checks.gpu.feeds import build_feeds  # noqa: E402
from sam2edge.checks.tflite import slice as ts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("pieces", nargs="+", help="operator ranges START-END (END excluded), in order from 0")
    ap.add_argument("--run", type=int, default=-1, help="which GPU-check feed run (video graphs: 0 half, -1 all slots)")
    args = ap.parse_args()
    ranges = [tuple(int(x) for x in r.split("-")) for r in args.pieces]
    _, feeds = build_feeds(gpu_check._signature_inputs(args.file), args.file.parent, 20)
    model = ts.load_model(args.file)
    inputs, _ = ts.signature_tensors(model)
    values = {t: feeds.arrays[feeds.runs[args.run][name]] for name, t in inputs.items()}  # tensor -> CPU value
    with tempfile.TemporaryDirectory() as tmp:
        for a, b in ranges:
            p = ts.piece(model, a, b)
            path = Path(tmp) / f"nodes_{a}_{b}.tflite"
            path.write_bytes(p.data)
            plan = gpu_check.piece_feeds(p.inputs, [values])
            gpu, cpu = (gpu_check.run_on(path, side, plan, 600)[0] for side in ("gpu", "cpu"))
            print(f"piece {a}-{b}:")
            for k, t in p.outputs.items():
                g, c = gpu[f"0/{k}"], cpu[f"0/{k}"]
                values[t] = c
                m, scale = compare(g, c), np.abs(c).max()
                print(f"  {k} {list(c.shape)} cosine {m['cosine']:.7f} max-abs {m['max_abs']:.3g} (scale {scale:.3g})")


if __name__ == "__main__":
    main()
