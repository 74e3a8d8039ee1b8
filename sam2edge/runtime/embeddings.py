"""Stored image embeddings: one ``<stem>.safetensors`` per image, readable by every predictor.

File layout (safetensors; deterministic: the same image, model and sam2edge version give the same bytes):

  tensors (float32, C order, batch dim kept as the backends return them; e = S / 16)
    image_embed   1 x C x e x e           encoder output, no_mem_embed added (decoder-ready)
    feat_s0       1 x C/8 x 4e x 4e       high-res feature, stride 4
    feat_s1       1 x C/4 x 2e x 2e       high-res feature, stride 8
  metadata: one key "sam2edge" holding a JSON object (sorted keys, no spaces):
    format          "sam2edge-embedding/1"
    sam2edge        sam2edge version that wrote it
    image_sha256    SHA-256 of the image file's bytes
    original_size   [H, W] of the image (orientation applied): the frame of prompts and masks
    model           the model identity (``model_identity``): kind, digest, backend, config, resolution

A single metadata key keeps the header's byte order fixed (safetensors sorts tensors, not metadata).
The store folder (written by ``sam2edge embed``) holds these files, ``index.parquet`` and the
marker ``sam2edge-store.json``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.config import CONFIGS, Sam2Config
from sam2edge.errors import UserError
from sam2edge.io import atomic_path
from sam2edge.runtime.backends import Features

FORMAT = "sam2edge-embedding/1"
SUFFIX = ".safetensors"
META_KEY = "sam2edge"
FEATURE_KEYS = ("image_embed", "feat_s0", "feat_s1")
INDEX_NAME = "index.parquet"  # the store's index (``sam2edge.embed.store``)
MAX_HEADER_BYTES = 1 << 20  # a real header is ~1 KB; refuse anything absurd before reading it


class EmbeddingError(UserError):
    """A stored embedding that is missing, malformed, or belongs to another image or model."""


@dataclass(frozen=True)
class StoredEmbedding:
    features: Features  # decoder-ready tensors, shapes as in the module docstring
    original_size: tuple[int, int]  # (H, W) of the source image, orientation applied
    meta: dict  # the full "sam2edge" metadata object


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_name(cfg: Sam2Config) -> str:
    """Registry name of ``cfg`` (a resized config keeps its base name; ``resolution`` says the size)."""
    for name, known in CONFIGS.items():
        if known == cfg or known.at_resolution(cfg.image_size) == cfg:
            return name
    return "custom"


def model_identity(provenance: dict, cfg: Sam2Config, backend: str) -> dict:
    """What decides the embedding bytes, from a predictor's provenance (a bundle's card.json or the
    eager ``{"checkpoint", "format", "sha256"}``).

    Bundles: ``digest`` = SHA-256 over the model artifacts' ``file:sha256`` lines (the same hashes
    manifest.json lists), so rewriting card.json / fidelity.json (``verify``, ``card``) keeps it.
    Eager: the checkpoint's SHA-256, or "synthetic" for the deterministic synthetic weights.
    """
    if isinstance(provenance.get("artifacts"), list):
        lines = sorted(f"{a['file']}:{a['sha256']}" for a in provenance["artifacts"])
        kind, digest = "bundle", sha256_hex("\n".join(lines).encode())
        config = str(provenance.get("config", config_name(cfg)))
    else:
        kind = "checkpoint" if provenance.get("sha256") else "synthetic"
        digest, config = provenance.get("sha256") or "synthetic", config_name(cfg)
    return {"kind": kind, "digest": digest, "backend": backend, "config": config, "resolution": cfg.image_size}


def describe_model(identity: dict) -> str:
    """One-line human description of a model identity."""
    kind, digest = identity.get("kind"), str(identity.get("digest"))
    what = kind if digest == kind else f"{kind} {digest[:12]}"
    return f"{what} ({identity.get('backend')}, {identity.get('config')} @ {identity.get('resolution')} px)"


def embedding_bytes(features: Features, meta: dict) -> bytes:
    """Features + metadata -> the bytes of one ``.safetensors`` file (deterministic)."""
    from safetensors.numpy import save

    tensors = {k: np.ascontiguousarray(getattr(features, k), dtype=np.float32) for k in FEATURE_KEYS}
    text = json.dumps({"format": FORMAT, **meta}, sort_keys=True, separators=(",", ":"))
    return save(tensors, metadata={META_KEY: text})


def write_embedding(path: str | Path, data: bytes) -> None:
    """Write the bytes of ``embedding_bytes`` atomically (never a half-written file at ``path``)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def read_meta(path: str | Path) -> dict:
    """The "sam2edge" metadata of a stored embedding, from its header only (no tensor bytes read)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if not 0 < n <= MAX_HEADER_BYTES:
                raise ValueError
            header = json.loads(f.read(n))
        meta = json.loads(header["__metadata__"][META_KEY])
        if meta.get("format") != FORMAT:
            raise ValueError
        return meta
    except FileNotFoundError:
        raise EmbeddingError(f"no stored embedding {path}; run `sam2edge embed` on the image first") from None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        raise EmbeddingError(f"{path} is not a sam2edge embedding ({FORMAT}); embed the image again") from None


def read_embedding(path: str | Path, record: dict | None = None) -> StoredEmbedding:
    """Read one stored embedding (tensors + metadata) or raise EmbeddingError with a one-line reason.

    Checked: the file's size and SHA-256 against ``record`` (its index row, when given), the tensors'
    shapes against each other (``consistent_shapes``) and their finiteness (an all-NaN embedding gives
    ``score: nan`` masks), and ``original_size`` (two positive integers)."""
    from safetensors.numpy import load

    meta = read_meta(path)
    try:
        data = Path(path).read_bytes()
        check_record(path, data, record)
        arrays = load(data)
        feats = Features(*(np.ascontiguousarray(arrays[k], dtype=np.float32) for k in FEATURE_KEYS))
        h, w = (int(v) for v in meta["original_size"])
        if h < 1 or w < 1:
            raise ValueError(f"original_size {h}x{w} is empty")
    except EmbeddingError:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError for a cut file
        reason = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
        raise EmbeddingError(f"{path} is damaged ({reason}); embed the image again") from None
    consistent_shapes(feats, path)
    for k in FEATURE_KEYS:
        if not np.isfinite(getattr(feats, k)).all():
            raise EmbeddingError(f"{path}: {k} holds NaN or infinity; embed the image again")
    return StoredEmbedding(feats, (h, w), meta)


def file_record(data: bytes) -> dict:
    """The index columns that pin one embedding file: ``file_bytes`` (size) and ``file_sha256``."""
    return {"file_bytes": len(data), "file_sha256": sha256_hex(data)}


def check_record(path: str | Path, data: bytes, record: dict | None) -> None:
    """Refuse file bytes whose size or SHA-256 differ from the index row (columns absent: nothing to check)."""
    if not record or record.get("file_sha256") in (None, ""):
        return
    if len(data) != record.get("file_bytes"):
        raise EmbeddingError(
            f"{path} is {len(data)} bytes, the index says {record.get('file_bytes')} (cut or replaced); "
            "embed the image again"
        )
    if sha256_hex(data) != record["file_sha256"]:
        raise EmbeddingError(f"{path} does not match the SHA-256 in the index (damaged); embed the image again")


def consistent_shapes(features: Features, where: str | Path) -> None:
    """The three tensors fit one model: image_embed 1xCxexe, feat_s0 1x(C/8)x4ex4e, feat_s1 1x(C/4)x2ex2e."""
    emb = features.image_embed.shape
    if len(emb) != 4 or emb[0] != 1 or emb[2] != emb[3] or emb[1] % 8 or min(emb) < 1:
        raise EmbeddingError(f"{where}: image_embed is {tuple(emb)}, not 1xCxexe; embed the image again")
    c, e = emb[1], emb[2]
    for k, shape in (("feat_s0", (1, c // 8, 4 * e, 4 * e)), ("feat_s1", (1, c // 4, 2 * e, 2 * e))):
        got = tuple(getattr(features, k).shape)
        if got != shape:
            raise EmbeddingError(f"{where}: {k} is {got}, image_embed needs {shape}; embed the image again")


def read_index_rows(store: str | Path) -> dict[str, dict] | None:
    """STORE/index.parquet as {name: row} (None when absent), or EmbeddingError when it cannot be parsed."""
    path = Path(store) / INDEX_NAME
    if not path.is_file():
        return None
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return {str(r["name"]): r for r in rows}
    except ImportError:
        raise EmbeddingError("reading a store's index needs pyarrow; pip install 'sam2edge[distributed]'") from None
    except Exception as e:  # pyarrow's ArrowInvalid and OSError for a cut or foreign file
        reason = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
        raise EmbeddingError(
            f"{path} is damaged ({reason}); run `sam2edge embed` on the same images and --out to rebuild it"
        ) from None


def read_stored(store: str | Path, name: str) -> StoredEmbedding:
    """``STORE/<name>.safetensors`` checked against its index row (size, SHA-256) and in itself."""
    path = embedding_path(store, name)
    rows = read_index_rows(store)
    record = rows.get(name) if rows else None
    if rows is not None and record is None and path.is_file():
        raise EmbeddingError(f"{path} is not in the store's index; run `sam2edge embed` on the image again")
    return read_embedding(path, record)


def check_shapes(features: Features, cfg: Sam2Config, where: str) -> None:
    """Refuse tensors that do not fit ``cfg`` (another resolution or model width)."""
    e, c = cfg.image_embedding_size, cfg.d_model
    want = {"image_embed": (1, c, e, e), "feat_s0": (1, c // 8, 4 * e, 4 * e), "feat_s1": (1, c // 4, 2 * e, 2 * e)}
    for k, shape in want.items():
        got = tuple(getattr(features, k).shape)
        if got != shape:
            raise EmbeddingError(
                f"{where}: {k} is {got}, this model needs {shape}; embed with the same model and resolution"
            )
    for k in FEATURE_KEYS:
        if not np.isfinite(np.asarray(getattr(features, k))).all():
            raise EmbeddingError(f"{where}: {k} holds NaN or infinity; encode the image again")


def embedding_path(store: str | Path, name: str) -> Path:
    """``STORE/<name>.safetensors``; ``name`` is an image's stem (no folders)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise EmbeddingError(f"bad embedding name {name!r}; use an image's file name without its suffix")
    return Path(store) / f"{name}{SUFFIX}"
