"""Model card sections about the bundle itself: front matter, header, conversion, artifacts, I/O; and the
table / number formatting every section uses."""

from __future__ import annotations

from sam2edge.bundle import MANIFEST
from sam2edge.cards.evidence import SYNTHETIC, TARGETS
from sam2edge.checks.bench.records import cpu_name


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
    return f"{cpu_name(m)} ×{m.get('cores', '?')} · {m.get('os', '?')} · {rec.get('runtime_version', '?')}{busy}"


# card.json model_id -> (name in the card, citation); any other id keeps the SAM 2.1 wording
MODEL_NAMES: dict[str, tuple[str, str | None]] = {
    "edgetam": (
        "EdgeTAM",
        'Zhou et al., "EdgeTAM: On-Device Track Anything Model", CVPR 2025',
    ),
}


def front_matter(card: dict) -> list[str]:
    library, _ = TARGETS.get(card["target"], (card["target"], card["target"]))
    tags = ["sam2", "segment-anything", "mask-generation", card["target"], card["precision"], "on-device"]
    if card.get("model_id") in MODEL_NAMES:  # the model family's own tag (e.g. edgetam)
        tags.insert(1, card["model_id"])
    if (card.get("extra") or {}).get("video"):
        tags.append("video-object-tracking")
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
    name, citation = MODEL_NAMES.get(card.get("model_id", ""), ("SAM 2.1 Hiera-Tiny", None))
    lines = [
        f"# {name} — {runtime}, {card['precision']}, {res}×{res}",
        "",
        f"The image path of [{name}](https://huggingface.co/{card.get('base_model', '')}) "
        f"(Meta, {card.get('license', '')}) for {runtime}: an image encoder run once per image and a prompt "
        "decoder run per click (points, negative points, a box, a previous mask), checked against the "
        "eager PyTorch model before it was written."
        + (
            " With the tracking graphs (memory attention, memory encoder, video decoder; see Video) checked the same"
            " way over a clip."
            if (card.get("extra") or {}).get("video")
            else ""
        ),
        "",
    ]
    if citation:
        lines += [f"Cite: {citation}.", ""]
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
