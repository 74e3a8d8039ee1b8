"""`sam2edge embed` throughput: images/s of the local loop vs Ray Data with 1 and 2 actors, on this machine.

Builds N photos (scikit-image's, copied under distinct names), then embeds them into fresh stores:
  local-tT     the local loop with T torch threads (T = 1 and T = --threads-per-actor x max actors)
  ray-aA       Ray Data, A actors x --threads-per-actor CPUs each, on one local cluster started once
Reports wall seconds per job (model load included, Ray start-up excluded and reported apart), images/s,
and whether every store holds the same bytes as local-t1. Prints a JSON record (or writes --out).

Usage:
  .venv/bin/python benchmarks/bench_embed.py --images 64                 # full size, Hiera-Tiny
  .venv/bin/python benchmarks/bench_embed.py --images 6 --config test-small   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from sam2edge.checks.fidelity import PHOTOS, photo_path
from sam2edge.embed.job import run_local
from sam2edge.embed.ray_job import run_ray
from sam2edge.embed.store import list_images


def make_photos(folder: Path, n: int) -> list:
    names = list(PHOTOS)
    for i in range(n):
        src = photo_path(names[i % len(names)])
        shutil.copy(src, folder / f"img{i:05d}{src.suffix}")
    return list_images(str(folder))


def same_bytes(a: Path, b: Path) -> bool:
    files = sorted(p.name for p in a.glob("*.safetensors"))
    if files != sorted(p.name for p in b.glob("*.safetensors")):
        return False
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def timed(label: str, n: int, fn) -> dict:
    t0 = time.perf_counter()
    rows = fn()
    wall = time.perf_counter() - t0
    ok = sum(r["status"] == "embedded" for r in rows)
    print(f"{label:10s} {wall:8.2f} s  {ok / wall:7.2f} img/s  ({ok}/{n} embedded)", flush=True)
    return {"job": label, "wall_s": round(wall, 3), "images_per_s": round(ok / wall, 3), "embedded": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64, help="number of photos (default 64)")
    ap.add_argument("--config", default="sam2.1-hiera-tiny", help="eager config (test-small for a smoke run)")
    ap.add_argument("--model", help="an export bundle instead of the eager model")
    ap.add_argument("--checkpoint", help="eager weights (default: synthetic; throughput does not depend on them)")
    ap.add_argument("--actors", default="1,2", help="Ray actor counts to run (default 1,2)")
    ap.add_argument("--threads-per-actor", type=int, default=1, help="CPUs and torch threads per actor (default 1)")
    ap.add_argument("--out", help="write the JSON record here")
    args = ap.parse_args()
    actor_counts = [int(a) for a in args.actors.split(",")]
    job = dict(model=args.model, checkpoint=args.checkpoint, config=args.config, progress=False)
    work = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    try:
        photos = work / "photos"
        photos.mkdir()
        images = make_photos(photos, args.images)
        results, stores = [], {}
        for threads in sorted({1, args.threads_per_actor * max(actor_counts)}):
            stores[f"local-t{threads}"] = store = work / f"local-t{threads}"
            run = lambda s=store, t=threads: run_local(images, s, threads=t, **job)  # noqa: E731
            results.append(timed(f"local-t{threads}", len(images), run))
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=args.threads_per_actor * max(actor_counts), include_dashboard=False, log_to_driver=False)
        ray_start = time.perf_counter() - t0
        for a in actor_counts:
            stores[f"ray-a{a}"] = store = work / f"ray-a{a}"
            kw = dict(actors=a, cpus_per_actor=args.threads_per_actor, **job)
            results.append(timed(f"ray-a{a}", len(images), lambda s=store, kw=kw: run_ray(images, s, **kw)))
        ray.shutdown()
        ref = stores["local-t1"]
        for r in results:
            r["same_bytes_as_local_t1"] = same_bytes(ref, stores[r["job"]])
        record = {
            "bench": "embed",
            "config": args.config,
            "model": args.model or args.checkpoint or "synthetic",
            "images": len(images),
            "threads_per_actor": args.threads_per_actor,
            "ray_start_s": round(ray_start, 3),
            "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "results": results,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(record, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
