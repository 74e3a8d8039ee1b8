"""Backends: one object per runtime, all with the same two calls.

  encode(image 1x3xSxS float32) -> Features(image_embed, feat_s0, feat_s1) as numpy
  decode(features, coords 1xNx2 (X,Y) model-input px, labels 1xN, mask_input 1x1x4ex4e | None)
        -> Decoded(masks 1x3, iou 1x3, single_mask 1x1, single_iou 1x1, object_score 1x1)

``BACKENDS`` maps a bundle's ``target`` (from its card.json) to the class that runs it, read from the
target registry (``sam2edge.targets``) and imported on first use. Every backend class opens a bundle with
``from_bundle(folder, *, threads=None)`` (``threads=None``: the runtime's default). The eager backend is
the reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sam2edge.config import Sam2Config
from sam2edge.errors import UserError
from sam2edge.model import UPSTREAM, Rewrites, Sam2ImageModel, build_sam2
from sam2edge.targets import TARGETS, resolve


@dataclass
class Features:
    image_embed: np.ndarray  # 1xCxexe, no_mem_embed added
    feat_s0: np.ndarray  # 1x(C/8)x4ex4e
    feat_s1: np.ndarray  # 1x(C/4)x2ex2e
    # a backend's per-image work that no prompt changes (LiteRT: the CPU decoder's image projections), kept
    # with the image's features under that backend's key; made by its encode, or on first use
    prepared: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)


@dataclass
class Decoded:
    masks: np.ndarray  # 1x3x4ex4e multimask logits
    iou: np.ndarray  # 1x3
    single_mask: np.ndarray  # 1x1x4ex4e single-mask (dynamic) logits
    single_iou: np.ndarray  # 1x1
    object_score: np.ndarray  # 1x1 logit


class Backend(Protocol):
    name: str
    cfg: Sam2Config

    @classmethod
    def from_bundle(cls, folder: str | Path, *, threads: int | None = None) -> Backend: ...

    def encode(self, image: np.ndarray) -> Features: ...

    def decode(
        self, feats: Features, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None
    ) -> Decoded: ...


class EagerBackend:
    """The PyTorch model in fp32. Default rewrites = upstream's operations (bit-identical to upstream)."""

    name = "eager"

    def __init__(self, model: Sam2ImageModel) -> None:
        self.model, self.cfg = model.eval(), model.cfg

    @classmethod
    def from_state_dict(cls, sd: dict, cfg: Sam2Config, rewrites: Rewrites = UPSTREAM) -> EagerBackend:
        model = build_sam2(cfg, rewrites)
        model.load_state_dict(sd, strict=True)
        return cls(model)

    @torch.no_grad()
    def encode(self, image: np.ndarray) -> Features:
        emb, s0, s1 = self.model.encode_image(torch.as_tensor(image, dtype=torch.float32))
        return Features(emb.numpy(), s0.numpy(), s1.numpy())

    @torch.no_grad()
    def decode(self, feats: Features, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None) -> Decoded:
        pe = self.model.sam_prompt_encoder
        sparse = pe.embed_points(
            torch.as_tensor(coords, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.float32)
        )
        dense = (
            pe.no_mask_dense if mask_input is None else pe.embed_mask(torch.as_tensor(mask_input, dtype=torch.float32))
        )
        f = [torch.from_numpy(a) for a in (feats.image_embed, feats.feat_s0, feats.feat_s1)]
        return Decoded(*(t.numpy() for t in self.model.answers(*self.model.decode(*f, sparse, dense))))

    @torch.no_grad()
    def decode_batch(self, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
        """B prompts on one image in one call: coords BxNx2, labels BxN -> Decoded with B rows."""
        pe = self.model.sam_prompt_encoder
        sparse = pe.embed_points(
            torch.as_tensor(coords, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.float32)
        )  # (B, N, C)
        f = [torch.from_numpy(a) for a in (feats.image_embed, feats.feat_s0, feats.feat_s1)]  # one row each
        return Decoded(*(t.numpy() for t in self.model.answers(*self.model.decode(*f, sparse, pe.no_mask_dense))))


class _Backends(Mapping):
    """target name (card.json "target") -> backend class, resolved from ``sam2edge.targets.TARGETS``."""

    def __getitem__(self, name: str) -> type:
        t = TARGETS.get(name) if isinstance(name, str) else None
        if t is None or t.backend is None:
            raise KeyError(name)
        return resolve(t.backend)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, t in TARGETS.items() if t.backend is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))


BACKENDS: Mapping[str, type] = _Backends()


def backend_for(target: object) -> type:
    """The runtime class of a bundle's ``target``; a target with no runtime here is one line naming them."""
    if not isinstance(target, str) or target not in BACKENDS:
        raise UserError(f"bundle target {target!r} has no runtime here; known: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[target]


def decode_batch(backend: Backend, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
    """B point prompts (coords BxNx2 model-input px, labels BxN, no mask input) -> Decoded with B rows.

    A backend with a batched decoder (``decode_batch``) runs them in one call; any other backend runs B
    single decodes (same answers, slower).
    """
    batched = getattr(backend, "decode_batch", None)
    if batched is not None:
        return batched(feats, coords, labels)
    return decode_loop(backend, feats, coords, labels)


def has_batched_decoder(backend: Backend) -> bool:
    """Whether ``decode_batch`` of ``backend`` runs B prompts per call: eager always; a bundle's backend when its
    card lists a ``decoder-batched`` graph (LiteRT ``batched_file``, ONNX / ExecuTorch ``batched``)."""
    if isinstance(backend, EagerBackend):
        return True
    return getattr(backend, "batched_file", None) is not None or getattr(backend, "batched", None) is not None


def padded_chunks(
    coords: np.ndarray, labels: np.ndarray, slots: int, batch: int, ignored: float, label_dtype: type
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """R prompts (coords Rxnx2, labels Rxn; model-input pixels) laid into a batched decoder's fixed shape:
    yields (points BxKx2 float32, labels BxK ``label_dtype``, k real rows) per chunk of B = ``batch`` rows.
    Unused point slots (n < K = ``slots``) get label ``ignored``; the last chunk repeats its last row."""
    n_rows, n = np.shape(coords)[:2]
    if n > slots:
        raise UserError(f"{n} prompt points exceed the batched decoder's {slots} slots; use single decodes")
    pts = np.zeros((n_rows, slots, 2), np.float32)
    lab = np.full((n_rows, slots), ignored, label_dtype)
    pts[:, :n], lab[:, :n] = coords, labels
    for start in range(0, n_rows, batch):
        p, q = pts[start : start + batch], lab[start : start + batch]
        k = len(p)
        p = np.concatenate([p, np.repeat(p[-1:], batch - k, 0)])  # (B, K, 2)
        q = np.concatenate([q, np.repeat(q[-1:], batch - k, 0)])  # (B, K)
        yield p, q, k


def decode_loop(backend: Backend, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
    """The fallback of ``decode_batch``: B single decodes, rows concatenated."""
    rows = [backend.decode(feats, coords[i : i + 1], labels[i : i + 1], None) for i in range(len(coords))]
    return Decoded(*(np.concatenate([getattr(r, f) for r in rows]) for f in Decoded.__dataclass_fields__))
