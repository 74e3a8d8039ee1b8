"""Real fp16 exports at ``test-small-wide-decoder``: the export's own 40-click fidelity, worst / median mask IoU.

The config (test-small's encoder with the full-width decoder) is where the fp16 decoder's precision loss shows
(docs/design/precision.md). It is not in ``config.CONFIGS``, so this script registers it before calling the pipeline.

    PYTHONPATH=. .venv/bin/python benchmarks/fp16_real_exports.py executorch synthetic:3 synthetic:1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from sam2edge.checks.fidelity.checkpoints import TEST_SMALL_WIDE_DECODER, variant_state_dict
from sam2edge.config import CONFIGS
from sam2edge.export.pipeline import run_export

CONFIG = "test-small-wide-decoder"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", help="litert, onnx or executorch")
    ap.add_argument("specs", nargs="+", help="checkpoints such as synthetic:3 or synthetic:3:range4")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    CONFIGS[CONFIG] = TEST_SMALL_WIDE_DECODER
    for spec in args.specs:
        sd = variant_state_dict(spec, TEST_SMALL_WIDE_DECODER)
        source = {"format": "synthetic", "sha256": None, "checkpoint": spec}
        with tempfile.TemporaryDirectory() as tmp:
            card = run_export(args.target, CONFIG, "fp16", Path(tmp) / "b", weights=(sd, source), force=True)
        e, failures = card["fidelity"]["end_to_end"], card["fidelity"].get("failures")
        print(
            f"{args.target} fp16 {spec}: worst {e['iou_worst']:.4f} median {e['iou_median']:.4f} "
            f"status {card['status']} {failures or ''}",
            flush=True,
        )


if __name__ == "__main__":
    main()
