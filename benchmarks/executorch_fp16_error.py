"""How far an ExecuTorch fp16 bundle's encoder is from fp32, beside the eager emulation its export selected with.

    .venv/bin/python benchmarks/executorch_fp16_error.py BUNDLE [--photos coffee.png chelsea.png] [--keep PART ...]
        [--attention sdpa] [--softmax shifted]

For each photo: the relative L2 error (``|a - b| / |b|``) of each encoder output (image embedding, the two
high-resolution features) against the eager fp32 graph (``XnnEncoderGraph``, the export's rewrites), for the
bundle's ``encoder.pte`` (XNNPACK's fp16 kernels) and for the emulation the export's fp16 selection runs
(``export.precision.fp16_arithmetic``: eager fp16 on the CPU), with the bundle's kept parts fp32 in both.
A program error well above the emulation's means the selection underestimated XNNPACK's fp16 error; the export's
own check on the real program decides either way. ``--keep PART ...`` lowers an encoder program of the bundle's
checkpoint with those parts fp32 instead (``image_encoder.trunk.blocks.5``: module names under the model), to see
which parts hold XNNPACK's error; a few minutes at full size. ``--attention sdpa`` lowers one whose attention is
``scaled_dot_product_attention`` (``Rewrites.attention_impl``; the export's is "math", an explicit softmax) and prints
its delegate count: XNNPACK's fp16 softmax over many tokens is the least exact of its kernels
(``benchmarks/executorch_fp16_ops.py``); ``--softmax native|shifted`` lowers one with that softmax form
(``Rewrites.softmax``). Both start from the bundle's own rewrites (its card). Full size, 2 cores: about 20 s a photo.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def _bundle_encoder(bundle: str):
    """image (1, 3, S, S) float32 -> the bundle's encoder.pte outputs as tensors."""
    import torch

    from sam2edge.runtime.backends.executorch import ExecuTorchBackend

    program = ExecuTorchBackend.from_bundle(bundle)

    def encode(x):
        f = program.encode(x)
        return [torch.from_numpy(getattr(f, out)) for out in OUTPUTS]

    return encode


def _lowered_encoder(model, cfg, keep: tuple[str, ...]):
    """The fp16 encoder program of ``model`` with ``keep`` fp32, lowered as the export lowers it."""
    import torch
    from executorch.runtime import Runtime

    from sam2edge.export.executorch import lower_program
    from sam2edge.export.executorch_graphs import XnnEncoderGraph, encoder_inputs, fp16_encoder

    prog, census = lower_program(
        fp16_encoder(XnnEncoderGraph(model), keep).eval(), encoder_inputs(cfg), "fp16", "encoder"
    )
    c = census.as_dict()
    print(f"lowered: {len(prog.buffer)} bytes, {c['delegates']} delegates, outside them: {c['outside_delegate']}")
    data = prog.buffer  # the loaded program reads these bytes in place: ``encode`` holds them (else a segfault)
    method = Runtime.get().load_program(data).load_method("forward")

    def encode(x, _data=data):
        return method.execute([torch.from_numpy(x)])

    return encode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="an ExecuTorch fp16 bundle folder")
    p.add_argument("--photos", nargs="+", default=["coffee.png", "chelsea.png"], help="fidelity photos by name")
    p.add_argument("--keep", nargs="+", help="lower an encoder with these parts fp32 instead of the bundle's")
    p.add_argument("--attention", choices=("math", "sdpa"), help="lower an encoder with this attention form")
    p.add_argument("--softmax", choices=("native", "shifted"), help="lower an encoder with this softmax form")
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
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.weights import load_weights

    card = json.loads((Path(args.bundle) / "card.json").read_text())
    cfg = get_config(card["config"])
    sd, _ = load_weights(card["source"].get("checkpoint") or None, cfg)
    recorded = card.get("extra", {}).get("rewrites") or {}  # the bundle's model build, as its card records it
    built = dataclasses.replace(REWRITES, **{k: v for k, v in recorded.items() if k in REWRITES.__dataclass_fields__})
    model = build_sam2(cfg, built)
    model.load_state_dict(sd)
    model.eval()
    forms = {k: v for k, v in (("attention_impl", args.attention), ("softmax", args.softmax)) if v is not None}
    wanted = dataclasses.replace(built, **forms)
    lowered = model  # the model --keep / --attention / --softmax lower: the bundle's, or one with other forms
    if wanted != built:
        lowered = build_sam2(cfg, wanted)
        lowered.load_state_dict(sd)
        lowered.eval()
    keep = tuple(args.keep or card["extra"].get("mixed_precision", {}).get("kept_fp32", ()))
    modules = dict(model.named_modules())
    missing = [k for k in keep if k not in modules]
    if missing:
        print(
            f"error: --keep {missing[0]}: not a module of the model; use e.g. image_encoder.trunk.blocks.5",
            file=sys.stderr,
        )
        return 2
    fp32, emulated = XnnEncoderGraph(model).eval(), XnnEncoderGraph(fp16_arithmetic(model, keep)).eval()
    bundle = args.keep is None and not forms
    encode = _bundle_encoder(args.bundle) if bundle else _lowered_encoder(lowered, cfg, keep)
    print(f"| photo | output | program rel. error | emulation rel. error |  (kept fp32: {', '.join(keep) or 'none'})")
    print("|---|---|---|---|")
    for name in args.photos:
        x = np.ascontiguousarray(preprocess(photo(name), cfg.image_size), dtype=np.float32)
        got = encode(x)
        with torch.no_grad():
            ref, emu = fp32(torch.from_numpy(x)), emulated(torch.from_numpy(x))
        for out, g, r, e in zip(OUTPUTS, got, ref, emu, strict=True):
            print(f"| {name} | {out} | {_rel(g, r):.5f} | {_rel(e, r):.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
