"""``sam2edge serve [--model DIR] [--host 127.0.0.1] [--port N]``: the tap-to-segment web app.

With ``--model`` (a LiteRT bundle), the encoder runs on the server with the bundle's runtime and the
decoder runs in the browser with LiteRT.js; without it, the eager model (``--checkpoint``, default
synthetic weights) encodes and the page decodes on the server, and says so. A LiteRT bundle exported with
``--video`` also offers "Open video": the server decodes the clip and encodes its frames, the page tracks
(memory attention, video decoder and memory encoder in the browser; ``serve.clips``, ``static/tracker.js``).
With no server compute at all (the encoder in the page too, static files only): ``sam2edge web BUNDLE --out site/``.
"""

from __future__ import annotations

import argparse

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError
from sam2edge.validate import check_positive


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="export bundle folder (a LiteRT bundle lets the browser run the decoder)")
    p.add_argument(
        "--checkpoint",
        help="weights for the eager model when no --model is given (default: the official weights "
        "from the hub, cached; synthetic when offline)",
    )
    p.add_argument("--config", choices=sorted(CONFIGS), help="eager model config (default: detected from the weights)")
    p.add_argument("--embeddings", metavar="STORE", help="store from `sam2edge embed`: open its photos, no encoder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.add_argument("--max-upload-mb", type=float, default=25.0, help="largest photo file accepted (default 25 MB)")
    p.add_argument("--max-megapixels", type=float, default=50.0, help="largest photo accepted (default 50 MP)")


def run(args: argparse.Namespace) -> int:
    from sam2edge.serve.app import Limits, default_app_from_args, serve_forever
    from sam2edge.weights import DEFAULT_CHECKPOINT

    if args.model and args.checkpoint:
        raise UserError("give --model DIR or --checkpoint FILE, not both (a bundle carries its own weights)")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} must lie in 0..65535")
    check_positive("--max-upload-mb", args.max_upload_mb)
    check_positive("--max-megapixels", args.max_megapixels)
    if args.max_upload_mb > 10_000 or args.max_megapixels > 10_000:
        raise UserError("--max-upload-mb and --max-megapixels must stay at or below 10000 (10 GB, 10 GP)")
    tiny = args.config in (None, "sam2.1-hiera-tiny")  # the hub holds Hiera-Tiny weights only
    checkpoint = DEFAULT_CHECKPOINT if tiny and not (args.checkpoint or args.model) else args.checkpoint
    app = default_app_from_args(args.model, checkpoint, args.config)
    if args.embeddings:
        from sam2edge.serve.stored import StoredImages

        app.stored = StoredImages(args.embeddings, app.backend, app.provenance)
    app.limits = Limits(max_upload_bytes=int(args.max_upload_mb * 1e6), max_pixels=int(args.max_megapixels * 1e6))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"WARNING: binding {args.host}: anyone who can reach this address can upload photos", flush=True)
    try:
        serve_forever(app, args.host, args.port)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port") from None
    return 0
