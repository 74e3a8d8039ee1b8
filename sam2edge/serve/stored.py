"""``serve --embeddings STORE``: open photos from a store written by ``sam2edge embed``, no encoder run.

The store's index names each photo's file; the photo is read from there (its SHA-256 must still match
the stored one) for display, and the stored tensors are sent to the page exactly as freshly encoded
features would be (``features.bin``), so the browser decoder path is the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sam2edge.errors import UserError
from sam2edge.runtime.backends import Backend, Features
from sam2edge.runtime.embeddings import (
    EmbeddingError,
    describe_model,
    embedding_path,
    model_identity,
    read_index_rows,
    read_stored,
    sha256_hex,
)
from sam2edge.runtime.preprocess import load_image
from sam2edge.serve.web import HttpError

MAX_LISTED = 1000  # names sent to the page in /api/info


class StoredImages:
    """The embedded images of one store, for one server model (checked against the store's model)."""

    def __init__(self, store: str | Path, backend: Backend, provenance: dict) -> None:
        try:
            import pyarrow.parquet  # noqa: F401  (read_index_rows reads the index with it)
        except ImportError:
            raise UserError("serve --embeddings needs pyarrow; pip install 'sam2edge[distributed]'") from None

        self.store = Path(store)
        rows = read_index_rows(self.store)  # EmbeddingError (one line) when damaged
        if rows is None:
            raise UserError(f"{store} has no index.parquet; pass a store written by `sam2edge embed`")
        ok = ("embedded", "skipped", "re-embedded")
        self.images = {n: r["image"] for n, r in rows.items() if r.get("status") in ok and r.get("image")}
        for name in sorted(self.images):  # a cut or missing file is refused before serving (size: a stat)
            path, want = embedding_path(self.store, name), rows[name].get("file_bytes")
            size = path.stat().st_size if path.is_file() else None
            if size is None or (want is not None and size != want):
                raise UserError(
                    f"{path} is {'missing' if size is None else f'{size} bytes, the index says {want}'}; "
                    "run `sam2edge embed` on the same images and --out to repair the store"
                )
        self.identity = model_identity(provenance, backend.cfg, backend.name)
        if self.images:
            first = read_stored(self.store, next(iter(sorted(self.images)))).meta.get("model")
            if first != self.identity:
                raise UserError(
                    f"{store} holds embeddings of {describe_model(first or {})}, but the server runs "
                    f"{describe_model(self.identity)}; serve with the same --model/--checkpoint/--config"
                )

    def names(self) -> list[str]:
        return sorted(self.images)[:MAX_LISTED]

    def load(self, name: str) -> tuple[np.ndarray, Features]:
        """-> (photo HxWx3 uint8, stored features) or HttpError (404 unknown name, 409 changed photo)."""
        if name not in self.images:
            raise HttpError(404, f"no stored image {name[:60]!r} in the store; pick one from the list")
        path = Path(self.images[name])
        try:
            stored = read_stored(self.store, name)
            data = path.read_bytes()
        except (EmbeddingError, OSError) as e:
            raise HttpError(404, f"stored image {name[:60]!r} cannot be opened ({str(e)[:120]})") from None
        if stored.meta.get("model") != self.identity:
            raise HttpError(409, f"{name[:60]!r} was embedded by another model; embed it again")
        if sha256_hex(data) != stored.meta.get("image_sha256"):
            raise HttpError(409, f"the photo {path.name[:60]} changed since it was embedded; embed it again")
        return load_image(path), stored.features
