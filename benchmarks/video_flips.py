"""Where a ``--video`` bundle's clip masks differ from eager fp32's, pixel by pixel: the export's video check
(``checks.fidelity.video``) run again, with each flipped pixel's reference logit.

    .venv/bin/python benchmarks/video_flips.py BUNDLE [--checkpoint PATH]

The clip of ``video.run_clip`` (two objects, a correction, reverse propagation) runs on the bundle and on eager fp32
with upstream's operations and the bundle's recorded weights (``--checkpoint``: where the bundle's checkpoint lies
now). Per pass, frame and object: the mask area, the largest |logit difference| relative to the object's largest
|reference logit| (its scale), the pixels whose sign differs, and the smallest |reference logit| among them relative
to the scale, against ``video.TIE`` (a flip at a tie is left out of the IoU). Rows without a flip are counted,
not printed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from sam2edge.checks.bench.script import parsed, refusing


def rows(want: dict, got: dict) -> list[tuple]:
    """(pass, frame, object, area, max diff / scale, flips, min |flipped ref| / scale or None, ties) per object."""
    from sam2edge.checks.fidelity.video import ties

    out = []
    for name, frames in want.items():
        for f, ref in frames.items():
            for o, (r, t) in enumerate(zip(ref, got[name][f], strict=True)):
                scale = float(np.abs(r).max())
                flips = (r > 0) != (t > 0)
                nearest = float(np.abs(r[flips]).min()) / scale if flips.any() else None
                diff = float(np.abs(r - t).max()) / scale
                out.append((name, f, o, int((r > 0).sum()), diff, int(flips.sum()), nearest, int(ties(r).sum())))
    return out


def _problem(args: argparse.Namespace) -> str | None:
    from pathlib import Path

    card = Path(args.bundle) / "card.json"
    if not card.is_file():
        return f"{args.bundle} has no card.json; pass a bundle folder written by `sam2edge export --video`"
    return None


@refusing
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--checkpoint", help="the bundle's checkpoint where it lies now (its SHA-256 must match)")
    args = parsed(ap, argv, _problem)
    if args is None:
        return 2
    from pathlib import Path

    from sam2edge.bundle import load_card
    from sam2edge.checks.fidelity.verify import bundle_config, video_reference_weights
    from sam2edge.checks.fidelity.video import TIE, clip, run_clip
    from sam2edge.config import get_video_config
    from sam2edge.errors import UserError
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.video.backend import EagerVideoBackend
    from sam2edge.runtime.video.bundle import open_video_bundle

    card = load_card(Path(args.bundle))
    if not isinstance(card.get("extra", {}).get("video"), dict):
        raise UserError(f"{args.bundle} has no video graphs; export it with --video")
    cfg = bundle_config(card)
    vcfg = get_video_config(card["config"], cfg.image_size)
    sd, _ = video_reference_weights(card, cfg, vcfg, args.checkpoint)
    frames = clip()
    want = run_clip(EagerVideoBackend.from_state_dict(sd, cfg, vcfg, UPSTREAM), frames)
    got = run_clip(open_video_bundle(Path(args.bundle))[0], frames)
    table = rows(want, got)
    head = f"{args.bundle}: {card['target']} {card['precision']}, clip of {len(frames)} frames"
    print(f"{head}; a tie: |reference logit| <= {TIE:g} of the scale")
    print("| pass | frame | object | mask px | max diff / scale | flips | nearest flip / scale | ties |")
    print("|---|---|---|---|---|---|---|---|")
    for name, f, o, area, diff, flips, nearest, tie in table:
        if flips:
            print(f"| {name} | {f} | {o} | {area} | {diff:.1e} | {flips} | {nearest:.1e} | {tie} |")
    clean = sum(1 for r in table if not r[5])
    worst = max(r[4] for r in table)
    ties = sum(r[7] for r in table)
    print(f"{clean} of {len(table)} masks without a flip; largest diff / scale {worst:.1e}; ties {ties}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
