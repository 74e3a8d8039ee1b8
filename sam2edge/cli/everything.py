"""``sam2edge everything``: segment everything in a photo -> masks JSON (COCO RLE) + colour overlay PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError
from sam2edge.io import SOFTWARE, atomic_path, check_replaceable, png_stamp
from sam2edge.validate import check_amg_options, check_outputs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help="photo file, or sample:NAME for a photo bundled with scikit-image")
    p.add_argument("--model", help="an export bundle folder to run instead of the eager model")
    p.add_argument(
        "--checkpoint", help="sam2.1_hiera_tiny.pt, model.safetensors or a hub id (default: synthetic weights)"
    )
    p.add_argument(
        "--config", choices=sorted(CONFIGS), help="eager model config (no --model; default: detected from the weights)"
    )
    p.add_argument("--out", default="masks.json", help="masks JSON to write (COCO RLE per mask; default masks.json)")
    p.add_argument("--overlay", default="everything.png", help="overlay PNG to write (default everything.png)")
    p.add_argument("--points-per-side", type=int, default=32, help="grid of N x N point prompts (default 32)")
    p.add_argument("--points-per-batch", type=int, default=64, help="prompts per decoder call (default 64)")
    p.add_argument("--pred-iou-thresh", type=float, default=0.8, help="keep masks with predicted IoU above this")
    p.add_argument("--stability-thresh", type=float, default=0.95, help="keep masks with stability >= this")
    p.add_argument("--box-nms-thresh", type=float, default=0.7, help="box IoU above which duplicates are dropped")
    p.add_argument("--crop-layers", type=int, default=0, help="extra layers of image crops (default 0)")
    p.add_argument("--min-region-area", type=int, default=0, help="fill holes / drop islands up to this area")


def _check_outputs(image: Path, out: Path, overlay: Path) -> None:
    """The shared output checks (never over the input, not one file twice, no folder) plus the suffixes."""
    check_outputs({"--out": out, "--overlay": overlay}, (image,))
    check_replaceable({"--out": out, "--overlay": overlay})
    for path, want in ((out, ".json"), (overlay, ".png")):
        if path.suffix.lower() != want:
            raise UserError(f"output {path} must end in {want}")


def _generator_kwargs(args: argparse.Namespace) -> dict:
    kwargs = dict(
        points_per_side=args.points_per_side,
        points_per_batch=args.points_per_batch,
        pred_iou_thresh=args.pred_iou_thresh,
        stability_score_thresh=args.stability_thresh,
        box_nms_thresh=args.box_nms_thresh,
        crop_n_layers=args.crop_layers,
        min_mask_region_area=args.min_region_area,
        output_mode="coco_rle",
        progress=True,
    )
    check_amg_options(kwargs)  # the generator's own checks, run before the photo and the model are loaded
    return kwargs


def run(args: argparse.Namespace) -> int:
    from pycocotools import mask as mask_utils

    from sam2edge.cli.segment import image_path
    from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.overlay import render_masks
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.runtime.preprocess import load_image

    out, overlay = Path(args.out), Path(args.overlay)
    photo = image_path(args.image)
    _check_outputs(photo, out, overlay)
    kwargs = _generator_kwargs(args)
    rgb = load_image(photo)
    if args.model:
        predictor = Sam2Predictor.from_export(args.model)
    else:
        predictor = Sam2Predictor.from_checkpoint(args.checkpoint, CONFIGS[args.config] if args.config else None)
    records = Sam2AutomaticMaskGenerator(predictor, **kwargs).generate(rgb)
    h, w = rgb.shape[:2]
    model = args.model or args.checkpoint or "synthetic"
    doc = {"image": args.image, "size": [h, w], "model": model, "software": SOFTWARE, "masks": records}
    masks = [mask_utils.decode({**r["segmentation"], "counts": r["segmentation"]["counts"].encode()}) for r in records]
    with atomic_path(out) as tmp_json, atomic_path(overlay) as tmp_png:  # both or neither
        tmp_json.write_text(json.dumps(doc))
        render_masks(rgb, [m > 0 for m in masks]).save(tmp_png, format="PNG", pnginfo=png_stamp())
    print(f"masks:   {out.resolve()} ({len(records)} masks)")
    print(f"overlay: {overlay.resolve()}")
    return 0
