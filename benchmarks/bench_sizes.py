"""Every SAM 2.1 size against upstream eager of the same size, in one run: encoder, click, file sizes.

    .venv/bin/python benchmarks/bench_sizes.py [--sizes tiny,small,base-plus,large] [--threads 2] [--runs 5]
        [--clicks 8] [--resolution 1024] [--reduced] [--export litert,onnx --out bench-sizes/] [--json out.json]

Per size: upstream's image path (Meta ``sam2`` modules built from the size's config) and sam2edge's
eager model (the export form, default ``Rewrites``) hold the same perturbed random weights; rounds are
interleaved (one encode of the astronaut photo + ``--clicks`` single-point decodes per subject per
round) so machine drift hits both alike. Printed: encoder and per-click median / min, the ratio to
upstream, the parameter count and fp32 / fp16 weight bytes. With ``--export`` every size is also
exported (synthetic weights of that size, fp32; a bundle already under ``--out`` is reused) and its
artifacts' file sizes are listed. Every bundle under ``--out`` whose card names the size's config (the
``--export`` ones and any other, e.g. an fp16 one) is timed too, in the same interleaved rounds, through
its own runtime (its weights are that size's synthetic ones: a time does not depend on the values).
``--reduced`` runs the CI stand-ins (``test-small-*``): a smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from sam2edge.checks.fidelity import photo
from sam2edge.checks.fidelity.upstream import UpstreamImagePath
from sam2edge.config import CONFIGS, SIZES, Sam2Config
from sam2edge.model import Rewrites, build_sam2
from sam2edge.runtime.preprocess import preprocess


def _perturbed(cfg: Sam2Config, seed: int) -> UpstreamImagePath:
    torch.manual_seed(seed)
    ref = UpstreamImagePath(cfg)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for t in list(ref.parameters()) + list(ref.buffers()):
            if t.is_floating_point():
                t.add_(0.02 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return ref.eval()


def _subjects(cfg: Sam2Config, eager: bool = True) -> dict:
    """name -> (encode(x), decode(feats, coords, labels)) for upstream and (``eager``) sam2edge, same weights."""
    ref = _perturbed(cfg, 0)
    ours = build_sam2(cfg, Rewrites())
    ours.load_state_dict(ref.state_dict())
    pe = ours.sam_prompt_encoder

    def ours_decode(f, coords, labels):
        pad_c = torch.cat([coords, torch.zeros(1, 1, 2)], 1)  # sam2edge's layout: trailing pad point
        pad_l = torch.cat([labels.float(), -torch.ones(1, 1)], 1)
        masks, iou, _ = ours.decode(*f, pe.embed_points(pad_c, pad_l), pe.no_mask_dense)
        return ours.sam_mask_decoder.multimask(masks, iou)

    subjects = {"upstream": (ref.encode, lambda f, c, lab: ref.decode(f, c, lab.int()))}
    if eager:
        subjects["sam2edge"] = (ours.encode_image, ours_decode)
    return subjects


def _bundle_subjects(bundles: dict[Path, dict], threads: int) -> dict:
    """name -> (encode, decode) of each bundle's runtime (model-input coords with sam2edge's pad point)."""
    from sam2edge.checks.fidelity.verify import open_backend

    out = {}
    for folder, card in bundles.items():
        runner = open_backend(folder, card, threads=threads)

        def decode(f, coords, labels, runner=runner):
            pad_c = np.concatenate([coords.numpy(), np.zeros((1, 1, 2), np.float32)], 1)  # (1, 2, 2)
            pad_l = np.array([[float(labels[0, 0]), -1.0]], np.float32)  # (1, 2)
            return runner.decode(f, pad_c, pad_l, None)

        out[f"{card['target']} {card['precision']}"] = (lambda x, runner=runner: runner.encode(x.numpy()), decode)
    return out


def size_bundles(config: str, out: Path) -> dict[Path, dict]:
    """{folder: card} of the bundles under ``out`` whose card names ``config``, by folder name."""
    from sam2edge.bundle import load_card

    cards = {path.parent: load_card(path.parent) for path in sorted(out.glob("*/card.json"))}
    return {folder: card for folder, card in cards.items() if card.get("config") == config}


def time_size(
    cfg: Sam2Config, runs: int, warmup: int, clicks: int, bundles: dict | None = None, eager: bool = True
) -> dict:
    """{subject: {"encoder_ms": [...], "click_ms": [...]}} over interleaved rounds (``bundles``: more subjects)."""
    subjects = {**_subjects(cfg, eager), **(bundles or {})}
    x = preprocess(photo("astronaut.png"), cfg.image_size)
    s = cfg.image_size / 1024
    coords, labels = torch.tensor([[[520.0 * s, 380.0 * s]]]), torch.tensor([[1]], dtype=torch.int32)
    out = {name: {"encoder_ms": [], "click_ms": []} for name in subjects}
    for r in range(warmup + runs):
        k = r % len(subjects)
        order = list(subjects)[k:] + list(subjects)[:k]  # rotate who goes first
        for name in order:
            encode, decode = subjects[name]
            t = time.perf_counter()
            feats = encode(x)
            te = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(clicks):
                decode(feats, coords, labels)
            td = (time.perf_counter() - t) / clicks
            if r >= warmup:
                out[name]["encoder_ms"].append(te * 1e3)
                out[name]["click_ms"].append(td * 1e3)
    return out


def export_sizes(config: str, targets: list[str], out: Path) -> dict[str, dict[str, int]]:
    """Export ``config`` (synthetic weights, fp32) to each target under ``out`` unless a bundle is there;
    {target: {"error": exit code}} for an export that failed."""
    from sam2edge.cli.main import main as sam2edge_main

    failed = {}
    for target in targets:
        bundle = out / f"{config}-{target}"
        if not (bundle / "card.json").is_file():
            rc = sam2edge_main(["export", "--target", target, "--config", config, "--out", str(bundle)])
            if rc:
                failed[target] = {"error": rc}
    return failed


def bundle_files(bundles: dict[Path, dict]) -> dict[str, dict[str, int]]:
    """{"target precision": {artifact: bytes}} of each bundle, from its card."""
    return {
        f"{card['target']} {card['precision']}": {a["file"]: int(a["bytes"]) for a in card["artifacts"]}
        for card in bundles.values()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, from {', '.join(SIZES)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--clicks", type=int, default=8, help="decodes per round")
    p.add_argument("--resolution", type=int, default=None, help="input side (default: the config's)")
    p.add_argument("--reduced", action="store_true", help="the reduced-depth CI stand-ins (smoke run)")
    p.add_argument("--export", default="", help="targets to export per size for file sizes, e.g. litert,onnx")
    p.add_argument("--out", default="bench-sizes", help="folder for the --export bundles")
    p.add_argument("--json", help="write every number here too")
    p.add_argument("--no-eager", action="store_true", help="leave sam2edge eager out (upstream and bundles only)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    results = {}
    for size in a.sizes.split(","):
        if size not in SIZES:
            p.error(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
        name = SIZES[size][1 if a.reduced else 0]
        cfg = CONFIGS[name] if a.resolution is None else CONFIGS[name].at_resolution(a.resolution)
        params = sum(t.numel() for t in build_sam2(cfg).parameters())
        print(f"{size}: {name} at {cfg.image_size}px ...", file=sys.stderr, flush=True)
        res = {"config": name, "resolution": cfg.image_size, "params": params}
        failed = export_sizes(name, a.export.split(","), Path(a.out)) if a.export else {}
        found = size_bundles(name, Path(a.out)) if Path(a.out).is_dir() else {}
        res["bundles"] = [str(b) for b in found]
        res["files"] = {**bundle_files(found), **failed}
        bundles = _bundle_subjects(found, a.threads)
        res["timing"] = time_size(cfg, a.runs, a.warmup, a.clicks, bundles, eager=not a.no_eager)
        results[size] = res
    print(format_table(results, a.threads, a.runs, a.clicks))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


def format_table(results: dict, threads: int, runs: int, clicks: int) -> str:
    lines = [
        f"{threads} threads, median (min) of {runs} interleaved rounds; click = mean of {clicks} decodes;"
        " ratio = subject / upstream of the same size",
        f"{'size':<10} {'config':<24} {'px':>5} {'params M':>9} {'fp32 MB':>8} {'fp16 MB':>8} | "
        f"{'subject':<12} {'encoder ms':>16} {'ratio':>6} {'click ms':>14} {'ratio':>6}",
    ]
    for size, r in results.items():
        t = r["timing"]
        up_e, up_c = statistics.median(t["upstream"]["encoder_ms"]), statistics.median(t["upstream"]["click_ms"])
        for i, (who, v) in enumerate(t.items()):
            e, c = statistics.median(v["encoder_ms"]), statistics.median(v["click_ms"])
            head = (
                f"{size:<10} {r['config']:<24} {r['resolution']:>5} {r['params'] / 1e6:9.2f} "
                f"{r['params'] * 4 / 1e6:8.1f} {r['params'] * 2 / 1e6:8.1f}"
                if i == 0
                else " " * 68
            )
            lines.append(
                f"{head} | {who:<12} {e:8.1f} ({min(v['encoder_ms']):6.1f}) {e / up_e:6.2f} "
                f"{c:6.2f} ({min(v['click_ms']):5.2f}) {c / up_c:6.2f}"
            )
        for target, files in r.get("files", {}).items():
            desc = ", ".join(
                f"{k} {v / 1e6:.1f} MB" if k != "error" else f"export failed ({v})"
                for k, v in files.items()
                if k == "error" or v >= 100_000  # the model files, not the small host tables
            )
            lines.append(f"{'':<10} files {target}: {desc}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
