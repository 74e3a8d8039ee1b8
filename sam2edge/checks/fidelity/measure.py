"""THE fidelity measurement: a backend against eager fp32 with upstream's operations, on real photos.

Run by every export on its staged files (before the bundle is written) and by ``sam2edge verify`` on a
written bundle; the result is fidelity.json's body (schema in ``sam2edge.bundle.fidelity``). All on
``click_set`` prompts, grouped by photo so each photo is encoded once per pipeline:

  encoder outputs   test encode vs eager encode of the same preprocessed photo (1x3xSxS)
  decoder outputs   test decode vs eager decode, both fed the *eager* features (the decoder alone), every
                    prompt of the set, plus a mask-input decode every 4th prompt
  mask encoder      (backends with a separate mask-encoder graph, ``encode_mask``) its dense prompt vs the
                    eager ``embed_mask`` of the same mask inputs
  end to end        ``metrics.end_to_end``: the test predictor vs the eager predictor (mask IoU median /
                    worst, candidate agreement, IoU-score difference, non-finite count)

Per output: cosine, correlation, max-abs, max-rel over all samples stacked, the worst per-sample cosine
and the non-finite count. Bars: ``bars.BARS`` for the precision (NaN / inf always fails).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import torch

from sam2edge.checks.fidelity.bars import bars_for, check_bars
from sam2edge.checks.fidelity.metrics import Prompt, click_set, compare, end_to_end
from sam2edge.checks.photos import photo
from sam2edge.progress import Progress
from sam2edge.runtime.backends import Decoded, EagerBackend, Features
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import preprocess
from sam2edge.runtime.prompts import prompt_layout

ENCODER_FIELDS = ("image_embed", "feat_s0", "feat_s1")
DECODER_FIELDS = ("masks", "iou", "single_mask", "single_iou", "object_score")
MIN_CLICKS = 40


class CachedEncoder:
    """A backend whose ``encode`` remembers results by input bytes, so a photo is encoded once.

    ``cache``: a dict shared with other wrappers of backends that run the *same encoder graph* (e.g. a
    LiteRT bundle measured with its CPU decoder and with its GPU decoder), so the photo is encoded once per
    export. Wrapping a ``CachedEncoder`` again shares its backend and cache."""

    def __init__(self, backend, cache: dict | None = None) -> None:
        if isinstance(backend, CachedEncoder):
            backend, cache = backend.backend, backend._cache if cache is None else cache
        self.backend, self.name, self.cfg = backend, backend.name, backend.cfg
        self._cache: dict[str, Features] = {} if cache is None else cache

    def encode(self, image: np.ndarray) -> Features:
        key = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()
        if key not in self._cache:
            self._cache[key] = self.backend.encode(image)
        return self._cache[key]

    def decode(self, feats: Features, coords, labels, mask_input) -> Decoded:
        return self.backend.decode(feats, coords, labels, mask_input)


class CachedReference(CachedEncoder):
    """The eager reference of one export, shared by all its measurements: encodes *and* decodes are
    remembered, a decode by (the cached features it was given, prompt bytes, mask-input bytes). Features
    that this wrapper did not return are decoded afresh. Results are returned as computed (not copied);
    no consumer writes into them."""

    def __init__(self, backend) -> None:
        super().__init__(backend)
        self._decoded: dict[tuple, Decoded] = {}

    def decode(self, feats: Features, coords, labels, mask_input) -> Decoded:
        owned = next((k for k, f in self._cache.items() if f is feats), None)
        if owned is None:
            return self.backend.decode(feats, coords, labels, mask_input)
        arrays = [np.ascontiguousarray(a) for a in (coords, labels, mask_input) if a is not None]
        key = (owned, mask_input is None, *((a.dtype.str, a.shape, a.tobytes()) for a in arrays))
        if key not in self._decoded:
            self._decoded[key] = self.backend.decode(feats, coords, labels, mask_input)
        return self._decoded[key]


def model_prompt(p: Prompt, hw: tuple[int, int], size: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``click_set`` prompt in the one prompt layout (``runtime.prompts.prompt_layout``), model-input px."""
    return prompt_layout(p.box, p.point_coords, p.point_labels, np.array([hw[1], hw[0]], np.float32), size)


def _stack_compare(tests: list[np.ndarray], refs: list[np.ndarray]) -> dict[str, float]:
    out = compare(np.concatenate([t.ravel() for t in tests]), np.concatenate([r.ravel() for r in refs]))
    out["cosine_worst_sample"] = min(compare(t, r)["cosine"] for t, r in zip(tests, refs))
    out["samples"] = len(tests)
    return out


def _decode_runs(ref, test, rf: Features, coords, labels, with_mask: bool) -> list[tuple[Decoded, Decoded, object]]:
    """(reference, test, mask input) decodes of one prompt: without a mask, and (``with_mask``) with the
    reference's best low-res mask as mask input (1x1x4ex4e)."""
    rd = ref.decode(rf, coords, labels, None)
    runs = [(rd, test.decode(rf, coords, labels, None), None)]
    if with_mask:
        k = int(np.argmax(rd.iou))
        mask = np.ascontiguousarray(rd.masks[:, k : k + 1])
        runs.append((ref.decode(rf, coords, labels, mask), test.decode(rf, coords, labels, mask), mask))
    return runs


def _collect(ref, test, by_photo: dict, mask_encoder, outs: tuple[dict, dict], bar: Progress) -> None:
    """Append every sample of every output (test, reference) into ``outs`` (see ``compare_outputs``)."""
    t_out, r_out = outs
    for name, group in by_photo.items():
        img = photo(name)
        x = preprocess(img, ref.cfg.image_size).numpy()  # 1x3xSxS
        rf, tf = ref.encode(x), test.encode(x)
        for f in ENCODER_FIELDS:
            t_out[f"encoder.{f}"].append(getattr(tf, f))
            r_out[f"encoder.{f}"].append(getattr(rf, f))
        bar.step(note=name)
        for i, p in enumerate(group):
            coords, labels = model_prompt(p, img.shape[:2], ref.cfg.image_size)
            for r, t, mask in _decode_runs(ref, test, rf, coords, labels, with_mask=i % 4 == 3):
                for f in DECODER_FIELDS:
                    t_out[f"decoder.{f}"].append(np.asarray(getattr(t, f)))
                    r_out[f"decoder.{f}"].append(np.asarray(getattr(r, f)))
                if mask is not None and mask_encoder is not None:
                    t_out["mask_encoder.dense_prompt"].append(mask_encoder[0](mask))
                    r_out["mask_encoder.dense_prompt"].append(mask_encoder[1](mask))
            bar.step(note=p.kind)


def compare_outputs(ref, test, prompts: list[Prompt], mask_encoder: tuple | None = None) -> dict[str, dict]:
    """Per-output comparison (all samples stacked) of ``test`` vs ``ref`` over ``prompts`` (see module doc).
    ``mask_encoder``: (test fn mask -> dense, reference fn mask -> dense) to compare a mask-encoder graph."""
    by_photo: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        by_photo[p.photo].append(p)
    t_out, r_out = defaultdict(list), defaultdict(list)
    with Progress("fidelity: outputs", len(by_photo) + len(prompts), unit="sample") as bar:
        _collect(ref, test, by_photo, mask_encoder, (t_out, r_out), bar)
    return {k: _stack_compare(t_out[k], r_out[k]) for k in t_out}


def _eager_mask_encoder(ref) -> object:
    model = (ref.backend if isinstance(ref, CachedEncoder) else ref).model

    @torch.no_grad()
    def embed(mask: np.ndarray) -> np.ndarray:
        return model.sam_prompt_encoder.embed_mask(torch.from_numpy(mask)).numpy()

    return embed


def measure_backend(
    ref: EagerBackend,
    test,
    precision: str,
    *,
    clicks: int = MIN_CLICKS,
    bars: dict[str, float] | None = None,
    provenance: tuple[dict | None, dict | None] = (None, None),
) -> dict:
    """``test`` (any backend) vs ``ref`` (eager fp32, upstream's operations) -> {reference, outputs,
    end_to_end, bars, passed, failures}. ``bars`` overrides the precision's bars key by key;
    ``provenance`` = (reference, test) predictor provenance."""
    ref, test = CachedEncoder(ref) if not isinstance(ref, CachedEncoder) else ref, CachedEncoder(test)
    prompts = click_set(clicks)  # its own order: a failing click's index is the one `diagnose` reports
    mask_encoder = (
        (test.backend.encode_mask, _eager_mask_encoder(ref)) if hasattr(test.backend, "encode_mask") else None
    )
    outputs = compare_outputs(ref, test, prompts, mask_encoder)
    with Progress("fidelity: end-to-end clicks", len(prompts), unit="click") as e2e_bar:
        e2e = end_to_end(
            Sam2Predictor(ref, provenance[0]),
            Sam2Predictor(test, provenance[1]),
            prompts,
            lambda i, n: e2e_bar.step(),
        )
    active = bars_for(precision, bars)
    failures = check_bars(outputs, e2e, active)
    return {
        "reference": "sam2edge eager fp32 with upstream's operations (Rewrites=UPSTREAM)",
        "outputs": outputs,
        "end_to_end": e2e,
        "bars": active,
        "passed": not failures,
        "failures": failures,
    }
