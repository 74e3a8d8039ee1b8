"""Segment everything: upstream ``SAM2AutomaticMaskGenerator`` vs sam2edge's generator, one process.

Times ``generate(photo)`` (image encoding included, upstream's default filters) for a points-per-side^2
grid on a real photo: upstream eager (Meta ``sam2``, torchvision stand-ins from tests/amg_oracle.py),
sam2edge eager (same weights, batched decoder), and each ``--bundle`` given (its own weights; a bundle with a
batched decoder, card role decoder-batched, runs B prompts per call, an older bundle one prompt per call).
Prints median seconds of --runs, mask counts and the ratio to upstream; --out writes the records as JSON.

  .venv/bin/python benchmarks/bench_everything.py [--config sam2.1-hiera-tiny] [--points-per-side 32]
      [--bundle out/litert --bundle out/onnx] [--export onnx --export litert --export executorch]
      [--photo astronaut.png] [--runs 3]
      [--threads 2] [--out x.json]
--export TARGET exports the benchmark's own weights to TARGET with the batched decoder graph (B = --points-per-batch)
into --workdir and times that bundle too (same weights as upstream, so the mask counts must agree).
Smoke run: --config test-small --points-per-side 4 --runs 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from amg_oracle import install_torchvision_ops, upstream_generator  # noqa: E402
from oracles import meta_image_path  # noqa: E402

from sam2edge.checks.bench.records import loadavg, machine, make_record, write_record  # noqa: E402
from sam2edge.checks.fidelity import photo  # noqa: E402
from sam2edge.config import CONFIGS  # noqa: E402
from sam2edge.runtime.automatic.amg_utils import batched_nms  # noqa: E402
from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator  # noqa: E402
from sam2edge.runtime.backends import EagerBackend  # noqa: E402
from sam2edge.runtime.predictor import Sam2Predictor  # noqa: E402


def timed_interleaved(runners: dict, image, runs: int) -> list[dict]:
    """One warm-up call each, then ``runs`` rounds calling every runner once per round (interleaved, so a
    change of machine load hits every runner alike); median seconds and the mask count of the last call."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    counts: dict[str, int] = {}
    for name, generate in runners.items():
        counts[name] = len(generate(image))
    for _ in tqdm(range(runs), desc="rounds", unit="round"):
        for name, generate in runners.items():
            t0 = time.perf_counter()
            counts[name] = len(generate(image))
            times[name].append(time.perf_counter() - t0)
    return [{"runner": n, "seconds": statistics.median(times[n]), "masks": counts[n]} for n in runners]


def export_with_batched(target: str, sd: dict, config: str, batch: int, folder: Path) -> Path:
    """A fp32 bundle of ``sd`` with its batched decoder graph (B = ``batch``), through the one export pipeline
    (``run_export(options={"batch": B})``: card role decoder-batched, checked at export). The LiteRT GPU check is
    skipped (not what this benchmark measures); a bundle an earlier run left in ``folder`` is reused."""
    from sam2edge.export.pipeline import run_export

    ck, out = folder / f"weights-{config}.pt", folder / f"bundle-{config}-{target}-b{batch}"
    if (out / "card.json").exists():  # exported by an earlier run with this --workdir (the weights are seeded)
        return out
    torch.save({"model": sd}, ck)
    options = {"batch": batch, **({"gpu_check": "skip"} if target == "litert" else {})}
    run_export(target, config, "fp32", out, checkpoint=str(ck), options=options)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="sam2.1-hiera-tiny", choices=sorted(CONFIGS))
    ap.add_argument("--points-per-side", type=int, default=32)
    ap.add_argument("--points-per-batch", type=int, default=64)
    ap.add_argument("--bundle", action="append", default=[], help="export bundle folder (repeatable)")
    ap.add_argument(
        "--export",
        action="append",
        default=[],
        choices=["onnx", "litert", "executorch"],
        help="export a bundle of the benchmark's weights with its batched decoder (B = --points-per-batch) and time it",
    )
    ap.add_argument(
        "--open-filters",
        action="store_true",
        help="thresholds 0 and NMS 1.0: every candidate is upscaled and encoded (random weights keep ~no mask "
        "under the default filters, so the default run mostly times the decoder)",
    )
    ap.add_argument(
        "--workdir", default="bench-everything", help="where --export writes its bundles (reused by a later run)"
    )
    ap.add_argument("--no-eager", action="store_true", help="leave sam2edge eager out (upstream and bundles only)")
    ap.add_argument("--photo", default="astronaut.png", help="a photo bundled with scikit-image")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the records as JSON here")
    ap.add_argument("--records", help="also write one common-schema record per runner here (for `sam2edge report`)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = CONFIGS[args.config]
    image = photo(args.photo)
    kw = dict(points_per_side=args.points_per_side, points_per_batch=args.points_per_batch)
    if args.open_filters:
        kw.update(pred_iou_thresh=0.0, stability_score_thresh=0.0, box_nms_thresh=1.0)
    path = meta_image_path(cfg, seed=0)
    install_torchvision_ops(nms=batched_nms)  # upstream gets a vectorised NMS too, not the tests' brute force
    runners = {"upstream": upstream_generator(path, cfg, **kw).generate}
    if not args.no_eager:
        runners["sam2edge-eager"] = Sam2AutomaticMaskGenerator(
            Sam2Predictor(EagerBackend.from_state_dict(path.state_dict(), cfg)), **kw
        ).generate
    for target in args.export:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        folder = export_with_batched(target, path.state_dict(), args.config, args.points_per_batch, Path(args.workdir))
        args.bundle.append(str(folder))
    batched = {"upstream": True, "sam2edge-eager": True}
    for b in args.bundle:
        runners[f"bundle:{b}"] = Sam2AutomaticMaskGenerator(Sam2Predictor.from_export(b), **kw).generate
        roles = {a.get("role") for a in json.loads((Path(b) / "card.json").read_text())["artifacts"]}
        batched[f"bundle:{b}"] = "decoder-batched" in roles
    with torch.no_grad():
        records = timed_interleaved(runners, image, args.runs)
    base = records[0]["seconds"]
    grid = f"{args.points_per_side}x{args.points_per_side}"
    host, load = machine(), loadavg()  # the ratio depends on the CPU: every record names it
    print(f"segment everything, {grid} grid, {args.photo} {image.shape[1]}x{image.shape[0]}, {args.config}")
    print(f"  on {host['cpu']} ({host['cores']} cores; {' '.join(host['vector_extensions'])}), load {load}")
    for r in records:
        r.update(ratio=r["seconds"] / base, grid=grid, open_filters=args.open_filters, config=args.config)
        r.update(threads=args.threads, photo=args.photo, batched_decoder=batched[r["runner"]], runs=args.runs)
        r.update(machine=host, loadavg_end=load)
        how = "batched" if r["batched_decoder"] else "one prompt per call"
        print(f"  {r['runner']:<40} {r['seconds']:8.2f} s  {r['masks']:4d} masks  ratio {r['ratio']:.3f}  ({how})")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=2))
    table = f"segment everything: {grid} grid, {args.config}, {args.threads} threads ({args.runs} interleaved runs)"
    for r in records if args.records else ():
        figures = {"generate_s": r["seconds"], "vs_upstream_x": r["ratio"], "masks": r["masks"]}
        write_record(make_record(table, r["runner"], figures, threads=args.threads, photo=args.photo), args.records)


if __name__ == "__main__":
    main()
