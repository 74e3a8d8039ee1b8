"""The browser tests' shared pieces: opening the serve page, replaying a page's prompt on the Python predictor,
a site with one model file damaged."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np


def open_ready_page(browser, url: str, viewport: dict, timeout_ms: int):
    """A new page at ``url``, console and page errors collected, once the app says it is ready -> (page, logs)."""
    page = browser.new_page(viewport=viewport)
    logs: list[str] = []
    page.on("console", lambda m: logs.append(m.text))
    page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=timeout_ms)
    return page, logs


def add_page_prompt(pred, state, call: dict) -> tuple[int, np.ndarray]:
    """One prompt the page sent (its ``calls`` entry: frame, obj, points, labels, box, clear) on the Python
    ``Sam2VideoPredictor`` -> (frame, (objects, H, W) bool masks)."""
    f, _, masks = pred.add_new_points_or_box(
        state,
        call["frame"],
        call["obj"],
        points=None if call["points"] is None else np.array(call["points"], np.float32),
        labels=None if call["labels"] is None else np.array(call["labels"], np.int32),
        box=None if call["box"] is None else np.array(call["box"], np.float32),
        clear_old_points=call["clear"],
    )
    return f, (masks[:, 0] > 0).numpy()


def tampered_copy(site: Path, out: Path, model_file: str) -> Path:
    """A copy of ``site`` at ``out`` with one byte of ``model/<model_file>`` flipped (its SHA-256 no longer matches)."""
    shutil.copytree(site, out)
    path = out / "model" / model_file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return out
