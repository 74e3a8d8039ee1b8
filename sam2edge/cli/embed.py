"""``sam2edge embed IMAGES --out STORE [--model BUNDLE | --checkpoint CKPT] [--ray [ADDRESS]]``.

Runs the encoder once per image and stores decoder-ready embeddings (one ``.safetensors`` per image +
``index.parquet``); ``segment --embeddings`` and ``serve --embeddings`` then skip the encoder.
"""

from __future__ import annotations

import argparse
import importlib.util

from sam2edge.config import CONFIGS
from sam2edge.errors import UserError
from sam2edge.validate import check_disjoint, check_int

LOCAL = "local"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", help="a folder of photos, a glob ('photos/*.jpg'), or a list file (one path per line)")
    p.add_argument("--out", required=True, help="store folder: new, empty, or a store written for the same model")
    p.add_argument("--model", help="export bundle folder whose encoder to run")
    p.add_argument("--checkpoint", help="weights for the eager model when no --model is given (default: synthetic)")
    p.add_argument(
        "--config", choices=sorted(CONFIGS), help="eager model config (default: detected from the checkpoint)"
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        metavar="ADDRESS",
        help="run on Ray Data: a local cluster, or the cluster at ADDRESS (e.g. ray://host:10001 or 'auto')",
    )
    p.add_argument("--actors", type=int, default=1, help="Ray: number of encoder actors (each loads the model once)")
    p.add_argument("--cpus-per-actor", type=int, default=1, help="Ray: CPUs (and torch threads) per actor (default 1)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="local: torch threads (default 1; a Ray run writes the same bytes when --cpus-per-actor equals it)",
    )
    p.add_argument("--num-cpus", type=int, help="Ray: CPUs of the local cluster (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from sam2edge.embed.job import run_local, summarize
    from sam2edge.embed.store import list_images

    if args.model and args.checkpoint:
        raise UserError("give --model DIR or --checkpoint FILE, not both (a bundle carries its own weights)")
    for module in ("pyarrow",) + (("ray",) if args.ray is not None else ()):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"`sam2edge embed` needs {module}; pip install 'sam2edge[distributed]'")
    for flag, value in (
        ("--threads", args.threads),
        ("--actors", args.actors),
        ("--cpus-per-actor", args.cpus_per_actor),
    ):
        check_int(flag, value, 1)
    if args.num_cpus is not None:
        check_int("--num-cpus", args.num_cpus, 1)
    check_disjoint({"--out": args.out}, tuple(p for p in (args.model,) if p))
    images = list_images(args.images)
    check_disjoint({"--out": args.out}, tuple(path for _, path in images))
    common = dict(model=args.model, checkpoint=args.checkpoint, config=args.config, progress=not args.quiet)
    if args.ray is None:
        rows = run_local(images, args.out, threads=args.threads, **common)
    else:
        from sam2edge.embed.ray_job import run_ray

        address = None if args.ray == LOCAL else args.ray
        rows = run_ray(
            images,
            args.out,
            address=address,
            num_cpus=args.num_cpus,
            actors=args.actors,
            cpus_per_actor=args.cpus_per_actor,
            **common,
        )
    print(f"store:   {args.out}")
    print(f"summary: {summarize(rows)}")
    return 0
