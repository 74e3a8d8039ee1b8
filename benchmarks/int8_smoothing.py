"""ONNX int8 exports with the encoder smoothed (``export.smooth``) or not, on test-small random checkpoints.

    .venv/bin/python benchmarks/int8_smoothing.py [--specs synthetic:2 synthetic:1:outliers] [--config test-small]

``SEED[:outliers]``: ``synthetic:SEED`` weights; ``:outliers`` multiplies two random channels of every Hiera
LayerNorm weight by 10 (activations with outlier channels). Each is exported twice through the real pipeline
(``run_export``, ``force=True`` so a refused bundle is still measured), with and without smoothing, and the
export's own end-to-end fidelity (40 clicks vs eager fp32) is printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

from sam2edge.checks.fidelity.checkpoints import variant_state_dict
from sam2edge.config import get_config
from sam2edge.export import smooth
from sam2edge.export.pipeline import run_export

OUTLIER_GAIN, OUTLIER_CHANNELS = 10.0, 2


def state_dict(spec: str, cfg) -> dict:
    sd = dict(variant_state_dict(spec.removesuffix(":outliers"), cfg))
    if spec.endswith(":outliers"):
        g = torch.Generator().manual_seed(5)
        for k in list(sd):
            if k.startswith("image_encoder.trunk.blocks.") and ".norm" in k and k.endswith(".weight"):
                w = sd[k].clone()
                w[torch.randperm(w.shape[0], generator=g)[:OUTLIER_CHANNELS]] *= OUTLIER_GAIN
                sd[k] = w
    return sd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specs", nargs="*", default=["synthetic:2", "synthetic:1:outliers"])
    p.add_argument("--config", default="test-small")
    args = p.parse_args(argv)
    for spec in args.specs:
        sd = state_dict(spec, get_config(args.config))
        for label, smoothing in (("plain", False), ("smoothed", True)):
            patch = mock.patch.object(smooth, "smooth_state_dict", lambda s, a, alpha=0.5: (s, {}))
            with tempfile.TemporaryDirectory() as d, mock.MagicMock() if smoothing else patch:
                card = run_export(
                    "onnx",
                    args.config,
                    "int8",
                    Path(d) / "b",
                    weights=(sd, {"format": "synthetic", "sha256": None, "checkpoint": spec}),
                    force=True,
                )
            e = card["fidelity"]["end_to_end"]
            print(f"{spec} {label}: worst {e['iou_worst']:.5f} median {e['iou_median']:.5f} {card['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
