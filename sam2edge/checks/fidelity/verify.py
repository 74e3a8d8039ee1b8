"""``verify``: an export bundle against the eager fp32 model with the bundle's recorded checkpoint.

Three measurements, all on real photos (``checks.fidelity.click_set``, grouped by photo so each
photo is encoded once per pipeline):

  encoder outputs   bundle encode vs eager encode of the same preprocessed photo (1x3xSxS)
  decoder outputs   bundle decode vs eager decode, both fed the *eager* features (the decoder
                    alone), every prompt of the set, plus a mask-input decode every 4th prompt
  end to end        ``fidelity.end_to_end``: the bundle's predictor vs the eager predictor
                    (mask IoU median / worst, candidate agreement, IoU-score difference)

Per output: cosine, correlation, max-abs, max-rel over all samples stacked, and the worst
per-sample cosine. Bars come from ``bars.BARS`` (per precision, the same table every export applies) and can be
overridden; ``verify_bundle`` returns the report with ``passed`` and one line per failure.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from sam2edge.bundle import load_card, record_fidelity
from sam2edge.checks.fidelity.bars import bars_for, check_bars
from sam2edge.checks.fidelity.metrics import Prompt, click_set, compare, end_to_end
from sam2edge.checks.photos import photo
from sam2edge.config import CONFIGS, Sam2Config
from sam2edge.errors import UserError
from sam2edge.progress import Progress, stage
from sam2edge.runtime.backends import Decoded, EagerBackend, Features, backend_for
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import preprocess

ENCODER_FIELDS = ("image_embed", "feat_s0", "feat_s1")
DECODER_FIELDS = ("masks", "iou", "single_mask", "single_iou", "object_score")
MIN_CLICKS = 40


def bundle_config(card: dict) -> Sam2Config:
    """The model config of a bundle: card.json ``config`` at card.json ``resolution``."""
    if card["config"] not in CONFIGS:
        raise UserError(f"card.json field 'config' is {card['config']!r}; known configs: {sorted(CONFIGS)}")
    cfg = CONFIGS[card["config"]]
    return cfg if cfg.image_size == card["resolution"] else cfg.at_resolution(card["resolution"])


def reference_weights(card: dict, cfg: Sam2Config, checkpoint: str | None = None) -> tuple[dict, dict]:
    """State dict + provenance of the checkpoint the bundle was exported from (card.json ``source``).

    ``checkpoint`` overrides the recorded path (bundle moved to another machine); its SHA-256 must
    equal the recorded one.
    """
    from sam2edge.weights import SYNTHETIC, load_weights

    source = card["source"]
    recorded = source["checkpoint"]
    if recorded == SYNTHETIC and checkpoint is None:
        return load_weights(None, cfg)
    spec = checkpoint or recorded
    if checkpoint is None and Path(recorded).suffix in (".pt", ".safetensors") and not Path(recorded).is_file():
        raise UserError(f"the bundle's checkpoint {recorded} is not on this machine; pass it with --checkpoint FILE")
    sd, prov = load_weights(spec, cfg)
    want = source.get("sha256")
    if want and prov["sha256"] != want:
        raise UserError(
            f"checkpoint {spec} has sha256 {prov['sha256'][:16]}..., but the bundle was exported from "
            f"{recorded} (sha256 {want[:16]}...); pass the same file with --checkpoint"
        )
    return sd, prov


def open_backend(folder: Path, card: dict, **kwargs):
    """The runtime of a bundle, looked up by card.json ``target`` in the target registry."""
    return backend_for(card["target"]).from_bundle(Path(folder), **kwargs)


class CachedEncoder:
    """A backend whose ``encode`` remembers results by input bytes, so a photo is encoded once."""

    def __init__(self, backend) -> None:
        self.backend, self.name, self.cfg = backend, backend.name, backend.cfg
        self._cache: dict[str, Features] = {}

    def encode(self, image: np.ndarray) -> Features:
        key = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()
        if key not in self._cache:
            self._cache[key] = self.backend.encode(image)
        return self._cache[key]

    def decode(self, feats: Features, coords, labels, mask_input) -> Decoded:
        return self.backend.decode(feats, coords, labels, mask_input)


def model_prompt(p: Prompt, hw: tuple[int, int], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Upstream's prompt layout in model-input pixels: box corners (2, 3), points, one pad (-1).

    -> coords 1xNx2 float32 (X, Y), labels 1xN float32; (x / w) * S as upstream.
    """
    wh = np.array([hw[1], hw[0]], np.float32)
    coords, labels = [], []
    if p.box is not None:
        coords.append(np.asarray(p.box, np.float32).reshape(2, 2) / wh * np.float32(size))
        labels.append(np.array([2, 3], np.float32))
    if p.point_coords is not None:
        coords.append(np.asarray(p.point_coords, np.float32).reshape(-1, 2) / wh * np.float32(size))
        labels.append(np.asarray(p.point_labels, np.float32).reshape(-1))
    coords.append(np.zeros((1, 2), np.float32))
    labels.append(np.array([-1], np.float32))
    return np.concatenate(coords)[None], np.concatenate(labels)[None]


def _stack_compare(tests: list[np.ndarray], refs: list[np.ndarray]) -> dict[str, float]:
    out = compare(np.concatenate([t.ravel() for t in tests]), np.concatenate([r.ravel() for r in refs]))
    out["cosine_worst_sample"] = min(compare(t, r)["cosine"] for t, r in zip(tests, refs))
    out["samples"] = len(tests)
    return out


def verify_bundle(
    folder: str | Path,
    *,
    clicks: int = MIN_CLICKS,
    bars: dict[str, float] | None = None,
    checkpoint: str | None = None,
    test_backend=None,
) -> dict:
    """Measure a bundle against eager fp32; -> report {outputs, end_to_end, bars, passed, failures, ...}.

    ``bars`` replaces the precision's defaults key by key; ``test_backend`` (optional) is an
    already-open backend for the bundle.
    """
    folder = Path(folder)
    card = load_card(folder)
    cfg = bundle_config(card)
    stage(f"verify {folder} ({card['target']} {card['precision']} {card['resolution']}px) against eager fp32")
    sd, prov = reference_weights(card, cfg, checkpoint)
    ref = CachedEncoder(EagerBackend.from_state_dict(sd, cfg))
    test = CachedEncoder(test_backend or open_backend(folder, card))
    prompts = sorted(click_set(clicks), key=lambda p: p.photo)
    by_photo: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        by_photo[p.photo].append(p)

    enc_t, enc_r = defaultdict(list), defaultdict(list)
    dec_t, dec_r = defaultdict(list), defaultdict(list)
    bar = Progress("verify: outputs", len(by_photo) + len(prompts))
    for name, group in by_photo.items():
        img = photo(name)
        x = preprocess(img, cfg.image_size).numpy()  # 1x3xSxS
        rf, tf = ref.encode(x), test.encode(x)
        for f in ENCODER_FIELDS:
            enc_t[f].append(getattr(tf, f))
            enc_r[f].append(getattr(rf, f))
        bar.step(note=name)
        for i, p in enumerate(group):
            coords, labels = model_prompt(p, img.shape[:2], cfg.image_size)
            rd = ref.decode(rf, coords, labels, None)
            runs = [(rd, test.decode(rf, coords, labels, None))]
            if i % 4 == 3:  # the mask-input path, fed the reference's best low-res mask
                k = int(np.argmax(rd.iou))
                mask = np.ascontiguousarray(rd.masks[:, k : k + 1])  # 1x1x4ex4e
                runs.append((ref.decode(rf, coords, labels, mask), test.decode(rf, coords, labels, mask)))
            for r, t in runs:
                for f in DECODER_FIELDS:
                    dec_t[f].append(np.asarray(getattr(t, f)))
                    dec_r[f].append(np.asarray(getattr(r, f)))
            bar.step(note=p.kind)

    outputs = {f"encoder.{f}": _stack_compare(enc_t[f], enc_r[f]) for f in ENCODER_FIELDS}
    outputs |= {f"decoder.{f}": _stack_compare(dec_t[f], dec_r[f]) for f in DECODER_FIELDS}
    e2e_bar = Progress("verify: end-to-end clicks", len(prompts))
    e2e = end_to_end(
        Sam2Predictor(ref, prov), Sam2Predictor(test, card), prompts, lambda i, n: e2e_bar.step(note=f"{i}/{n}")
    )
    active = bars_for(card["precision"], bars)
    report = {
        "provenance": "measured",
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "reference": "sam2edge eager fp32 (upstream ops) with the bundle's recorded checkpoint",
        "checkpoint": prov,
        "target": card["target"],
        "precision": card["precision"],
        "resolution": card["resolution"],
        "outputs": outputs,
        "end_to_end": e2e,
        "bars": active,
    }
    report["failures"] = check_bars(outputs, e2e, active)
    report["passed"] = not report["failures"]
    return report


def record_report(folder: str | Path, report: dict, command: str) -> dict:
    """Store ``report`` as fidelity.json's ``verify`` entry (export-time entries kept), mirror it into
    card.json ``fidelity``, and rewrite manifest.json. Returns the new fidelity document."""
    return record_fidelity(Path(folder), ("verify",), dict(report, command=command), "verify")
