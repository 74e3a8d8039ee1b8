"""Model card (README.md) of a bundle, rendered from card.json, fidelity.json and measured records.

Nothing in the card is typed by hand: every number is read from

  card.json      provenance, tool versions, command, artifacts (SHA-256, bytes), target facts (extra)
  fidelity.json  export-time measurements and ``sam2edge verify``'s (key "verify"), per output + end to end
  bench records  ``sam2edge bench`` JSON whose ``bundle.artifacts`` equal this bundle's (file -> SHA-256),
                 plus upstream-eager records of the same bench sessions (the comparison rows)
  sweep records  ``DIR/sweep/<litertjs version>/<date>/*.json`` (browser runs, ``sam2edge sweep``)

``render_bundle`` copies the matching bench records into ``DIR/records/``, lists what it found in
card.json ``records``, draws ``latency.png`` (PIL) from the bench records, writes README.md and
rewrites manifest.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from sam2edge.bundle import CARD, FIDELITY, MANIFEST, load_card, require_intact, rewrite_metadata, write_json
from sam2edge.bundle.fidelity import validate_stored
from sam2edge.cards.chart import latency_chart
from sam2edge.errors import UserError
from sam2edge.io import atomic_path

README, CHART, RECORDS_DIR, SWEEP_DIR = "README.md", "latency.png", "records", "sweep"
# target -> (Hugging Face library_name, title of the runtime)
TARGETS: dict[str, tuple[str, str]] = {
    "litert": ("litert", "LiteRT (.tflite)"),
    "onnx": ("onnx", "ONNX (onnxruntime)"),
    "executorch": ("executorch", "ExecuTorch (.pte, XNNPACK)"),
    "executorch-webgpu": ("executorch", "ExecuTorch WebGPU (.pte)"),
}
BENCH_FIELDS = (
    "runtime",
    "subject",
    "resolution",
    "date",
    "provenance",
    "threads",
    "encoder_ms",
    "decoder_ms",
    "first_click_ms",
    "load_s",
    "peak_rss_mb",
    "machine",
    "session",
)
SYNTHETIC = "synthetic"


# ---- reading the evidence ---------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} must hold a JSON object; fix or delete it")
    return obj


def read_fidelity(folder: Path, card: dict) -> dict:
    """fidelity.json (card.json ``fidelity`` when the file is absent), validated against the one schema."""
    path = folder / FIDELITY
    return validate_stored(_read_json(path) if path.is_file() else dict(card.get("fidelity") or {}), path)


def model_artifacts(card: dict) -> dict[str, str]:
    return {a["file"]: a["sha256"] for a in card["artifacts"]}


def find_bench_records(folder: Path, card: dict, search: list[Path]) -> list[tuple[Path, dict]]:
    """Bench records of this bundle (artifact SHA-256s equal) and the upstream records of their sessions."""
    want = model_artifacts(card)
    candidates = []
    for root in [folder / RECORDS_DIR, *search]:
        if root.is_dir():
            candidates += sorted(p for p in root.rglob("*.json") if p.is_file())
    mine: dict[tuple, tuple[Path, dict]] = {}
    upstream: dict[tuple, tuple[Path, dict]] = {}
    for p in candidates:
        rec = _read_json(p)
        if rec.get("kind") != "bench":
            continue
        missing = [f for f in BENCH_FIELDS if f not in rec]
        if missing:
            raise UserError(f"bench record {p} lacks field '{missing[0]}'; re-run `sam2edge bench`")
        key = (rec["session"], rec["subject"])
        if (rec.get("bundle") or {}).get("artifacts") == want:
            mine.setdefault(key, (p, rec))
        elif rec["runtime"] == "upstream-eager":
            upstream.setdefault(key, (p, rec))
    sessions = {k[0] for k in mine}
    keep = list(mine.values()) + [v for k, v in upstream.items() if k[0] in sessions]
    return sorted(keep, key=lambda pr: (pr[1]["date"], pr[1]["session"], pr[1]["runtime"] == "upstream-eager"))


def find_sweep_records(folder: Path) -> list[tuple[Path, dict]]:
    root = folder / SWEEP_DIR
    if not root.is_dir():
        return []
    return [(p, _read_json(p)) for p in sorted(root.rglob("*.json")) if p.is_file()]


# ---- formatting -----------------------------------------------------------------------------------


def _num(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3e}"
        return f"{v:.{digits}f}"
    return str(v)


def _sig(v) -> str:
    """4 significant digits (differences, which span many decades)."""
    return "-" if v is None else f"{v:.4g}"


def _env(v) -> str:
    if isinstance(v, dict):
        return " · ".join(str(x) for x in v.values() if x not in (None, ""))
    return "-" if v in (None, "") else str(v)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _machine(rec: dict) -> str:
    m = rec.get("machine") or {}
    load = rec.get("loadavg_1m_start")
    busy = f" · load avg {load:.1f} at start" if isinstance(load, int | float) else ""
    return f"{m.get('cpu', '?')} ×{m.get('cores', '?')} · {m.get('os', '?')} · {rec.get('runtime_version', '?')}{busy}"


# ---- sections --------------------------------------------------------------------------------------


def front_matter(card: dict) -> list[str]:
    library, _ = TARGETS.get(card["target"], (card["target"], card["target"]))
    tags = ["sam2", "segment-anything", "mask-generation", card["target"], card["precision"], "on-device"]
    return [
        "---",
        f"license: {card.get('license', 'apache-2.0')}",
        f"base_model: {card.get('base_model', 'facebook/sam2.1-hiera-tiny')}",
        "pipeline_tag: mask-generation",
        f"library_name: {library}",
        "tags:",
        *[f"  - {t}" for t in tags],
        "---",
        "",
    ]


def header(card: dict) -> list[str]:
    _, runtime = TARGETS.get(card["target"], (card["target"], card["target"]))
    res, src = card["resolution"], card["source"]
    total = sum(a.get("bytes", 0) for a in card["artifacts"])
    lines = [
        f"# SAM 2.1 Hiera-Tiny — {runtime}, {card['precision']}, {res}×{res}",
        "",
        f"The image path of [SAM 2.1 Hiera-Tiny](https://huggingface.co/{card.get('base_model', '')}) "
        f"(Meta, {card.get('license', '')}) for {runtime}: an image encoder run once per image and a prompt "
        "decoder run per click (points, negative points, a box, a previous mask), checked against the "
        "eager PyTorch model before it was written.",
        "",
    ]
    if src.get("checkpoint") == SYNTHETIC:
        lines += [
            "> **Synthetic weights.** This bundle was exported from sam2edge's deterministic synthetic "
            "checkpoint: its masks are meaningless. It exists to prove the conversion; export with "
            "`--checkpoint sam2.1_hiera_tiny.pt` for a usable model.",
            "",
        ]
    if card["status"] != "shippable":
        lines += [
            f"> **Status: {card['status']}.** This bundle failed a bar at export time (see Fidelity); "
            "it is kept for reference, not for use.",
            "",
        ]
    rows = [
        ["**Task**", "mask-generation (promptable segmentation, image path)"],
        ["**Base model**", card.get("base_model", "-")],
        ["**License**", card.get("license", "-")],
        ["**Runtime**", f"{runtime} (`{card['target']}`)"],
        ["**Precision**", f"{card['precision']} weights"],
        ["**Input**", f"1×3×{res}×{res} float32, ImageNet-normalised RGB"],
        ["**Status**", card["status"]],
        ["**Total size**", f"{total / 1e6:.3f} MB in {len(card['artifacts'])} file(s)"],
    ]
    return lines + _table(["", ""], rows) + [""]


def conversion(card: dict) -> list[str]:
    src = card["source"]
    tools = ", ".join(f"{k} {v}" for k, v in (card.get("tools") or {}).items()) or "-"
    ckpt = src.get("checkpoint", "-")
    rows = [
        ["**Checkpoint**", f"`{ckpt}` ({src.get('format', '-')})"],
        ["**Checkpoint SHA-256**", f"`{src['sha256']}`" if src.get("sha256") else "- (synthetic, generated)"],
        ["**Command**", f"`{card.get('command', '-')}`"],
        ["**Tools**", tools],
        ["**Config**", f"`{card['config']}` at {card['resolution']} px"],
        ["**Created**", card.get("created", "-")],
    ]
    return ["## Conversion", ""] + _table(["", ""], rows) + [""]


def artifacts(card: dict) -> list[str]:
    rows = [
        [f"`{a['file']}`", a.get("role", "-"), f"`{a['sha256']}`", f"{a.get('bytes', 0) / 1e6:.3f}"]
        for a in card["artifacts"]
    ]
    return (
        ["## Artifacts", ""]
        + _table(["File", "Role", "SHA-256", "Size (MB)"], rows)
        + [
            "",
            f"Every file of the bundle, with SHA-256 and size, is in `{MANIFEST}`; "
            f"`sam2edge manifest verify DIR` checks them.",
            "",
        ]
    )


def _io_lines(extra: dict) -> list[str]:
    lines = []
    io = extra.get("io")
    if isinstance(io, dict):
        for f, spec in io.items():
            for kind in ("inputs", "outputs"):
                items = spec.get(kind, []) if isinstance(spec, dict) else []
                desc = ", ".join(f"`{t.get('name')} {t.get('shape')}` {t.get('dtype', '')}".strip() for t in items)
                if desc:
                    lines.append(f"- `{f}` {kind}: {desc}")
    for kind in ("inputs", "outputs"):
        spec = extra.get(kind)
        if isinstance(spec, dict):
            for graph, names in spec.items():
                lines.append(f"- {graph} {kind}: " + ", ".join(f"`{n}`" for n in names))
    for key in ("preprocess", "prompt_layout", "dense_prompt", "point_labels", "dynamic"):
        v = extra.get(key)
        if isinstance(v, str):
            lines.append(f"- {key.replace('_', ' ')}: {v}")
        elif isinstance(v, dict):
            lines.append(f"- {key.replace('_', ' ')}: " + "; ".join(f"{k}: {x}" for k, x in v.items()))
    return lines


def inputs_outputs(card: dict) -> list[str]:
    lines = _io_lines(card.get("extra") or {})
    return ["## Inputs and outputs", "", *lines, ""] if lines else []


def _output_rows(outputs: dict) -> list[list[str]]:
    return [
        [
            f"`{name}`",
            _num(m.get("cosine"), 7),
            _num(m.get("correlation"), 7),
            _sig(m.get("max_abs")),
            _sig(m.get("max_rel")),
        ]
        for name, m in outputs.items()
        if isinstance(m, dict)
    ]


def _e2e_rows(label: str, e: dict) -> list[str]:
    return [
        label,
        _num(e.get("clicks")),
        str(len(e.get("photos", []))),
        _num(e.get("iou_median"), 5),
        _num(e.get("iou_worst"), 5),
        _num(e.get("selection_agreement")),
        _sig(e.get("iou_score_max_abs_diff")),
    ]


def fidelity_section(fid: dict) -> list[str]:
    v = fid.get("verify")
    export_outputs = fid.get("outputs") or fid.get("per_output")
    lines = ["## Fidelity", ""]
    if not v and not export_outputs:
        return lines + ["No fidelity measurement yet: run `sam2edge verify DIR`.", ""]
    if v:
        lines += [
            f"Measured by `{v.get('command', 'sam2edge verify')}` on {v.get('date', '-')} against "
            f"{v.get('reference', 'eager fp32')}. Per output: all samples stacked (encoder: one per photo; "
            "decoder: fed the reference features, every prompt), vs the eager fp32 output.",
            "",
        ]
        lines += _table(["Output", "Cosine", "Correlation", "Max abs", "Max rel"], _output_rows(v["outputs"]))
        lines.append("")
    elif export_outputs:
        lines += [f"Measured at export time against {fid.get('reference', 'eager fp32')} (worst over probes).", ""]
        lines += _table(["Output", "Cosine", "Correlation", "Max abs", "Max rel"], _output_rows(export_outputs))
        lines.append("")
    rows = []
    if isinstance(fid.get("end_to_end"), dict):
        rows.append(_e2e_rows("export", fid["end_to_end"]))
    if v and isinstance(v.get("end_to_end"), dict):
        rows.append(_e2e_rows(f"verify {v.get('date', '')}".strip(), v["end_to_end"]))
    if rows:
        lines += [
            "End to end on real photos (scikit-image samples; points, negative points, boxes), mask IoU at "
            "the reference's chosen candidate:",
            "",
        ]
        lines += _table(
            [
                "Measured at",
                "Clicks",
                "Photos",
                "Mask IoU median",
                "Mask IoU worst",
                "Same candidate",
                "IoU-score max diff",
            ],
            rows,
        )
        lines.append("")
    if v:
        bars = ", ".join(f"{k} {x}" for k, x in v.get("bars", {}).items()) or "none"
        verdict = "**pass**" if v.get("passed") else "**FAIL**: " + "; ".join(v.get("failures", []))
        lines += [f"Bars ({v.get('precision', '')}): {bars} → {verdict}.", ""]
    return lines


def performance(card: dict, bench: list[dict], chart: str | None) -> list[str]:
    lines = ["## Performance", ""]
    if not bench:
        return lines + ["No benchmark data yet (`sam2edge bench DIR`).", ""]
    ups = {(r["session"], r["resolution"]): r for r in bench if r["runtime"] == "upstream-eager"}
    lines += [
        "Measured by `sam2edge bench` (CPU; encoder = one image, decoder = per click, first click = encoder + "
        "first decoder; medians over the timed runs, interleaved with upstream eager in the same session). "
        "Rows are conditional on their environment.",
        "",
    ]
    if chart:
        lines += [f"![Latency p50 per runtime]({chart})", ""]
    rows = []
    for r in bench:
        up = ups.get((r["session"], r["resolution"]))
        vs = "-" if up is None or r is up else f"{r['first_click_ms']['median'] / up['first_click_ms']['median']:.2f}×"
        rows.append(
            [
                r["subject"],
                str(r["threads"]),
                _num(r["load_s"], 2),
                _num(r["encoder_ms"]["median"], 1),
                _num(r["decoder_ms"]["median"], 2),
                _num(r["first_click_ms"]["median"], 1),
                _num(r["peak_rss_mb"], 0),
                vs,
                _machine(r),
                r["date"],
                r["provenance"],
            ]
        )
    lines += _table(
        [
            "Runtime",
            "Threads",
            "Load (s)",
            "Encoder p50 (ms)",
            "Decoder p50 (ms)",
            "First click p50 (ms)",
            "Peak RSS (MB)",
            "First click vs upstream eager",
            "Environment",
            "Date",
            "Provenance",
        ],
        rows,
    )
    return lines + [""]


def gpu_delegate(fid: dict) -> list[str]:
    """LiteRT's GPU delegate on a software GPU (``checks.gpu_delegate`` of fidelity.json), when recorded."""
    rec = (fid.get("checks") or {}).get("gpu_delegate")
    if not rec:
        return []
    lines = [
        "## GPU delegate (software GPU)",
        "",
        f"LiteRT's GPU delegate (ML Drift over WebGPU/Vulkan) on {_env(rec.get('environment'))}, run at export "
        "by `sam2edge gpu-check`; GPU vs CPU (XNNPACK) on the same inputs. A software GPU computes in fp32 and "
        "has its own limits: a pass here does not clear a phone GPU.",
        "",
    ]
    rows = []
    for name, f in rec.get("files", {}).items():
        outs = f.get("outputs") or {}
        cos = min((m["cosine"] for m in outs.values()), default=None)
        mi = f.get("mask_iou") or {}
        segs = f.get("segments") or []
        how = f"GPU run in {len(segs)} chained pieces" if segs else ("whole graph" if outs else "-")
        rows.append(
            [
                f"`{name}`",
                f.get("verdict", "-"),
                f"{f.get('ops_gpu', '-')}/{f.get('ops_total', '-')}",
                str(f.get("partitions", "-")),
                _num(cos, 7),
                _num(mi.get("iou_worst"), 5),
                how,
            ]
        )
    lines += _table(
        ["File", "Verdict", "Ops on GPU", "Partitions", "Cosine (worst output)", "Mask IoU worst", "Numerics from"],
        rows,
    )
    return lines + [""]


def browser(sweep: list[tuple[str, dict]]) -> list[str]:
    if not sweep:
        return []
    lines = [
        "## Browser (LiteRT.js)",
        "",
        "Model-level sweep results: measured behaviour of these exact files in a browser runtime, only "
        "meaningful together with the environment that produced them. Full records: "
        + ", ".join(f"`{p}`" for p, _ in sweep)
        + ".",
        "",
    ]
    rows = []
    for _, rec in sweep:  # one record per model file, one result row per backend (``sam2edge sweep``)
        env = rec.get("environment") or {}
        env_text = env.get("label") if isinstance(env, dict) and env.get("label") else _env(env)
        for r in rec.get("results", []):
            full = r.get("full_delegation")
            deleg = "-" if full is None else ("full" if full else "partial")
            rows.append(
                [
                    f"`{rec.get('file', '-')}`",
                    str(r.get("backend", "-")),
                    str(r.get("status", "-")),
                    deleg,
                    _sig(r.get("max_rel_diff")),
                    _num(r.get("latency_p50_ms"), 2),
                    env_text,
                    str(rec.get("date", "-")),
                    str(rec.get("provenance", "-")),
                ]
            )
    return (
        lines
        + _table(
            [
                "Model",
                "Backend",
                "Status",
                "Delegation",
                "Max rel diff",
                "Latency p50 (ms)",
                "Environment",
                "Date",
                "Provenance",
            ],
            rows,
        )
        + [""]
    )


def pitfalls(card: dict, fid: dict) -> list[str]:
    items = [str(p) for p in card.get("pitfalls", [])] + [str(p) for p in (card.get("extra") or {}).get("pitfalls", [])]
    if card["source"].get("checkpoint") == SYNTHETIC:
        items.append("Exported from the synthetic checkpoint: numbers prove the conversion, masks mean nothing.")
    lint = (card.get("extra") or {}).get("lint")
    if isinstance(lint, dict):
        items += [f"`{f}` lint: {x['verdict']}" for f, x in lint.items() if isinstance(x, dict) and x.get("verdict")]
    items += [f"Failed bar at export: {f}" for f in fid.get("failures", [])]
    gpu = ((fid.get("checks") or {}).get("gpu_delegate") or {}).get("files", {})
    items += [
        f"`{f}` on the software GPU: {r['verdict']}: {'; '.join(r.get('failures') or [])[:300]}"
        for f, r in gpu.items()
        if r.get("verdict") != "resident"
    ]
    return ["## Pitfalls", "", *[f"- {i}" for i in items], ""] if items else []


def render_markdown(card: dict, fid: dict, bench: list[dict], sweep: list[tuple[str, dict]], chart: str | None) -> str:
    """The card text; ``bench``: records (this bundle's + their sessions' upstream), ``sweep``: (path, record)."""
    parts = (
        front_matter(card)
        + header(card)
        + conversion(card)
        + artifacts(card)
        + inputs_outputs(card)
        + fidelity_section(fid)
        + gpu_delegate(fid)
        + performance(card, bench, chart)
        + browser(sweep)
        + pitfalls(card, fid)
    )
    parts += [
        "---",
        "",
        f"_Rendered by `sam2edge card render` from `{CARD}`, `{FIDELITY}` and the measured "
        "records (the sources of truth); edit the inputs, not this file._",
        "",
    ]
    return "\n".join(parts)


def render_bundle(folder: str | Path, search: list[Path] | None = None) -> dict:
    """Render README.md (+ latency.png) into ``folder``; -> {readme, chart, bench, sweep}.

    The bundle's files are checked against manifest.json first (a modified model file is refused, nothing
    written); card.json and manifest.json are rewritten together, last, after everything else succeeded."""
    folder = Path(folder)
    card = load_card(folder)
    require_intact(folder, "rendering the card")
    fid = read_fidelity(folder, card)
    found = find_bench_records(folder, card, list(search or []))
    bench = [rec for _, rec in found]
    sweep = [(p.relative_to(folder).as_posix(), r) for p, r in find_sweep_records(folder)]
    bench_paths = [(folder / RECORDS_DIR / rec["date"] / src.name) for src, rec in found]
    records = {"bench": [p.relative_to(folder).as_posix() for p in bench_paths], "sweep": [p for p, _ in sweep]}
    card["records"], card["fidelity"] = records, fid
    chart = CHART if bench else None
    text = render_markdown(card, fid, bench, sweep, chart)
    for (src, rec), dst in zip(found, bench_paths):
        if src.resolve() != dst.resolve():
            dst.parent.mkdir(parents=True, exist_ok=True)
            write_json(dst, rec)
    if bench:
        with atomic_path(folder / CHART) as tmp:
            latency_chart(bench, tmp)
    with atomic_path(folder / README) as tmp:
        tmp.write_text(text)
    rewrite_metadata(folder, card, checked=True)
    return {"readme": folder / README, "chart": chart, "bench": len(bench), "sweep": len(sweep)}
