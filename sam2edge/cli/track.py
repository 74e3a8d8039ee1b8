"""``sam2edge track``: a video and prompts on some frames -> per-frame mask PNGs (or COCO RLE in a JSON file) and
an overlay video, from a checkpoint of any size or a ``--video`` export bundle of any target."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from sam2edge.config import VIDEO_CONFIGS
from sam2edge.runtime.video.track import Prompt

_PROMPT = re.compile(r"^(?P<frame>\d+):(?P<values>[^@]+?)(?:@(?P<obj>-?\d+))?$")


def _parse(text: str, kind: str, sizes: tuple[int, ...], usage: str) -> tuple[int, int, tuple[float, ...]]:
    m = _PROMPT.match(text.strip())
    try:
        if not m:
            raise ValueError
        values = tuple(float(v) for v in m.group("values").split(","))
        if len(values) not in sizes:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{kind} {text!r} must be {usage}") from None
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"{kind} {text!r} holds NaN or infinity; pass finite pixel coordinates")
    return int(m.group("frame")), int(m.group("obj") or 1), values


def _point(text: str) -> Prompt:
    frame, obj, v = _parse(text, "point", (2, 3), "F:X,Y[,LABEL][@OBJ] (LABEL 1 = object, 0 = background)")
    label = int(v[2]) if len(v) == 3 else 1
    if label not in (0, 1) or (len(v) == 3 and v[2] != label):
        raise argparse.ArgumentTypeError(f"point label in {text!r} must be 1 (object) or 0 (background)")
    return Prompt(frame, obj, point=(v[0], v[1], label))


def _box(text: str) -> Prompt:
    frame, obj, v = _parse(text, "box", (4,), "F:X0,Y0,X1,Y1[@OBJ]")
    return Prompt(frame, obj, box=(v[0], v[1], v[2], v[3]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "video", help="video file (.mp4/.webm/.mov, decoded by PyAV) or a folder of 00000.jpg, ... (or .png) frames"
    )
    p.add_argument(
        "--point", type=_point, action="append", default=[], metavar="F:X,Y[,LABEL][@OBJ]", help="click on frame F"
    )
    p.add_argument("--box", type=_box, action="append", default=[], metavar="F:X0,Y0,X1,Y1[@OBJ]", help="box on F")
    p.add_argument("--reverse", action="store_true", help="also track backwards from the start frame")
    p.add_argument(
        "--start-frame", type=int, metavar="N", help="frame to track from (default: the first prompted frame)"
    )
    p.add_argument(
        "--max-frames",
        type=int,
        metavar="K",
        help="track frames N..N+K (and N..N-K with --reverse), as upstream's max_frame_num_to_track (default: all)",
    )
    p.add_argument(
        "--out",
        default="masks",
        help="new folder for palette PNG masks (pixel = object id; default masks), or a new .json file:"
        " COCO RLE per tracked frame and object",
    )
    p.add_argument("--overlay", help="overlay video to write: .mp4 (H.264) or .webm (VP9)")
    p.add_argument(
        "--checkpoint", help="sam2.1_hiera_*.pt, edgetam.pt, model.safetensors or a hub id (default: synthetic weights)"
    )
    p.add_argument("--model", help="an export bundle folder made with `sam2edge export --video` (any target)")
    p.add_argument(
        "--config",
        choices=sorted(VIDEO_CONFIGS),
        help="model config (default: the one the checkpoint's tensors or the bundle name; test-small: quick)",
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from tqdm import tqdm

    from sam2edge.runtime.video import track as job
    from sam2edge.runtime.video.io import read_frames, video_fps
    from sam2edge.runtime.video.track import check_prompts, frames_to_track, refuse_existing, track, write_outputs
    from sam2edge.validate import check_disjoint

    prompts = list(args.point) + list(args.box)
    check_disjoint({"--out": args.out, "--overlay": args.overlay}, (args.video,))
    refuse_existing(args.out, args.overlay)
    frames = read_frames(args.video)
    h, w = frames[0].shape[:2]
    check_prompts(prompts, len(frames), w, h)
    job.check_span(args.start_frame, args.max_frames, len(frames))
    predictor = job.load_predictor(args.checkpoint, args.model, args.config)
    if predictor.provenance.get("checkpoint") == "synthetic":
        what = f"bundle {args.model} holds" if args.model else "no --checkpoint given;"
        print(f"WARNING: {what} SYNTHETIC weights, masks are meaningless.", file=sys.stderr)
    span = dict(start=args.start_frame, max_frames=args.max_frames)
    tracked: dict[int, list[dict]] = {}  # frame -> COCO RLE per object (--out *.json)
    keep = (lambda f, ids, m: tracked.__setitem__(f, job.coco_masks(ids, m))) if job.is_json(args.out) else None
    with tqdm(total=frames_to_track(len(frames), prompts, args.reverse, **span), unit="frame", desc="track") as bar:
        labels = track(predictor, frames, prompts, args.reverse, lambda _: bar.update(1), **span, on_masks=keep)
    if keep is None:
        write_outputs(frames, labels, args.out, args.overlay, video_fps(args.video))
        print(f"masks:   {Path(args.out).resolve()} ({len(labels)} palette PNGs, pixel = object id)")
    else:
        objects = sorted({p.obj_id for p in prompts})
        doc = {"video": args.video, "size": [h, w], "model": args.model or args.checkpoint or "synthetic"}
        doc.update(objects=objects, frames=[{"frame": f, "masks": tracked[f]} for f in sorted(tracked)])
        job.write_json(doc, args.out, frames, labels, args.overlay, video_fps(args.video))
        print(f"masks:   {Path(args.out).resolve()} (COCO RLE, {len(tracked)} frames x {len(objects)} objects)")
    if args.overlay:
        print(f"overlay: {Path(args.overlay).resolve()}")
    return 0
