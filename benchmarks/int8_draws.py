"""Is an int8 bundle its emulation? Its encoder outputs against the eager emulation and against other draws of it.

    .venv/bin/python benchmarks/int8_draws.py BUNDLE CHECKPOINT [--photos chelsea.png coffee.png]

For an int8 bundle (any target) and the checkpoint it was exported from, each photo's encoder outputs (image
embedding, high-resolution features) are compared, as relative L2 distances: the bundle's and the emulation's
(``export.int8_sensitivity.Int8Emulation`` on the state dict the export quantised, ``export.smooth.prepared_weights``,
with the card's kept layers fp32) distance from eager fp32, the bundle's from the emulation, and two emulation draws'
from each other (every quantised activation dithered by ``DITHER``, seeds 1 and 2), with the cosine between the
bundle's and the emulation's error. Where the bundle is as far from the emulation as one draw from another, the
bundle is one more draw of int8's rounding (what ``select_int8``'s draws assume). Full size, 2 cores: about a minute
a photo.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sam2edge.checks.bench.script import missing_files, parsed

OUTPUTS = ("image_embed", "feat_s1", "feat_s0")


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    card = Path(args.bundle) / "card.json"
    if not card.is_file():
        return f"{args.bundle}: no card.json; give an int8 bundle folder written by `sam2edge export`"
    try:
        meta = json.loads(card.read_text())
    except ValueError:
        return f"{card}: not JSON; give an int8 bundle folder written by `sam2edge export`"
    if meta.get("precision") != "int8":
        return f"{args.bundle}: a {meta.get('precision')} bundle; give an int8 one"
    return missing_files([args.checkpoint], "give the checkpoint the bundle was exported from")


def _distance(a, b, ref) -> float:
    import numpy as np

    a, b, ref = (np.asarray(v, np.float64) for v in (a, b, ref))
    return float(np.linalg.norm(a - b) / np.linalg.norm(ref))


def _cosine(a, b) -> float:
    import numpy as np

    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("checkpoint")
    p.add_argument("--photos", nargs="+", default=["chelsea.png", "coffee.png"])
    args = parsed(p, argv, _problem)
    if args is None:
        return 2
    import numpy as np
    import torch

    from sam2edge.checks.fidelity import photo
    from sam2edge.checks.fidelity.verify import bundle_config
    from sam2edge.errors import UserError
    from sam2edge.export.int8_sensitivity import DITHER, Int8Emulation
    from sam2edge.export.smooth import prepared_weights
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend, backend_for
    from sam2edge.runtime.preprocess import preprocess
    from sam2edge.weights import load_weights

    torch.set_num_threads(2)
    card = json.loads((Path(args.bundle) / "card.json").read_text())
    kept = tuple(card.get("extra", {}).get("mixed_precision", {}).get("kept_fp32", []))
    try:
        cfg = bundle_config(card)
        sd, _ = load_weights(args.checkpoint, cfg)
        photos = {name: np.asarray(preprocess(photo(name), cfg.image_size)) for name in args.photos}
        bundle = backend_for(card["target"]).from_bundle(args.bundle, threads=2)
    except (UserError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reference = EagerBackend.from_state_dict(sd, cfg, UPSTREAM)
    emu = Int8Emulation(prepared_weights(sd, cfg, "int8")[0], cfg, card["target"], reference)

    print(f"{card['target']} int8, {len(kept)} layers kept fp32; relative L2 distance (dither {DITHER:g})")
    print()
    cols = ("bundle vs fp32", "emulation vs fp32", "bundle vs emulation", "draw 1 vs draw 2", "cosine of the errors")
    print("| photo | output | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, x in photos.items():
        ref, got = reference.encode(x), bundle.encode(x)
        emu0, one, two = (emu.encode(x, kept, d) for d in (0, 1, 2))
        for out in OUTPUTS:
            f, b, e = (getattr(v, out) for v in (ref, got, emu0))
            cells = (
                _distance(b, f, f),
                _distance(e, f, f),
                _distance(b, e, f),
                _distance(getattr(one, out), getattr(two, out), f),
                _cosine(np.subtract(b, f, dtype=np.float64), np.subtract(e, f, dtype=np.float64)),
            )
            print(f"| {name} | {out} | " + " | ".join(f"{c:.5f}" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
