"""``verify``: an export bundle against the eager fp32 model with the bundle's recorded checkpoint.

The measurement is ``measure.measure_backend`` (the same function every export runs before writing a
bundle; what it measures is documented there), with the bars of ``bars.BARS`` for the bundle's precision
(overridable key by key). ``verify_bundle`` returns the report with ``passed`` and one line per failure;
``record_report`` stores it as fidelity.json's ``verify`` entry.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from sam2edge.bundle import load_card, record_fidelity
from sam2edge.checks.bench.records import machine
from sam2edge.checks.fidelity.bars import BARS  # noqa: F401  (the table `sam2edge verify` prints)
from sam2edge.checks.fidelity.measure import MIN_CLICKS, measure_backend, model_prompt  # noqa: F401
from sam2edge.config import CONFIGS, Sam2Config, get_video_config
from sam2edge.errors import UserError
from sam2edge.progress import stage
from sam2edge.runtime.backends import EagerBackend, backend_for


def bundle_config(card: dict) -> Sam2Config:
    """The model config of a bundle: card.json ``config`` at card.json ``resolution``."""
    if card["config"] not in CONFIGS:
        raise UserError(f"card.json field 'config' is {card['config']!r}; known configs: {sorted(CONFIGS)}")
    cfg = CONFIGS[card["config"]]
    return cfg if cfg.image_size == card["resolution"] else cfg.at_resolution(card["resolution"])


def reference_weights(card: dict, cfg: Sam2Config, checkpoint: str | None = None, loader=None) -> tuple[dict, dict]:
    """State dict + provenance of the checkpoint the bundle was exported from (card.json ``source``).

    ``checkpoint`` overrides the recorded path (bundle moved to another machine); its SHA-256 must
    equal the recorded one. ``loader(spec, cfg)``: ``load_weights`` unless given (video: the whole model).
    """
    from sam2edge.weights import SYNTHETIC, load_weights

    load_weights = loader or load_weights

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


def video_reference_weights(card: dict, cfg: Sam2Config, vcfg, checkpoint: str | None = None) -> tuple[dict, dict]:
    """``reference_weights`` of a ``--video`` bundle: the whole video model's state dict (synthetic too)."""
    from sam2edge.weights.video import load_video_weights

    return reference_weights(card, cfg, checkpoint, lambda s, c: load_video_weights(s, c, vcfg))


def verify_bundle(
    folder: str | Path,
    *,
    clicks: int = MIN_CLICKS,
    bars: dict[str, float] | None = None,
    checkpoint: str | None = None,
    test_backend=None,
    video_weights: dict | None = None,
) -> dict:
    """Measure a bundle against eager fp32; -> report {outputs, end_to_end, bars, passed, failures, ...}.

    ``bars`` replaces the precision's defaults key by key; ``test_backend`` (optional) is an
    already-open backend for the bundle. The measurement is ``measure.measure_backend``, the same
    function every export runs before it writes a bundle. A ``--video`` bundle is also tracked through the
    clip of ``video.measure_video`` (key "video"); ``video_weights`` replaces its reference checkpoint.
    """
    folder = Path(folder)
    card = load_card(folder)
    cfg = bundle_config(card)
    stage(f"verify {folder} ({card['target']} {card['precision']} {card['resolution']}px) against eager fp32")
    video = isinstance(card.get("extra", {}).get("video"), dict)
    vcfg = get_video_config(card["config"], cfg.image_size) if video else None
    if video and video_weights is None:  # the image model is part of the video model's weights (synthetic too)
        from sam2edge.weights.load import expected_shapes

        video_weights, prov = video_reference_weights(card, cfg, vcfg, checkpoint)
        sd = {k: video_weights[k] for k in expected_shapes(cfg)}
    else:
        sd, prov = reference_weights(card, cfg, checkpoint)
    ref = EagerBackend.from_state_dict(sd, cfg)
    test = test_backend or open_backend(folder, card)
    report = measure_backend(ref, test, card["precision"], clicks=clicks, bars=bars, provenance=(prov, card))
    if video:
        report["video"] = _verify_video(folder, card, cfg, vcfg, video_weights, bars)
        report["failures"] = report["failures"] + report["video"]["failures"]
        report["passed"] = not report["failures"]
    return {
        "provenance": "measured",
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "reference": "sam2edge eager fp32 (upstream ops) with the bundle's recorded checkpoint",
        "checkpoint": prov,
        "target": card["target"],
        "precision": card["precision"],
        "resolution": card["resolution"],
        "machine": machine(),  # where the bundle ran: fp16 programs' accuracy depends on the CPU's fp16 arithmetic
        **report,
    }


def record_report(folder: str | Path, report: dict, command: str) -> dict:
    """Store ``report`` as fidelity.json's ``verify`` entry (export-time entries kept), mirror it into
    card.json ``fidelity``, and rewrite manifest.json. Returns the new fidelity document."""
    return record_fidelity(Path(folder), ("verify",), dict(report, command=command), "verify")


def _verify_video(folder: Path, card: dict, cfg: Sam2Config, vcfg, sd: dict, bars) -> dict:
    """The clip measurement of a ``--video`` bundle against eager fp32 (upstream's operations) on ``sd``."""
    from sam2edge.checks.fidelity.video import measure_video
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.video.backend import EagerVideoBackend
    from sam2edge.runtime.video.bundle import open_video_bundle

    stage("verify: tracking a two-object clip (correction, reverse) against eager fp32")
    test, _ = open_video_bundle(folder)
    return measure_video(EagerVideoBackend.from_state_dict(sd, cfg, vcfg, UPSTREAM), test, card["precision"], bars=bars)
