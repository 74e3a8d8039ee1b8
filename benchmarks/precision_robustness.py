"""Reduced-precision exports of the robustness set at full size: does each ship, what stayed fp32, what IoU.

    .venv/bin/python scripts/robustness_set.py --out /tmp/rset
    .venv/bin/python benchmarks/precision_robustness.py export --set /tmp/rset --bundles /tmp/rset-bundles \\
        [--only upstream-s4-outliers] [--targets onnx executorch litert] [--precisions fp16 int8 fp32]
    .venv/bin/python benchmarks/precision_robustness.py record --bundles /tmp/rset-bundles \\
        --out benchmarks/records/45-precision-robustness-1024.json
    .venv/bin/python benchmarks/precision_robustness.py weights --set /tmp/rset
    .venv/bin/python benchmarks/bench_targets.py INT8 FP32 ... --peer PEER --records /tmp/rs-bench
    .venv/bin/python benchmarks/precision_robustness.py speed --bench /tmp/rs-bench/DATE --set /tmp/rset \
        --out benchmarks/records/47-int8-litert-speed-1024.json

``export`` runs ``sam2edge export ... --force`` (a refused bundle is still written, as "rejected", with its
measured fidelity) for every checkpoint x target x precision whose bundle folder is not there yet, one process
each. ``record`` reads the bundles' card.json (the export's own fidelity: 40 clicks on real photos vs eager fp32
with upstream's operations, and ``extra.mixed_precision``: the parts kept fp32) into a ``sam2edge.table/1``
record, one row per bundle with the exact command that wrote it. ``speed`` turns one ``bench_targets.py`` run
(its ``--records`` folder: one JSON per subject) into a table record: each bundle's encoder and click against
upstream eager, the peer and the same target's fp32 in that run, with the bundle's measured IoU and parts kept
(an existing ``--out`` is refused: remove an old record first to rebuild it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

from sam2edge.checks.bench.script import new_file

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
        # ExecuTorch fp16 that fell back from fp16 arithmetic (export.mixed.fp16_keep) says so
        "precision": card["precision"] + (", fp16 weights, fp32 arithmetic" if (mixed or {}).get("arithmetic") else ""),
        "worst": round(e2e["iou_worst"], 5),
        "median": round(e2e["iou_median"], 5),
        "ships": "yes" if card["status"] == "shippable" else "no (refused)",
        "kept_fp32": kept,
        "command": _portable(card.get("command", "")),
    }


def _vnni_row(card: dict, name: str) -> dict | None:
    """An ONNX int8 bundle's ``encoder_vnni.onnx`` (what a VNNI CPU runs) as a row of its own: its activations
    (static or dynamic) and its own check (``checks.int8_vnni``); None where the export made no such file."""
    vnni = (card["fidelity"].get("checks") or {}).get("int8_vnni") or {}
    if "end_to_end" not in vnni:
        return None
    row = _row({**card, "fidelity": {"end_to_end": vnni["end_to_end"]}}, name)
    activations = vnni.get("int8") or (card.get("extra", {}).get("int8_activations") or {}).get("mode", "dynamic")
    ships = "yes" if vnni["shipped"] else "no (left out of the bundle)"
    kept = {"kept_fp32": "none (every product int8)"} if activations == "static" else {}
    return {**row, "precision": f"int8, encoder_vnni.onnx ({activations} activations)", "ships": ships, **kept}


def _portable(command: str) -> str:
    """The card's command with this machine's folders named by role: the set's as SET, the bundle's as DIR."""
    command = re.sub(r"--checkpoint \S*/([^/\s]+)", r"--checkpoint SET/\1", command)
    return re.sub(r"--out \S+", "--out DIR", command)


def record(args) -> int:
    """The bundles' cards -> the robustness table (one row a bundle); ``--out`` must be a new file."""
    from sam2edge.cards.report import SCHEMA
    from sam2edge.checks.bench.records import table_machine

    problem = new_file(args.out, "--out")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rows = []
    for folder in sorted(p for b in args.bundles for p in Path(b).iterdir()):
        card_path = folder / "card.json"
        if card_path.is_file():
            card = json.loads(card_path.read_text())
            card["fidelity"] = json.loads((folder / "fidelity.json").read_text())
            checkpoint = card["source"].get("checkpoint")  # None: the project's synthetic weights
            name = Path(checkpoint).stem if checkpoint else folder.name.split("--")[0]
            rows += [r for r in (_row(card, name), _vnni_row(card, name)) if r]
    rec = {
        "schema": SCHEMA,
        "id": args.id,
        "title": args.title,
        "date": date.today().isoformat(),
        "command": "python benchmarks/precision_robustness.py export --set DIR --bundles DIR && python "
        f"benchmarks/precision_robustness.py record --bundles DIR --id {args.id} --out FILE",
        "machine": table_machine(),  # where `record` runs
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
        )
        + args.note,
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


SPEED_COLUMNS = [
    ["bundle", "bundle"],
    ["checkpoint", "weights"],
    ["encoder_ms", "encoder p50 (ms)"],
    ["encoder_vs_upstream", "vs upstream"],
    ["encoder_vs_peer", "vs peer"],
    ["encoder_vs_fp32", "vs own fp32"],
    ["click_ms", "click p50 (ms)"],
    ["click_vs_peer", "click vs peer"],
    ["kept", "kept fp32"],
    ["mask_iou", "mask IoU worst (median)"],
    ["ships", "status"],
]


# bench subjects that are not bundles, by runtime
SUBJECT_NAMES = {"upstream-eager": "upstream eager fp32", "peer-onnx": "peer (samexporter-style ONNX fp32)"}


def _weights_name(card: dict, manifest: dict) -> str:
    """The robustness set's name for the card's checkpoint (by sha256 in ``manifest``), or the file's stem;
    "synthetic" for none."""
    checkpoint = card["source"].get("checkpoint")
    if not checkpoint:
        return "synthetic"
    sha = card["source"].get("sha256")
    return next((n for n, e in manifest.items() if sha and e["sha256"] == sha), Path(checkpoint).stem)


def _median(subject: dict, key: str = "encoder_ms") -> float:
    return subject[key]["median"]


def _goals(int8: list[tuple[dict, dict]], peer: dict, fp32: dict[str, dict], bound: dict) -> str:
    """The int8 speed goals, from the run's medians: <= 0.5x the peer's encoder and click, >= 1.6x faster than
    the same target's fp32. ``int8``: (row, subject) of each shippable int8 bundle; ``fp32``: target -> subject;
    ``bound``: the run's compute bound (``bench``'s model FLOPs at the measured GEMM rate)."""
    if not int8:
        return "No shippable int8 bundle in this run."
    row, best = min(int8, key=lambda rs: _median(rs[1]))
    vs_peer = _median(best) / _median(peer)
    own = [
        f"{r['bundle']} {r['checkpoint']} {_median(fp32[s['bundle']['target']]) / _median(s):.2f}x"
        for r, s in int8
        if s["bundle"]["target"] in fp32
    ]
    click = _median(best, "decoder_ms")
    return (
        f"int8 goals: the fastest shippable int8 encoder ({row['bundle']}, {row['checkpoint']}) is "
        f"{vs_peer:.2f}x the peer's (goal <= 0.5x: {'met' if vs_peer <= 0.5 else 'not met'}); faster than the same "
        f"target's fp32 by {', '.join(own) or 'no fp32 in this run'} (goal >= 1.6x). Its click is "
        f"{click / _median(peer, 'decoder_ms'):.2f}x the peer's (goal <= 0.5x): int8 bundles keep the decoder fp32, "
        f"{click / bound['decoder_bound_ms']:.2f}x its compute bound ({bound['decoder_gflop']:.2f} GFLOP at the "
        f"measured {bound['gemm_gflops']:.0f} GFLOP/s: {bound['decoder_bound_ms']:.1f} ms)."
    )


def _ran_check(fidelity: dict, machine: dict) -> tuple[str, dict, bool]:
    """(label suffix, end-to-end check, whether it is the static file) of the encoder file the bench ran: an ONNX
    bundle's ``encoder_vnni.onnx`` (``checks.int8_vnni``; ", static activations" where it holds calibrated
    ranges: every product int8, none of the selection's layers kept) on a CPU with VNNI where that file shipped,
    else the bundle's own check and no suffix."""
    from sam2edge.runtime.backends.onnx import VNNI_FLAGS

    vnni = (fidelity.get("checks") or {}).get("int8_vnni") or {}
    if vnni.get("shipped") and set(VNNI_FLAGS) & set(machine.get("vector_extensions") or ()):
        static = vnni.get("int8") == "static"
        return (", static activations" if static else ""), vnni["end_to_end"], static
    return "", fidelity["end_to_end"], False


def _speed_problem(bench: Path, out: Path, subjects: list[dict], by_runtime: dict) -> str | None:
    """What makes ``speed``'s input unusable, in one line (None: nothing)."""
    if not subjects:
        return f"{bench}: no bench records; give one bench_targets.py --records/DATE folder"
    if not {"upstream-eager", "peer-onnx"} <= set(by_runtime):
        return f"{bench}: the run has no upstream eager or no peer subject; run bench_targets.py with --peer"
    if not any(s.get("bundle") for s in subjects):
        return f"{bench}: the run timed no bundle; give bench_targets.py bundle folders"
    if problem := new_file(out, "--out"):
        return problem
    if out.resolve().parent == bench.resolve():
        return f"{out}: inside --bench, beside the run's records; write the record elsewhere"
    return None


def speed(args) -> int:
    """One bench run's subjects -> rows (bundles first, then the peer and upstream), ratios within the run."""
    from sam2edge.cards.report import SCHEMA
    from sam2edge.checks.bench.records import table_machine

    bench, out = Path(args.bench), Path(args.out)
    subjects = [json.loads(p.read_text()) for p in sorted(bench.glob("*.json"))] if bench.is_dir() else []
    by_runtime = {s["runtime"]: s for s in subjects if s.get("bundle") is None}
    problem = _speed_problem(bench, out, subjects, by_runtime)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    up, peer = by_runtime["upstream-eager"], by_runtime["peer-onnx"]
    fp32 = {s["bundle"]["target"]: s for s in subjects if s.get("bundle") and s["bundle"]["precision"] == "fp32"}
    first = next(s for s in subjects if s.get("bundle"))
    manifest = json.loads((Path(args.set) / "manifest.json").read_text()) if args.set else {}

    def ratio(a: dict, b: dict | None, key: str = "encoder_ms") -> str:
        return f"{_median(a, key) / _median(b, key):.2f}x" if b else ""

    weights = _weights_name(json.loads((Path(first["bundle"]["path"]) / "card.json").read_text()), manifest)
    rows, int8 = [], []
    for s in sorted(subjects, key=lambda s: (s.get("bundle") is None, s["subject"])):
        row = {"bundle": SUBJECT_NAMES.get(s["runtime"], s["subject"]), "checkpoint": weights}
        row.update(kept="", mask_iou="", ships="")
        if s.get("bundle"):
            folder = Path(s["bundle"]["path"])
            card = json.loads((folder / "card.json").read_text())
            activations, e2e, static = _ran_check(json.loads((folder / "fidelity.json").read_text()), s["machine"])
            mixed = card.get("extra", {}).get("mixed_precision")
            row.update(
                bundle=f"{card['target']} {card['precision']}{activations}",
                checkpoint=_weights_name(card, manifest),
                kept="0" if static else str(len(mixed["kept_fp32"])) if mixed else "-",
                mask_iou=f"{e2e['iou_worst']:.4f} ({e2e['iou_median']:.4f})",
                ships=card["status"],
            )
            if card["precision"] == "int8" and card["status"] == "shippable":
                int8.append((row, s))
        row.update(
            encoder_ms=round(_median(s)),
            encoder_vs_upstream=ratio(s, up),
            encoder_vs_peer=ratio(s, peer),
            encoder_vs_fp32=ratio(s, fp32.get(s["bundle"]["target"])) if s.get("bundle") else "",
            click_ms=round(_median(s, "decoder_ms"), 1),
            click_vs_peer=ratio(s, peer, "decoder_ms"),
        )
        rows.append(row)
    rec = {
        "schema": SCHEMA,
        "id": args.id,
        "title": f"{args.title} (Hiera-Tiny, {first['resolution']} px, {first['threads']} threads)",
        "date": first["date"],
        "command": "python benchmarks/precision_robustness.py export --set SET --bundles DIR && python "
        f"benchmarks/bench_targets.py BUNDLE ... --peer PEER --threads {first['threads']} --runs {first['runs']} "
        f"--clicks {first['clicks_per_run']} --records RECORDS && python benchmarks/precision_robustness.py speed "
        "--bench RECORDS/DATE --set SET --out FILE",
        "machine": table_machine(first["machine"]),
        "sam2edge": {"version": first["version"].split()[-1]},
        "columns": SPEED_COLUMNS,
        "rows": rows,
        "notes": [
            f"One quiet process: every subject loaded and warmed up once, then {first['runs']} interleaved rounds "
            f"of one encode and {first['clicks_per_run']} one-point clicks"
            + (f", each call after {first['idle_s']} s idle" if first.get("idle_s") else "")
            + "; compare only within this run. Upstream "
            f"eager and the peer (samexporter-style ONNX fp32) run the first bundle's weights ({weights}).",
            "kept fp32: encoder layers the export's measured selection kept fp32; mask IoU: the bundle's own "
            "export-time check, 40 clicks on 5 photos vs eager fp32 with upstream's operations.",
            _goals(int8, peer, fp32, first["compute_bound"]),
            *args.note,
        ],
        "chart": {"label": "bundle", "value": "encoder_ms", "title": "Encoder p50 (ms): lower is better"},
    }
    Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")
    print(f"{len(rows)} rows -> {args.out}")
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
    r.add_argument("--id", default="precision-robustness-1024")
    r.add_argument(
        "--title",
        default="Reduced precision on the robustness set: full-size Hiera-Tiny exports, parts kept fp32 chosen by "
        "measurement",
    )
    r.add_argument("--out", required=True)
    r.add_argument("--note", action="append", default=[], help="a note under the table (repeatable)")
    w = sub.add_parser("weights")
    w.add_argument("--set", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--bench", required=True, help="one bench_targets.py run's records (a --records/DATE folder)")
    s.add_argument("--set", help="the robustness set the bundles were exported from (names their weights)")
    s.add_argument("--id", default="int8-robustness-speed-1024")
    s.add_argument("--title", default="Reduced-precision bundles of ordinary checkpoints against the peer and upstream")
    s.add_argument("--out", required=True)
    s.add_argument("--note", action="append", default=[], help="a note under the table (repeatable)")
    args = p.parse_args(argv)
    return {"export": export, "record": record, "weights": weights, "speed": speed}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
