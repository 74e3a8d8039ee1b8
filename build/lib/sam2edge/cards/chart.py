"""Latency chart (PNG, drawn with PIL) from bench records: one row per record, two panels.

Left panel: encoder latency per image; right panel: decoder latency per click. Each bar is the
median with a min-max whisker; each panel has its own linear scale starting at 0. Same records
-> same bytes (no timestamps in the image).
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

WIDTH, ROW, TOP, LEFT, GAP, PAD = 1100, 34, 64, 300, 40, 16
COLORS = {"upstream-eager": (150, 150, 150)}
DEFAULT_COLOR = (49, 112, 196)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: bitmap font only
        return ImageFont.load_default()


def _label(rec: dict) -> str:
    return f"{rec['subject']} · {rec['threads']} thr · {rec['date']}"


def latency_chart(records: list[dict], out: str | Path) -> None:
    """Write the chart of ``records`` (bench records) to ``out`` as PNG."""
    font, small, title = _font(14), _font(12), _font(16)
    panel = (WIDTH - LEFT - 2 * PAD - GAP) // 2
    height = TOP + ROW * len(records) + 40
    img = Image.new("RGB", (WIDTH, height), "white")
    d = ImageDraw.Draw(img)
    d.text(
        (PAD, 12), "Latency p50 (bar) and min-max (whisker), ms - from sam2edge bench records", fill="black", font=title
    )
    panels = (("encoder_ms", "encoder, per image", LEFT), ("decoder_ms", "decoder, per click", LEFT + panel + GAP))
    for key, name, x0 in panels:
        top = max(r[key]["max"] for r in records) or 1.0
        d.text((x0, 38), f"{name} (axis 0-{top:.4g} ms)", fill="black", font=font)
        d.line([(x0, TOP - 4), (x0, TOP + ROW * len(records))], fill=(0, 0, 0), width=1)
        for i, r in enumerate(records):
            y = TOP + i * ROW
            s = r[key]
            color = COLORS.get(r["runtime"], DEFAULT_COLOR)
            w = int(panel * 0.85 * s["median"] / top)
            d.rectangle([x0, y + 6, x0 + max(w, 1), y + ROW - 8], fill=color)
            lo, hi = x0 + int(panel * 0.85 * s["min"] / top), x0 + int(panel * 0.85 * s["max"] / top)
            mid = y + ROW // 2 - 1
            d.line([(lo, mid), (hi, mid)], fill="black", width=1)
            d.line([(lo, mid - 4), (lo, mid + 4)], fill="black", width=1)
            d.line([(hi, mid - 4), (hi, mid + 4)], fill="black", width=1)
            d.text((hi + 6, y + 9), f"{s['median']:.4g}", fill="black", font=small)
    for i, r in enumerate(records):
        d.text((PAD, TOP + i * ROW + 9), _label(r)[:44], fill="black", font=small)
    img.save(out, format="PNG", optimize=False)
