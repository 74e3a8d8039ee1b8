"""How far an ExecuTorch fp16 bundle's encoder is from fp32, beside the eager emulation its export selected with.

    .venv/bin/python benchmarks/executorch_fp16_error.py BUNDLE [--photos coffee.png chelsea.png]

For each photo: the relative L2 error (``|a - b| / |b|``) of each encoder output (image embedding, the two
high-resolution features) against the eager fp32 graph (``XnnEncoderGraph``, the export's rewrites), for the
bundle's ``encoder.pte`` (XNNPACK's fp16 kernels) and for the emulation the export's fp16 selection runs
(``export.precision.fp16_arithmetic``: eager fp16 on the CPU), with the bundle's kept parts fp32 in both.
A program error well above the emulation's means the selection underestimated XNNPACK's fp16 error; the export's
own check on the real program decides either way. Full size, 2 cores: about 20 s a photo.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUTPUTS = ("image_embed", "feat_s0", "feat_s1")


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    from sam2edge.checks.photos import PHOTOS

    unknown = [p for p in args.photos if p not in PHOTOS]
    if unknown:
        return f"--photos {unknown[0]}: not a fidelity photo; use {', '.join(PHOTOS)}"
    card = Path(args.bundle) / "card.json"
    if not card.is_file():
        return f"{args.bundle}: no card.json; give an ExecuTorch fp16 bundle folder"
    try:
        c = json.loads(card.read_text())
    except (ValueError, UnicodeDecodeError):
        return f"{card}: not a readable card; give a bundle folder written by sam2edge export"
    if c.get("target") != "executorch" or c.get("precision") != "fp16":
        return (
            f"{args.bundle}: target {c.get('target')}, precision {c.get('precision')}; give an ExecuTorch fp16 bundle"
        )
    return None


def _rel(a, ref) -> float:
    return float((a - ref).norm() / ref.norm())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="an ExecuTorch fp16 bundle folder")
    p.add_argument("--photos", nargs="+", default=["coffee.png", "chelsea.png"], help="fidelity photos by name")
    args = p.parse_args(argv)
    if why := _problem(args):
        print(f"error: {why}", file=sys.stderr)
        return 2

    import numpy as np
    import torch

    from sam2edge.checks.fidelity import photo
    from sam2edge.config import get_config
    from sam2edge.export.executorch import REWRITES
    from sam2edge.export.executorch_graphs import XnnEncoderGraph
    from sam2edge.export.precision import fp16_arithmetic
    from sam2edge.model import build_sam2
    from sam2edge.runtime.backends.executorch import ExecuTorchBackend
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.weights import load_weights

    card = json.loads((Path(args.bundle) / "card.json").read_text())
    cfg = get_config(card["config"])
    sd, _ = load_weights(card["source"].get("checkpoint") or None, cfg)
    model = build_sam2(cfg, REWRITES)
    model.load_state_dict(sd)
    model.eval()
    keep = tuple(card["extra"].get("mixed_precision", {}).get("kept_fp32", ()))
    fp32, emulated = XnnEncoderGraph(model).eval(), XnnEncoderGraph(fp16_arithmetic(model, keep)).eval()
    program = ExecuTorchBackend.from_bundle(args.bundle)
    print(f"| photo | output | program rel. error | emulation rel. error |  (kept fp32: {', '.join(keep) or 'none'})")
    print("|---|---|---|---|")
    for name in args.photos:
        x = np.ascontiguousarray(preprocess(photo(name), cfg.image_size), dtype=np.float32)
        got = program.encode(x)
        with torch.no_grad():
            ref, emu = fp32(torch.from_numpy(x)), emulated(torch.from_numpy(x))
        for out, r, e in zip(OUTPUTS, ref, emu, strict=True):
            g = torch.from_numpy(getattr(got, out))
            print(f"| {name} | {out} | {_rel(g, r):.5f} | {_rel(e, r):.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
