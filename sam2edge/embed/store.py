"""The embedding store folder: input listing, the store marker, and the Parquet index.

STORE/
  sam2edge-store.json    marker: {"format", "model"}; a folder without it is never written into
  <name>.safetensors     one stored embedding per image (``sam2edge.runtime.embeddings``)
  index.parquet          one row per image: name, image, sha256, status, error, height, width, seconds,
                         file_bytes, file_sha256 (the embedding file's size and SHA-256, checked on read)
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from sam2edge.errors import UserError
from sam2edge.io import atomic_path
from sam2edge.runtime.embeddings import (
    SUFFIX,
    EmbeddingError,
    describe_model,
    file_record,
    read_embedding,
    read_index_rows,
)

MARKER = "sam2edge-store.json"
INDEX = "index.parquet"
STORE_FORMAT = "sam2edge-embedding-store/1"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
TIMING_COLUMNS = ("seconds",)  # the only index columns that differ between two runs of the same job
# index column -> pyarrow type name
INDEX_SCHEMA = {
    "name": "string",
    "image": "string",
    "sha256": "string",
    "status": "string",
    "error": "string",
    "height": "int32",
    "width": "int32",
    "seconds": "float64",
    "file_bytes": "int64",  # size of <name>.safetensors as written (checked when the file is read)
    "file_sha256": "string",  # SHA-256 of <name>.safetensors as written (checked when the file is read)
}


def list_images(spec: str) -> list[tuple[str, Path]]:
    """IMAGES -> sorted (name, absolute path) pairs. ``spec``: a folder (its image files, not recursive),
    a glob (``photos/*.jpg``), one image file, or a list file (one path per line, relative paths from
    the list's folder). ``name`` is the file stem; two images with one stem are refused."""
    p = Path(spec)
    if any(c in spec for c in "*?["):
        paths = [Path(s) for s in glob.glob(spec, recursive=True) if Path(s).is_file()]
    elif p.is_dir():
        paths = [c for c in p.iterdir() if c.is_file() and c.suffix.lower() in IMAGE_SUFFIXES]
    elif p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES:
        paths = [p]
    elif p.is_file():
        lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines()]
        paths = [(p.parent / ln) for ln in lines if ln and not ln.startswith("#")]
    else:
        raise UserError(f"{spec} does not exist; pass a folder of photos, a glob or a list file")
    if not paths:
        raise UserError(f"no images found in {spec}; pass a folder of .png/.jpg files, a glob or a list file")
    pairs = sorted((q.stem, q.absolute()) for q in paths)
    for (a, pa), (b, pb) in zip(pairs, pairs[1:]):
        if a == b:
            raise UserError(f"{pa} and {pb} share the name {a!r} (one file per stem); rename one of them")
    return pairs


def open_store(out: str | Path, identity: dict) -> Path:
    """Create STORE (new or empty folder) or reopen one written for the same model; refuse anything else."""
    out = Path(out)
    marker = out / MARKER
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a new folder for the embedding store")
    if marker.is_file():
        try:
            theirs = json.loads(marker.read_text())["model"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{marker} is malformed; pass a new --out folder") from None
        if theirs != identity:
            raise UserError(
                f"store {out} holds embeddings of {describe_model(theirs)}, not {describe_model(identity)}; "
                "pass a new --out folder or the same model"
            )
        return out
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out {out} is a non-empty folder that is not an embedding store; pass a new or empty one")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(marker) as tmp:
        tmp.write_text(json.dumps({"format": STORE_FORMAT, "model": identity}, indent=2, sort_keys=True) + "\n")
    return out


def read_index(store: str | Path) -> dict[str, dict] | None:
    """The store's index as {name: row} (None when the store has none yet); EmbeddingError when damaged."""
    return read_index_rows(store)


def prepare_index(store: str | Path) -> str:
    """Before any work: keep a readable index, or rebuild a damaged one from the embedding files that pass
    every check (``read_embedding``); files that fail are left out of it (a run re-embeds their images).
    -> "" or a one-line note saying what was rebuilt."""
    try:
        read_index_rows(store)
        return ""
    except EmbeddingError as e:
        damage = str(e).split(";")[0]
    rows, left_out = [], []
    for path in sorted(Path(store).glob(f"*{SUFFIX}")):
        try:
            emb = read_embedding(path)
            data = path.read_bytes()
        except (EmbeddingError, OSError):
            left_out.append(path.name)
            continue
        h, w = emb.original_size
        row = {"name": path.stem, "image": "", "sha256": emb.meta.get("image_sha256", ""), "status": "embedded"}
        rows.append({**row, "error": "", "height": h, "width": w, "seconds": 0.0, **file_record(data)})
    (Path(store) / INDEX).unlink()
    write_index(store, rows)
    skipped = f"; left out damaged {', '.join(left_out[:5])}" if left_out else ""
    return f"{damage}: rebuilt it from {len(rows)} embedding files{skipped}"


def write_index(store: str | Path, rows: list[dict]) -> None:
    """Merge ``rows`` into STORE/index.parquet (a row replaces the old one of the same name), sorted by
    name, written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    merged = dict(read_index(store) or {})
    merged.update({r["name"]: r for r in rows})
    ordered = [merged[k] for k in sorted(merged)]
    schema = pa.schema([(k, getattr(pa, t)()) for k, t in INDEX_SCHEMA.items()])
    table = pa.Table.from_pylist([{k: r.get(k) for k in INDEX_SCHEMA} for r in ordered], schema=schema)
    with atomic_path(Path(store) / INDEX) as tmp:
        pq.write_table(table, tmp)
