"""ExecuTorch fp16 that falls back to fp16 weights with fp32 arithmetic (``export.mixed.fp16_keep``): the
decision where fp16 arithmetic cannot be held within the selection's budget (the full-size export of
upstream-s4-outliers takes that route, record ``precision-robustness-et-fp16-storage-zen5-1024``); the export
where its fp16-arithmetic bundle misses after the export kept all it could; a ``--video`` EdgeTAM bundle, whose
every program but the decoders is lowered that way (``export.executorch_storage``). Each ships, its card saying
which arithmetic, and ``verify`` agrees.
"""

from __future__ import annotations

import pytest

pytest.importorskip("executorch")

from sam2edge.checks.fidelity.checkpoints import variant_state_dict  # noqa: E402
from sam2edge.config import TEST_SMALL  # noqa: E402

# the exports under test: 8 clicks (their fragile block misses on every click), no batched decoder (not under test)
FAST = {"clicks": 8, "options": {"batch": 0}}


def test_fp16_keep_measures_fp16_storage_where_fp16_arithmetic_cannot_hold(monkeypatch):
    """The decision (``fp16_keep``): a target with a storage recipe whose fp16-arithmetic selection does not hold
    gets a second selection with that recipe's emulation, recorded as fp32 arithmetic with the first outcome; one
    that holds keeps fp16 arithmetic (and may still fall back, ``storage_fallback``); a target without a storage
    recipe keeps its selection as it is."""
    from types import SimpleNamespace

    from sam2edge.export import precision
    from sam2edge.export.mixed import Selection, Trial, fp16_keep, fp16_storage_only

    calls = []
    missed = Selection(("a",), False, (Trial(("a",), 0.9, 0.99, False),))
    held = Selection(("b",), True, (Trial(("b",), 0.999, 0.9999, True),))

    def select(*a, emulation=None, **k):
        calls.append(emulation)
        return held if emulation is not None or arithmetic_holds else missed

    monkeypatch.setattr(precision, "select_fp16", select)
    for arithmetic_holds, target in ((False, "executorch"), (True, "executorch"), (False, "onnx")):
        calls.clear()
        job = SimpleNamespace(state={}, bars=None, model=None, cfg=TEST_SMALL, clicks=8, reference=lambda: None)
        kept = fp16_keep(job, target)
        record = job.state["mixed_precision"]
        if not arithmetic_holds and target == "executorch":
            assert calls == [None, precision.STORAGE_FALLBACK["executorch"]] and kept == ("b",)
            assert fp16_storage_only(job) and record["fp16_arithmetic"]["kept_fp32"] == ["a"]
            assert record["fp16_arithmetic"]["holds"] is False and record["holds"]
        else:
            assert calls == [None] and not fp16_storage_only(job)
            assert record.get("storage_fallback", False) == (target == "executorch")


def test_export_falls_back_to_fp16_storage_when_its_fp16_bundle_misses(tmp_path, monkeypatch):
    """An fp16-arithmetic emulation that says nothing need stay fp32 (it misses the fragility) while the bundle
    misses the bars, and nothing is ranked to keep: the export converts again in fp32 arithmetic on fp16
    weights, whose own measured selection keeps the fragile block, and ships; the card records the bundle
    that missed."""
    from sam2edge.export import precision
    from sam2edge.export.mixed import Selection, Trial
    from sam2edge.export.pipeline import run_export
    from tests.test_mixed_precision import FRAGILE, SOURCE, fp16_fragile

    spec, block = FRAGILE[1]
    sd = fp16_fragile(variant_state_dict(spec, TEST_SMALL), block)
    wrong = Selection((), True, (Trial((), 0.999, 0.9999, True),))  # held in an emulation blind to the fragility
    real = precision.select_fp16
    monkeypatch.setattr(precision, "select_fp16", lambda *a, **k: real(*a, **k) if k.get("emulation") else wrong)
    card = run_export(
        "executorch", "test-small", "fp16", tmp_path / "b", weights=(sd, {**SOURCE, "checkpoint": spec}), **FAST
    )
    mixed, e2e = card["extra"]["mixed_precision"], card["fidelity"]["end_to_end"]
    assert card["status"] == "shippable", card["fidelity"]["failures"]
    assert mixed["arithmetic"] == "fp32" and mixed["kept_fp32"] == [f"image_encoder.trunk.blocks.{block}"], mixed
    (missed,) = mixed["fp16_arithmetic"]["bundle_checks"]
    assert missed["kept"] == 0 and min(missed["iou_worst"] - 0.99, missed["iou_median"] - 0.999) < 0, missed
    assert e2e["iou_worst"] >= 0.99 and e2e["iou_median"] >= 0.999, e2e


def test_video_bundle_in_fp16_storage_stores_every_video_program_so_and_ships(tmp_path, monkeypatch):
    """EdgeTAM with its video graphs, fp16 arithmetic made to miss (a selection that did not hold): every
    program but the decoders is lowered in fp32 arithmetic with fp16 Linear weights, each within its size limit
    at those bytes, and the bundle's image and video checks pass against eager fp32, at export and in
    ``verify``."""
    from sam2edge.checks.fidelity.verify import verify_bundle
    from sam2edge.export import precision
    from sam2edge.export.mixed import Selection, Trial
    from sam2edge.export.pipeline import run_export

    missed = Selection((), False, (Trial((), 0.5, 0.9, False),))
    real = precision.select_fp16
    monkeypatch.setattr(precision, "select_fp16", lambda *a, **k: real(*a, **k) if k.get("emulation") else missed)
    card = run_export(
        "executorch",
        "test-small-edgetam",
        "fp16",
        tmp_path / "b",
        video=True,
        clicks=4,
        options={"batch": 0, "video_batch": 1},
    )
    fid, mixed, sizes = card["fidelity"], card["extra"]["mixed_precision"], card["extra"]["sizes"]
    assert card["status"] == "shippable" and mixed["arithmetic"] == "fp32", fid["failures"]
    video = fid["video"]
    assert not video["failures"] and video["iou_worst"] >= video["bars"]["min_video_iou_worst"], video
    video = {f: s for f, s in sizes.items() if f.startswith(("memory_attention", "memory_encoder"))}
    assert video and all(s["bytes"] <= s["limit_bytes"] for s in sizes.values()), sizes
    # `sam2edge verify` of a --video bundle of synthetic weights measures the image model of those video weights
    report = verify_bundle(tmp_path / "b", clicks=4)
    assert report["passed"] and report["end_to_end"]["iou_worst"] >= 0.99, report["failures"]
