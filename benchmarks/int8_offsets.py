"""Where an int8 export shifts the Hiera MLP's hidden activations: per checkpoint and block, how much centring each
hidden channel would narrow the calibrated range, and which blocks get ``mlp.shift``.

    .venv/bin/python benchmarks/int8_offsets.py CHECKPOINT... [--config sam2.1-hiera-tiny]

The MLP's hidden activations (GELU's output, the input of ``mlp.layers.1``) have no linear producer to fold a shift
into, so an int8 export subtracts it in the graph (``model.image_encoder.ShiftedMLP``) where centring narrows the
range by ``export.smooth.SHIFT_GAIN`` or more. The gain printed per block is ``(max hi - min lo) / max (hi - lo)``
over the channels, calibrated as the export calibrates (``export.smooth.calibrate``: fp32, the calibration
photos). Full size, 2 cores: about a minute a checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam2edge.checks.bench.script import add_checkpoints, missing_files, parsed, refusing


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    return missing_files(args.checkpoints, "give SAM 2.1 checkpoints' paths")


@refusing
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoints(p)
    args = parsed(p, argv, _problem)
    if args is None:
        return 2
    import torch

    from sam2edge.config import get_config
    from sam2edge.export.smooth import (
        HIDDEN,
        SHIFT_GAIN,
        block_key,
        calibrate,
        centring_gain,
        shift_holder,
        shifts_and_scales,
    )
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.weights import load_weights

    torch.set_num_threads(2)
    cfg = get_config(args.config)
    print(f"| checkpoint | centring gain of each block's MLP hidden activations | shifted (gain >= {SHIFT_GAIN}) |")
    print("|---|---|---|")
    for path in args.checkpoints:
        sd, _ = load_weights(path, cfg)
        model = build_sam2(cfg, Rewrites())
        model.load_state_dict(sd)
        ranges = calibrate(model.eval(), cfg)
        hidden = sorted((k for k in ranges if block_key(k)[1] == HIDDEN), key=lambda k: block_key(k)[0])
        gains = [centring_gain(ranges[k]) for k in hidden]
        shifted = [block_key(k)[0] for k in shifts_and_scales(sd, ranges) if shift_holder(k)]
        blocks = ", ".join(str(i) for i in sorted(shifted)) or "none"
        print(f"| {Path(path).stem} | {' '.join(f'{g:.2f}' for g in gains)} | {blocks} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
