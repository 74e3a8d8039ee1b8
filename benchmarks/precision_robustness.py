"""Reduced-precision exports of the robustness set at full size: does each ship, what stayed fp32, what IoU.

    .venv/bin/python scripts/robustness_set.py --out /tmp/rset
    .venv/bin/python benchmarks/precision_robustness.py export --set /tmp/rset --bundles /tmp/rset-bundles \\
        [--only upstream-s4-outliers] [--targets onnx executorch litert] [--precisions fp16 int8 fp32]
    .venv/bin/python benchmarks/precision_robustness.py record --bundles /tmp/rset-bundles \\
        --out benchmarks/records/45-precision-robustness-1024.json
    .venv/bin/python benchmarks/precision_robustness.py weights --set /tmp/rset

``export`` runs ``sam2edge export ... --force`` (a refused bundle is still written, as "rejected", with its
measured fidelity) for every checkpoint x target x precision whose bundle folder is not there yet, one process
each. ``record`` reads the bundles' card.json (the export's own fidelity: 40 clicks on real photos vs eager fp32
with upstream's operations, and ``extra.mixed_precision``: the parts kept fp32) into a ``sam2edge.table/1``
record, one row per bundle with the exact command that wrote it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

CONFIG = "sam2.1-hiera-tiny"
COLUMNS = [
    ["checkpoint", "checkpoint"],
    ["target", "target"],
    ["precision", "precision"],
    ["worst", "mask IoU worst"],
    ["median", "mask IoU median"],
    ["ships", "ships"],
    ["kept_fp32", "kept fp32 (measured choice)"],
    ["command", "command"],
]


def _bundle(folder: Path, name: str, target: str, precision: str) -> Path:
    return folder / f"{name}--{target}--{precision}"


def export(args) -> int:
    manifest = json.loads((Path(args.set) / "manifest.json").read_text())
    for name, entry in manifest.items():
        if args.only and name not in args.only:
            continue
        for target in args.targets:
            for precision in args.precisions:
                out = _bundle(Path(args.bundles), name, target, precision)
                if out.exists():
                    continue
                cmd = [sys.executable, "-m", "sam2edge.cli.main", "export", "--target", target, "--config", CONFIG]
                cmd += ["--precision", precision, "--checkpoint", str(Path(args.set) / entry["file"])]
                cmd += ["--out", str(out), "--force"] + (["--gpu-check", "skip"] if target == "litert" else [])
                print(" ".join(cmd[1:]), flush=True)
                subprocess.run(cmd, check=False)
    return 0


def _row(card: dict, name: str) -> dict:
    e2e = card["fidelity"]["end_to_end"]
    mixed = card.get("extra", {}).get("mixed_precision")
    kept = "-" if card["precision"] == "fp32" else ", ".join(mixed["kept_fp32"]) or "none" if mixed else "not measured"
    return {
        "checkpoint": name,
        "target": card["target"],
        "precision": card["precision"],
        "worst": round(e2e["iou_worst"], 5),
        "median": round(e2e["iou_median"], 5),
        "ships": "yes" if card["status"] == "shippable" else "no (refused)",
        "kept_fp32": kept,
        "command": _portable(card.get("command", "")),
    }


def _portable(command: str) -> str:
    """The card's command with this machine's folders named by role: the set's as SET, the bundle's as DIR."""
    command = re.sub(r"--checkpoint \S*/([^/\s]+)", r"--checkpoint SET/\1", command)
    return re.sub(r"--out \S+", "--out DIR", command)


def record(args) -> int:
    from sam2edge.cards.report import SCHEMA

    rows = []
    for folder in sorted(p for b in args.bundles for p in Path(b).iterdir()):
        card_path = folder / "card.json"
        if card_path.is_file():
            card = json.loads(card_path.read_text())
            card["fidelity"] = json.loads((folder / "fidelity.json").read_text())
            checkpoint = card["source"].get("checkpoint")  # None: the project's synthetic weights
            rows.append(_row(card, Path(checkpoint).stem if checkpoint else folder.name.split("--")[0]))
    rec = {
        "schema": SCHEMA,
        "id": "precision-robustness-1024",
        "title": "Reduced precision on the robustness set: full-size Hiera-Tiny exports, parts kept fp32 chosen "
        "by measurement",
        "date": date.today().isoformat(),
        "command": "python benchmarks/precision_robustness.py export --set DIR --bundles DIR && python "
        "benchmarks/precision_robustness.py record --bundles DIR --out FILE",
        "machine": {"cpu": "AMD EPYC", "cores": 2},
        "columns": COLUMNS,
        "rows": rows,
        "notes": [
            "checkpoints: scripts/robustness_set.py (upstream's own initialisation, seeded; perturbed; outlier "
            "channels); IoU: each export's own fidelity, 40 clicks on 5 photos vs eager fp32 with upstream's "
            "operations; bars fp16 worst >= 0.99, median >= 0.999; int8 worst >= 0.95 (the int8 goal adds median "
            ">= 0.99, which the int8 selection aims at first)",
        ]
        + (
            ["synthetic: the project's own weights (no --checkpoint)"]
            if any(r["checkpoint"] == "synthetic" for r in rows)
            else []
        ),
    }
    Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")
    print(f"{len(rows)} rows -> {args.out}")
    return 0


def weights(args) -> int:
    """Per checkpoint: the largest |w| of the encoder and the largest relative fp16 rounding error of any
    encoder tensor (||fp16(w) - w|| / ||w||): range overflow or underflow would show here."""
    from sam2edge.config import HIERA_TINY
    from sam2edge.weights import load_weights

    manifest = json.loads((Path(args.set) / "manifest.json").read_text())
    for name, entry in manifest.items():
        sd = load_weights(str(Path(args.set) / entry["file"]), HIERA_TINY)[0]
        enc = {k: v for k, v in sd.items() if k.startswith("image_encoder.") and v.is_floating_point()}
        peak = max(float(v.abs().max()) for v in enc.values())
        rel = max(float((v.half().float() - v).norm() / v.norm().clamp_min(1e-30)) for v in enc.values())
        print(f"{name}: max |w| {peak:.3g}, largest relative fp16 rounding error {rel:.2e}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--set", required=True, help="folder written by scripts/robustness_set.py")
    e.add_argument("--bundles", required=True)
    e.add_argument("--only", nargs="*")
    e.add_argument("--targets", nargs="*", default=["onnx", "executorch", "litert"])
    e.add_argument("--precisions", nargs="*", default=["fp16", "int8"])
    r = sub.add_parser("record")
    r.add_argument("--bundles", required=True, nargs="+", help="folders holding bundle folders")
    r.add_argument("--out", required=True)
    w = sub.add_parser("weights")
    w.add_argument("--set", required=True)
    args = p.parse_args(argv)
    return {"export": export, "record": record, "weights": weights}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
