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


def read_embedding(path: str | Path) -> StoredEmbedding:
    """Read one stored embedding (tensors + metadata) or raise EmbeddingError with a one-line reason."""
    from safetensors.numpy import load_file

    meta = read_meta(path)
    try:
        arrays = load_file(str(path))
        feats = Features(*(np.ascontiguousarray(arrays[k], dtype=np.float32) for k in FEATURE_KEYS))
        h, w = (int(v) for v in meta["original_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
        raise EmbeddingError(f"{path} is damaged ({reason}); embed the image again") from None
    return StoredEmbedding(feats, (h, w), meta)


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


def embedding_path(store: str | Path, name: str) -> Path:
    """``STORE/<name>.safetensors``; ``name`` is an image's stem (no folders)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise EmbeddingError(f"bad embedding name {name!r}; use an image's file name without its suffix")
    return Path(store) / f"{name}{SUFFIX}"
