"""``sam2edge embed``, local loop: image bytes -> one stored embedding per image, plus the index.

The unit of work is ``EmbedWorker.process(name, path, data)``: hash the bytes, skip when the store
already holds this image (same bytes, same model), else decode, encode and write ``<name>.safetensors``
atomically. The Ray job (``ray_job.py``) runs the very same worker in its actors, so both write the same
bytes. Nothing here is fatal per image: a bad file becomes an ``error`` row.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from sam2edge import __version__
from sam2edge.embed.store import open_store, prepare_index, write_index
from sam2edge.errors import UserError
from sam2edge.runtime.embeddings import (
    EmbeddingError,
    embedding_bytes,
    embedding_path,
    file_record,
    read_embedding,
    read_index_rows,
    read_meta,
    sha256_hex,
    write_embedding,
)
from sam2edge.runtime.preprocess import MAX_PIXELS, preprocess, to_rgb_array

# row status -> meaning (the index's ``status`` column)
STATUSES = {
    "embedded": "encoded now and written",
    "skipped": "already in the store with the same image bytes and model",
    "error": "could not be read or decoded; ``error`` says why",
    "re-embedded": "in the store but damaged (size, SHA-256, shapes or NaN); encoded again, ``error`` says why",
}
RowCallback = Callable[[dict], None]


def load_predictor(model: str | None, checkpoint: str | None, config: str | None):
    """The predictor a job runs: a bundle (``model``) or eager weights (``checkpoint``, None = synthetic;
    ``config`` None: the model the checkpoint's tensors name)."""
    from sam2edge.config import CONFIGS
    from sam2edge.runtime.predictor import Sam2Predictor

    if model and checkpoint:
        raise UserError("give --model DIR or --checkpoint FILE, not both (a bundle carries its own weights)")
    if model:
        return Sam2Predictor.from_export(model)
    if config is not None and config not in CONFIGS:
        raise UserError(f"unknown --config {config!r}; choose one of {sorted(CONFIGS)}")
    return Sam2Predictor.from_checkpoint(checkpoint, CONFIGS[config] if config else None, quiet=True)


def decode_image(data: bytes) -> np.ndarray:
    """Image file bytes -> HxWx3 uint8 RGB (EXIF orientation applied), or ValueError with a short reason."""
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return to_rgb_array(im)
    except UnidentifiedImageError:
        raise ValueError("not an image file (PNG/JPEG/WebP/BMP/GIF/TIFF) that PIL can read") from None
    except (OSError, SyntaxError, Image.DecompressionBombError, ValueError) as e:
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise ValueError(f"cannot decode image: {reason} (truncated or corrupt file?)") from None


class EmbedWorker:
    """One loaded model writing into one store; ``process`` is the per-image step of every job."""

    def __init__(self, predictor, store: str | Path) -> None:
        self.predictor, self.store = predictor, Path(store)
        self.identity = predictor.model_identity()
        self.index = read_index_rows(self.store) or {}  # checked (or rebuilt) by the job before any work

    def _existing(self, name: str, out: Path, sha: str) -> tuple[bool, str]:
        """-> (reusable, damage): the stored file passes every check of ``read_embedding`` against its
        index row and holds this image and model; ``damage`` says why a file that is there cannot be used."""
        if not out.is_file():
            return False, ""
        try:
            meta = read_embedding(out, self.index.get(name)).meta
        except EmbeddingError as e:
            return False, str(e).split(";")[0].replace(str(out), out.name)
        return meta.get("image_sha256") == sha and meta.get("model") == self.identity, ""

    def process(self, name: str, path: str, data: bytes | None, read_error: str = "") -> dict:
        """-> index row {name, image, sha256, status, error, height, width, seconds}."""
        t0 = time.perf_counter()
        row = {"name": name, "image": path, "sha256": "", "status": "error", "error": read_error, "height": 0}
        row["width"] = 0
        if data is not None:
            row["sha256"] = sha = sha256_hex(data)
            out = embedding_path(self.store, name)
            try:
                done, damage = self._existing(name, out, sha)
                if done:
                    row.update(status="skipped", **self._size(out), **file_record(out.read_bytes()))
                else:
                    rgb = decode_image(data)
                    feats = self.predictor.backend.encode(preprocess(rgb, self.predictor.cfg.image_size).numpy())
                    meta = {"image_sha256": sha, "original_size": list(rgb.shape[:2])}
                    meta.update(model=self.identity, sam2edge=__version__)
                    blob = embedding_bytes(feats, meta)
                    write_embedding(out, blob)
                    row.update(status="re-embedded" if damage else "embedded", error=damage, **file_record(blob))
                    row.update(height=int(rgb.shape[0]), width=int(rgb.shape[1]))
            except ValueError as e:
                row["error"] = str(e)
        row["seconds"] = time.perf_counter() - t0
        return row

    @staticmethod
    def _size(out: Path) -> dict:
        h, w = read_meta(out)["original_size"]
        return {"height": int(h), "width": int(w)}


def read_bytes(path: Path) -> tuple[bytes | None, str]:
    """-> (bytes, "") or (None, one-line reason) for a file that cannot be read."""
    try:
        return path.read_bytes(), ""
    except OSError as e:
        return None, f"cannot read file: {e.strerror or type(e).__name__}"


def run_local(
    images: list[tuple[str, Path]],
    store: str | Path,
    model: str | None = None,
    checkpoint: str | None = None,
    config: str | None = None,
    threads: int = 1,
    on_row: RowCallback | None = None,
    progress: bool = True,
) -> list[dict]:
    """Embed ``images`` ((name, path) pairs, from ``list_images``) into ``store`` in this process, with
    ``threads`` torch threads (fp32 results change in the last bits with the thread count: a Ray run
    writes the same bytes when its ``cpus_per_actor`` equals ``threads``).

    The index is written even when the run stops early (an exception from ``on_row``, Ctrl+C), so a
    rerun skips what is done. -> the index rows of this run, in input order."""
    import torch

    if threads < 1:
        raise UserError(f"--threads {threads} must be at least 1")
    predictor = load_predictor(model, checkpoint, config)
    store = open_store(store, predictor.model_identity())
    note = prepare_index(store)
    if note:
        print(f"note: {note}", file=sys.stderr)
    worker = EmbedWorker(predictor, store)
    rows: list[dict] = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, path in _progress(images, progress):
            data, err = read_bytes(path)
            rows.append(worker.process(name, str(path), data, err))
            if on_row is not None:
                on_row(rows[-1])
    finally:
        torch.set_num_threads(before)
        write_index(store, rows)
    return rows


def _progress(items: list, enabled: bool) -> Iterable:
    from tqdm import tqdm

    return tqdm(items, desc="embed", unit="img", disable=not enabled, dynamic_ncols=True)


def summarize(rows: list[dict]) -> str:
    """One line: counts per status and the first error."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    line = ", ".join(f"{n} {s}" for s, n in counts.items())
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        line += f" (first error: {errors[0]['image']}: {errors[0]['error']})"
    redone = [r for r in rows if r["status"] == "re-embedded"]
    if redone:
        line += f" (re-embedded damaged: {', '.join(r['name'] for r in redone[:10])}: {redone[0]['error']})"
    return f"{len(rows)} images: {line}"
