"""Measured tables as documents: ``benchmarks/records/*.json`` -> ``docs/benchmarks.md`` + a latency chart (PNG).

A published record is one measurement run, kept in the repository with everything needed to trust and redo it::

    {
      "schema": "sam2edge.table/1",
      "id": "targets-tiny-1024",            # unique; the README's tables name records by it
      "title": "Every target against upstream eager",
      "date": "2026-12-01",                 # when it was measured
      "command": "python benchmarks/bench_targets.py ...",
      "machine": {"cpu": "AMD EPYC", "cores": 2, "vector_extensions": ["avx512f", ...]},
      "sam2edge": {"version": "0.1.0", "commit": "539d94b"},
      "columns": [["subject", "bundle"], ["encoder_ms", "encoder p50 (ms)"], ...],   # [key, header]
      "rows": [{"subject": "LiteRT fp32", "encoder_ms": 1795, ...}, ...],
      "notes": ["one line each", ...],      # optional: how to read it
      "chart": {"label": "subject", "value": "encoder_ms", "title": "..."}   # optional: a bar chart of one column
    }

The renderer never computes a figure: every cell is the record's value, printed as it is (numbers with their
recorded precision), so a table can be checked against its record. Same records -> same bytes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from sam2edge.checks.bench.records import cpu_name

SCHEMA = "sam2edge.table/1"
REQUIRED = {"id": str, "title": str, "date": str, "command": str, "machine": dict, "columns": list, "rows": list}


class RecordError(ValueError):
    """A record that is not a ``sam2edge.table/1`` record (named, with the field at fault)."""


def read_record(path: str | Path) -> dict:
    """Parse and check one record file; RecordError naming the file and the field otherwise."""
    path = Path(path)
    try:
        rec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable JSON record ({e})") from None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        raise RecordError(f"{path}: not a {SCHEMA} record (field 'schema')")
    for key, typ in REQUIRED.items():
        if not isinstance(rec.get(key), typ):
            raise RecordError(f"{path}: field {key!r} must be a {typ.__name__}")
    for col in rec["columns"]:
        if not (isinstance(col, list) and len(col) == 2 and all(isinstance(c, str) for c in col)):
            raise RecordError(f"{path}: each of 'columns' must be [key, header]")
    keys = {c[0] for c in rec["columns"]}
    for i, row in enumerate(rec["rows"]):
        if not isinstance(row, dict) or not set(row) <= keys:
            raise RecordError(f"{path}: row {i} must be an object with keys among the columns {sorted(keys)}")
    return rec


def cell(value) -> str:
    """A record value as a table cell: as recorded (a float keeps its digits), '' for a missing one."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 100:
        return str(int(value))
    return str(value).replace("|", "\\|")


def table(rec: dict) -> list[str]:
    """The record's rows as a Markdown table, columns in the record's order."""
    keys = [k for k, _ in rec["columns"]]
    lines = ["| " + " | ".join(h for _, h in rec["columns"]) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(row.get(k)) for k in keys) + " |" for row in rec["rows"]]
    return lines


def _machine(m: dict) -> str:
    ext = ", ".join(m.get("vector_extensions") or []) or "not recorded"
    return f"{cpu_name(m)}, {m.get('cores', '?')} cores (vector extensions: {ext})"


def section(rec: dict, chart: str | None = None) -> list[str]:
    """One record as a document section: title, provenance, table, notes, chart."""
    sam = rec.get("sam2edge") or {}
    version = " ".join(f"{k} {v}" for k, v in sam.items()) or "not recorded"
    out = [f"## {rec['title']}", ""]
    out += [f"- measured {rec['date']} on {_machine(rec['machine'])}; sam2edge {version}", f"- `{rec['command']}`", ""]
    out += table(rec)
    notes = rec.get("notes") or []
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    if chart:
        out += ["", f"![{rec['title']}]({chart})"]
    return out + [""]


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: bitmap font only
        return ImageFont.load_default()


def bar_chart(rec: dict) -> bytes:
    """A horizontal bar chart (PNG bytes) of the record's ``chart`` column, one bar per row with a number."""
    spec = rec["chart"]
    rows = [r for r in rec["rows"] if isinstance(r.get(spec["value"]), int | float)]
    width, row_h, top, left, pad = 1000, 30, 56, 330, 16
    img = Image.new("RGB", (width, top + row_h * len(rows) + 24), "white")
    d = ImageDraw.Draw(img)
    d.text((pad, 14), spec.get("title", rec["title"]), fill="black", font=_font(16))
    top_value = max((float(r[spec["value"]]) for r in rows), default=1.0) or 1.0
    span = width - left - 2 * pad - 80
    for i, r in enumerate(rows):
        y, length = top + i * row_h, max(1, int(span * float(r[spec["value"]]) / top_value))
        d.text((pad, y + 6), str(r.get(spec["label"], ""))[:44], fill="black", font=_font(13))
        d.rectangle((left, y + 4, left + length, y + row_h - 6), fill=(49, 112, 196))
        d.text((left + length + 6, y + 6), cell(r[spec["value"]]), fill="black", font=_font(13))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


HEADER = "Generated by `sam2edge report` from the records in `benchmarks/records/`"


def render(records: list[dict], stem: str = "benchmarks", title: str = "Benchmarks") -> dict[str, bytes]:
    """The document ``<stem>.md`` (every record as a section, in the given order) and one chart
    ``<stem>-<id>.png`` per record that asks for one: file name -> contents."""
    files: dict[str, bytes] = {}
    lines = [f"# {title}", "", f"{HEADER}: edit or add a record and render again, never the tables.", ""]
    seen: set[str] = set()
    for rec in records:
        if rec["id"] in seen:
            raise RecordError(f"two records share the id {rec['id']!r}")
        seen.add(rec["id"])
        chart = None
        if rec.get("chart"):
            chart = f"{stem}-{rec['id']}.png"
            files[chart] = bar_chart(rec)
        lines += section(rec, chart)
    files[f"{stem}.md"] = ("\n".join(lines).rstrip() + "\n").encode()
    return files
