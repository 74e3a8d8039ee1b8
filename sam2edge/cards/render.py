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

from pathlib import Path

from sam2edge.bundle import CARD, FIDELITY, load_card, require_intact, rewrite_metadata, write_json
from sam2edge.cards.chart import latency_chart
from sam2edge.cards.evidence import CHART, README, RECORDS_DIR, find_bench_records, find_sweep_records, read_fidelity
from sam2edge.cards.measured import browser, fidelity_section, gpu_delegate, performance, pitfalls
from sam2edge.cards.precision import precision_section
from sam2edge.cards.sections import artifacts, conversion, front_matter, header, inputs_outputs
from sam2edge.cards.video import video_section
from sam2edge.errors import UserError
from sam2edge.io import atomic_path


def render_markdown(card: dict, fid: dict, bench: list[dict], sweep: list[tuple[str, dict]], chart: str | None) -> str:
    """The card text; ``bench``: records (this bundle's + their sessions' upstream), ``sweep``: (path, record)."""
    parts = (
        front_matter(card)
        + header(card)
        + conversion(card)
        + artifacts(card)
        + inputs_outputs(card)
        + fidelity_section(fid)
        + precision_section(card, fid)
        + gpu_delegate(fid)
        + video_section(card, fid)
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
    try:  # before anything is written: a field of the wrong type is one line, the bundle untouched
        fid, found, sweep, text = _gather(folder, card, search)
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(
            f"{folder}/{CARD} or {FIDELITY} holds a field of the wrong type or shape ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120] if str(e) else 'no detail'}); regenerate them with `sam2edge export` "
            "and `sam2edge verify`"
        ) from None
    bench = [rec for _, rec in found]
    bench_paths = [(folder / RECORDS_DIR / rec["date"] / src.name) for src, rec in found]
    chart = CHART if bench else None
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


def _gather(folder: Path, card: dict, search: list[Path] | None) -> tuple[dict, list, list, str]:
    """fidelity, bench records (path, record), sweep records and the card text; sets card ``records`` and
    ``fidelity``. Raises what a field of the wrong type raises (the caller turns it into one line)."""
    fid = read_fidelity(folder, card)
    found = find_bench_records(folder, card, list(search or []))
    bench = [rec for _, rec in found]
    sweep = [(p.relative_to(folder).as_posix(), r) for p, r in find_sweep_records(folder)]
    bench_paths = [(folder / RECORDS_DIR / rec["date"] / src.name) for src, rec in found]
    records = {"bench": [p.relative_to(folder).as_posix() for p in bench_paths], "sweep": [p for p, _ in sweep]}
    card["records"], card["fidelity"] = records, fid
    text = render_markdown(card, fid, bench, sweep, CHART if bench else None)
    return fid, found, sweep, text
