"""Model card sections from measurements: fidelity, GPU delegate, performance, browser, pitfalls."""

from __future__ import annotations

from sam2edge.cards.evidence import SYNTHETIC
from sam2edge.cards.sections import _env, _machine, _num, _sig, _table


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
    if rec.get("skipped"):
        return ["## GPU delegate (software GPU)", "", f"The GPU delegate check was {rec.get('reason', 'not run')}.", ""]
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
