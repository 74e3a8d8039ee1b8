"""fidelity.json: one schema for every target (written at export, extended by ``verify`` and checks).

    reference   str                what the bundle was measured against (eager fp32, upstream's operations)
    outputs     {name: metrics}    per graph output ("encoder.image_embeddings", "decoder.masks", ...):
                                   metrics = {cosine, correlation?, max_abs, max_rel?, nonfinite?, ...} numbers
    end_to_end  {clicks, photos, iou_median, iou_worst, ...}   mask IoU over clicks on real photos
    bars        {name: number}     the bars applied (``sam2edge.checks.fidelity.bars.BARS``)
    passed      bool               every bar met and every output finite
    failures    [str]              one line per failed bar (empty when passed)
    checks      {name: dict}       optional: target checks (GPU delegate residency, graph optimisation, ...)
    verify      dict               optional: the last ``sam2edge verify`` report (same keys as above)
    machine     dict               optional: the CPU the export measured on {cpu, vector_extensions,
                                   fp16_arithmetic: "native" | "through fp32", cores, os, python, torch}
    (any other key: target-specific detail, e.g. ``cpu_twin`` of executorch-webgpu)

``validate_fidelity`` checks a document against it; a malformed or partial one is a one-line UserError.
"""

from __future__ import annotations

import math
from pathlib import Path

from sam2edge.errors import UserError

REQUIRED = ("reference", "outputs", "end_to_end", "bars", "passed", "failures")
E2E_NUMBERS = ("iou_median", "iou_worst")


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _problem(doc: object) -> str | None:
    """The first schema violation of a fidelity document, as a phrase; None when it conforms."""
    if not isinstance(doc, dict):
        return "must hold a JSON object"
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        return f"is missing field '{missing[0]}'"
    if not isinstance(doc["reference"], str):
        return "field 'reference' must be a string"
    outs = doc["outputs"]
    if not isinstance(outs, dict) or not all(isinstance(m, dict) and _is_num(m.get("cosine")) for m in outs.values()):
        return "field 'outputs' must map each output name to {cosine, max_abs, ...} numbers"
    e2e = doc["end_to_end"]
    if not isinstance(e2e, dict) or not isinstance(e2e.get("clicks"), int):
        return "field 'end_to_end' must be {clicks, iou_median, iou_worst, ...}"
    if not all(_is_num(e2e.get(k)) for k in E2E_NUMBERS):
        return "field 'end_to_end' must hold numbers 'iou_median' and 'iou_worst'"
    if not isinstance(doc["bars"], dict) or not all(_is_num(v) for v in doc["bars"].values()):
        return "field 'bars' must map each bar name to a number"
    if not isinstance(doc["passed"], bool):
        return "field 'passed' must be true or false"
    if not isinstance(doc["failures"], list) or not all(isinstance(f, str) for f in doc["failures"]):
        return "field 'failures' must be a list of strings"
    for key in ("checks", "verify"):
        if key in doc and not isinstance(doc[key], dict):
            return f"field '{key}' must be an object"
    return None


def validate_fidelity(doc: object, where: str | Path = "fidelity.json") -> dict:
    """``doc`` when it conforms to the schema above, else a one-line UserError naming the field."""
    problem = _problem(doc)
    if problem:
        raise UserError(f"{where} {problem}; re-run the export (or `sam2edge verify`) to rewrite it")
    return doc


def all_finite(doc: dict) -> bool:
    """No NaN / inf among the numbers of ``outputs`` and ``end_to_end`` (a non-finite number never passes)."""
    nums = [v for m in doc["outputs"].values() for v in m.values() if _is_num(v)]
    nums += [v for v in doc["end_to_end"].values() if _is_num(v)]
    return all(math.isfinite(v) for v in nums)


def validate_stored(doc: object, where: str | Path = "fidelity.json") -> dict:
    """A fidelity.json as found in a bundle: the export-time measurement (when any of its fields is there,
    all must be) and the ``verify`` report (when there) each conform; ``checks`` entries are objects.
    A bundle written before any measurement may hold neither. One-line UserError otherwise."""
    if not isinstance(doc, dict):
        raise UserError(f"{where} must hold a JSON object; re-run the export (or `sam2edge verify`)")
    if any(k in doc for k in REQUIRED if k != "passed"):
        validate_fidelity(doc, where)
    if "verify" in doc:
        validate_fidelity(doc["verify"], f"{where} entry 'verify'")
    if "checks" in doc and not (
        isinstance(doc["checks"], dict) and all(isinstance(v, dict) for v in doc["checks"].values())
    ):
        raise UserError(f"{where} field 'checks' must map each check name to an object; re-run the check")
    return doc
