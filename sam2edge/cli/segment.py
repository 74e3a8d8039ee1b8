"""``sam2edge segment``: one photo, points and/or a box -> mask PNG + overlay PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError
from sam2edge.io import atomic_path, check_replaceable, png_stamp
from sam2edge.validate import check_box, check_outputs, check_points

SAMPLE_PREFIX = "sample:"


def _point(text: str) -> tuple[float, float, int]:
    parts = text.split(",")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        x, y = float(parts[0]), float(parts[1])
        label = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        msg = f"point {text!r} must be X,Y or X,Y,LABEL (LABEL 1 = object, 0 = background)"
        raise argparse.ArgumentTypeError(msg) from None
    if label not in (0, 1):
        raise argparse.ArgumentTypeError(f"point label {label} must be 1 (object) or 0 (background)")
    return x, y, label


def _box(text: str) -> tuple[float, float, float, float]:
    try:
        vals = tuple(float(v) for v in text.split(","))
        if len(vals) != 4:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"box {text!r} must be X0,Y0,X1,Y1") from None
    return vals  # type: ignore[return-value]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "image", help="photo file, or sample:NAME for a photo bundled with scikit-image (e.g. sample:astronaut.png)"
    )
    p.add_argument(
        "--point", type=_point, action="append", default=[], metavar="X,Y[,LABEL]", help="click in image pixels"
    )
    p.add_argument("--box", type=_box, metavar="X0,Y0,X1,Y1", help="box in image pixels")
    p.add_argument(
        "--checkpoint",
        help="a SAM 2.1 .pt (any size: detected), model.safetensors or a hub id (default: the official "
        "Hiera-Tiny weights from the hub, cached; synthetic weights when offline)",
    )
    p.add_argument("--model", help="an export bundle folder to run instead of the eager model")
    p.add_argument("--out", default="mask.png", help="mask PNG to write (default mask.png)")
    p.add_argument("--overlay", default="overlay.png", help="overlay PNG to write (default overlay.png)")
    p.add_argument("--config", choices=sorted(CONFIGS), help="eager model config (default: detected from the weights)")
    p.add_argument(
        "--embeddings",
        metavar="STORE",
        help="store written by `sam2edge embed`: use the photo's stored embedding instead of running the encoder",
    )
    p.add_argument("--multimask", action="store_true", help="predict 3 candidates and keep the best-scored one")


def image_path(image: str) -> Path:
    from sam2edge.checks.fidelity import photo_path

    if image.startswith(SAMPLE_PREFIX):
        path = photo_path(image[len(SAMPLE_PREFIX) :])
        if not path.is_file():
            raise UserError(
                f"no bundled sample {image!r}; try sample:astronaut.png, sample:chelsea.png or sample:coffee.png"
            )
        return path
    return Path(image)


def _set_image(predictor, path: Path, rgb: np.ndarray, store: str | None) -> None:
    """Encode ``rgb``, or with ``store`` set the photo's stored embedding (its bytes must match)."""
    if store is None:
        predictor.set_image(rgb)
        return
    from sam2edge.runtime.embeddings import sha256_hex

    predictor.load_embedding(store, path.stem, image_sha256=sha256_hex(path.read_bytes()))


def run(args: argparse.Namespace) -> int:
    if not args.point and args.box is None:
        raise UserError("no prompt given; add --point X,Y (repeatable) and/or --box X0,Y0,X1,Y1")
    path = image_path(args.image)
    check_outputs({"--out": args.out, "--overlay": args.overlay}, (path,))
    check_replaceable({"--out": args.out, "--overlay": args.overlay})
    if args.point:
        check_points([p[:2] for p in args.point], [p[2] for p in args.point])
    if args.box is not None:
        check_box(args.box)
    from sam2edge.runtime.preprocess import load_image

    rgb = load_image(path)
    h, w = rgb.shape[:2]
    for x, y, _ in args.point:
        if not (0 <= x < w and 0 <= y < h):
            raise UserError(f"point {x:g},{y:g} is outside the {w}x{h} image; use 0 <= X < {w} and 0 <= Y < {h}")
    box = None
    if args.box is not None:
        x0, y0, x1, y1 = args.box
        if x1 <= x0 or y1 <= y0:
            raise UserError(
                f"box {x0:g},{y0:g},{x1:g},{y1:g} is empty or inverted; give X0,Y0,X1,Y1 with X1 > X0 and Y1 > Y0"
            )
        if min(x0, y0) < 0 or x1 > w or y1 > h:
            raise UserError(f"box {x0:g},{y0:g},{x1:g},{y1:g} leaves the {w}x{h} image; keep it inside 0..{w} x 0..{h}")
        box = np.array(args.box, np.float32)
    coords = np.array([p[:2] for p in args.point], np.float32) if args.point else None
    labels = np.array([p[2] for p in args.point], np.int64) if args.point else None

    from sam2edge.runtime.overlay import render_overlay
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.weights import DEFAULT_CHECKPOINT

    if args.model:
        predictor = Sam2Predictor.from_export(args.model)
    else:
        tiny = args.config in (None, "sam2.1-hiera-tiny")  # the hub holds Hiera-Tiny weights only
        checkpoint = args.checkpoint or (DEFAULT_CHECKPOINT if tiny else None)
        predictor = Sam2Predictor.from_checkpoint(checkpoint, CONFIGS[args.config] if args.config else None)
    _set_image(predictor, path, rgb, args.embeddings)
    masks, scores, _ = predictor.predict(coords, labels, box, multimask_output=args.multimask)
    best = int(np.argmax(scores))
    mask = masks[best] > 0.5
    with atomic_path(args.out) as tmp_mask, atomic_path(args.overlay) as tmp_overlay:  # both or neither
        Image.fromarray(mask.astype(np.uint8) * 255).save(tmp_mask, format="PNG", pnginfo=png_stamp())
        render_overlay(rgb, mask, coords, labels, box).save(tmp_overlay, format="PNG", pnginfo=png_stamp())
    print(f"mask:    {Path(args.out).resolve()}")
    print(f"overlay: {Path(args.overlay).resolve()}")
    all_scores = ", ".join(f"{s:.3f}" for s in scores)
    print(f"score:   {scores[best]:.3f} (mask {best} of [{all_scores}]); foreground {mask.mean():.1%} of {w}x{h}")
    return 0
