"""GPU-check results reused for an unchanged graph: one JSON per (graph SHA-256, LiteRT version, bars).

The software-GPU check of a full-size graph takes minutes; re-exporting the same weights at the same
precision writes byte-identical graphs (``test_evidence::test_reexport_is_byte_identical``), so the
result of a graph already checked on this machine is read back instead of run again. Folder:
``$SAM2EDGE_GPU_CHECK_CACHE``, else ``~/.cache/sam2edge/gpu-check``; set the variable to ``off`` to
disable. An entry is written only after a check finished, atomically; a corrupt entry is ignored.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

from sam2edge.io import atomic_path

CACHE_ENV = "SAM2EDGE_GPU_CHECK_CACHE"


def cache_dir() -> Path | None:
    v = os.environ.get(CACHE_ENV, "").strip()
    if v.lower() == "off":
        return None
    return Path(v) if v else Path.home() / ".cache" / "sam2edge" / "gpu-check"


def cache_key(path: Path, bars: dict) -> str:
    """SHA-256 of the graph file, of the LiteRT version and of the bars the verdict was judged by."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(importlib.metadata.version("ai-edge-litert").encode())
    h.update(json.dumps(bars, sort_keys=True).encode())
    return h.hexdigest()


def load(key: str) -> dict | None:
    folder = cache_dir()
    p = None if folder is None else folder / f"{key}.json"
    if p is None or not p.is_file():
        return None
    try:
        entry = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and {"summary", "device"} <= set(entry) else None


def store(key: str, summary: dict, device: str) -> None:
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / f"{key}.json") as tmp:
            Path(tmp).write_text(json.dumps({"summary": summary, "device": device}, sort_keys=True))
    except OSError:
        pass  # a read-only home: the check still ran, it is just not remembered
