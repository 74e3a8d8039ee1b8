"""Mixed precision chosen by measurement (``export.mixed``): which parts a reduced-precision export keeps fp32.

Unit: ``choose_kept`` returns the smallest prefix of the ranking that meets the bars, measures nothing it need
not, and says when no prefix holds. CI (TEST_SMALL, two seeds): checkpoints made fp16-fragile in one known
block by an exact fp32 reparametrisation (the attention's values scaled by 1e-5 and its output projection by
1e5: the same function in fp32, values in fp16's subnormal range) fail the fp16 bars with every weight rounded;
the selection finds that block, keeps it fp32 and then meets the bars, against eager fp32 with upstream's
operations; the real ONNX fp16 export ships with it kept fp32; a selection that cannot hold refuses the export
with the parts and IoUs it reached. Slow: the robustness set (``scripts/robustness_set.py``) at full size.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from sam2edge.checks.fidelity.bars import BARS
from sam2edge.checks.fidelity.checkpoints import variant_state_dict
from sam2edge.config import TEST_SMALL
from sam2edge.export.mixed import MARGIN, choose_kept, meets, select

FP16 = BARS["fp16"]
SOURCE = {"format": "synthetic", "sha256": None}
# (seed, block made fp16-fragile) for the two CI checkpoints
FRAGILE = (("synthetic:1", 1), ("synthetic:2", 3))


def fp16_fragile(sd: dict, block: int, scale: float = 1e-5) -> dict:
    """``sd`` with block ``block``'s attention values x ``scale`` and its output projection x 1/``scale``: the
    same function in fp32 (attention is linear in v), but v's weights (~2e-7) fall in fp16's subnormal range."""
    sd = dict(sd)
    pre = f"image_encoder.trunk.blocks.{block}.attn."
    w, b, proj = (sd[pre + k].clone() for k in ("qkv.weight", "qkv.bias", "proj.weight"))
    d = proj.shape[0]  # rows of qkv: q | k | v, d each
    w[2 * d :] *= scale
    b[2 * d :] *= scale
    sd[pre + "qkv.weight"], sd[pre + "qkv.bias"], sd[pre + "proj.weight"] = w, b, proj / scale
    return sd


def _needs(required: set[str], calls: list):
    """A measure that meets the fp16 bars exactly when every part of ``required`` is kept."""

    def measure(kept: tuple[str, ...]) -> tuple[float, float]:
        calls.append(kept)
        return (0.999, 0.9999) if required <= set(kept) else (0.95, 0.998)

    return measure


def test_choose_kept_returns_the_smallest_prefix_that_holds():
    ranked = [f"p{i}" for i in range(10)]
    calls: list = []
    sel = choose_kept(ranked, _needs({"p0", "p4"}, calls), FP16, max_kept=10, budget=10)
    assert sel.holds and sel.kept == ("p0", "p1", "p2", "p3", "p4")
    # 0, 1, 2, 4 fail, 8 holds; binary search: 6 holds, 5 holds
    assert [len(k) for k in calls] == [0, 1, 2, 4, 8, 6, 5]
    assert sel.chosen.iou_worst == 0.999 and sel.as_dict()["kept_fp32"] == list(sel.kept)


def test_choose_kept_says_when_nothing_holds_and_keeps_to_its_budget():
    calls: list = []
    sel = choose_kept(["a", "b", "c"], _needs({"z"}, calls), FP16, max_kept=2)
    assert not sel.holds and sel.kept == ("a", "b") and [len(k) for k in calls] == [0, 1, 2]
    calls.clear()
    sel = choose_kept([f"p{i}" for i in range(10)], _needs({"p6"}, calls), FP16, max_kept=10, budget=4)
    assert not sel.holds and [len(k) for k in calls] == [0, 1, 2, 4]


def test_select_skips_the_ranking_when_everything_reduced_holds():
    ranked: list = []
    sel = select(lambda: ranked.append(1) or [], lambda kept: (0.9995, 0.9999), FP16, max_kept=4)
    assert sel.holds and sel.kept == () and not ranked and len(sel.trials) == 1


def test_select_gives_up_at_once_when_keeping_everything_misses_the_bars():
    calls: list = []
    ranked: list = []
    bars = {"min_iou_worst": 1.01}  # nothing can meet it
    sel = select(lambda: ranked.append(1) or [], _needs({"a"}, calls), bars, max_kept=4, upper=["a", "b"])
    assert not sel.holds and sel.kept == () and not ranked and calls == [(), ("a", "b")]


INT8_SHIP = {"min_iou_worst": BARS["int8"]["min_iou_worst"]}
INT8_GOAL = {**INT8_SHIP, "min_iou_median": 0.99}


def _int8_weights(calls: list):
    """A measure whose median never reaches 0.99 (0.985 at best) but whose worst clears the int8 bar once
    "b" and "d" are kept fp32."""

    def measure(kept: tuple[str, ...]) -> tuple[float, float]:
        calls.append(kept)
        return (0.97, 0.985) if {"b", "d"} <= set(kept) else (0.80, 0.97)

    return measure


def test_select_aims_at_the_shipping_bar_when_the_goal_is_out_of_reach():
    calls: list = []
    ranking = [{"part": p} for p in ("d", "b", "a", "c")]
    sel = select(lambda: ranking, _int8_weights(calls), INT8_GOAL, max_kept=4, upper=["a", "b", "c", "d"],
                 fallback=INT8_SHIP)  # fmt: skip
    assert sel.holds and sel.kept == ("d", "b") and sel.aimed_at == INT8_SHIP
    assert [t.kept for t in sel.trials][:2] == [(), ("a", "b", "c", "d")]  # all-int8, then everything kept
    assert sel.as_dict()["aimed_at"] == INT8_SHIP and sel.chosen.iou_worst == 0.97
    # without a fallback the same weights are given up on at once (nothing ranked)
    calls.clear()
    sel = select(lambda: ranking, _int8_weights(calls), INT8_GOAL, max_kept=4, upper=["a", "b", "c", "d"])
    assert not sel.holds and sel.kept == () and len(calls) == 2 and "aimed_at" not in sel.as_dict()


def test_select_falls_back_to_nothing_kept_when_all_int8_already_ships():
    sel = select(lambda: pytest.fail("no ranking needed"), lambda kept: (0.96, 0.98), INT8_GOAL, max_kept=4,
                 upper=["a"], fallback=INT8_SHIP)  # fmt: skip
    assert sel.holds and sel.kept == () and sel.aimed_at == INT8_SHIP and len(sel.trials) == 2


def test_meets_applies_the_margin_and_fails_nan():
    assert meets(0.99 + MARGIN["min_iou_worst"], 0.999 + MARGIN["min_iou_median"], FP16)
    assert not meets(0.9905, 0.9995, FP16)  # over the bar, under bar + margin
    assert not meets(float("nan"), 1.0, FP16)


@pytest.mark.parametrize(("spec", "block"), FRAGILE)
def test_fp16_selection_keeps_the_fragile_block_and_meets_the_bars(spec, block):
    """All weights fp16-rounded misses a bar; the selection names the fragile block first and, kept fp32,
    the end-to-end IoU vs eager fp32 (upstream's operations, 40 clicks) meets the bars."""
    from sam2edge.checks.fidelity.measure import CachedReference
    from sam2edge.export.precision import EMULATIONS, select_fp16
    from sam2edge.model import UPSTREAM, build_sam2
    from sam2edge.runtime.backends import EagerBackend

    sd = fp16_fragile(variant_state_dict(spec, TEST_SMALL), block)
    model = build_sam2(TEST_SMALL, EMULATIONS["onnx"].rewrites)
    model.load_state_dict(sd)
    ref = CachedReference(EagerBackend.from_state_dict(sd, TEST_SMALL, UPSTREAM))
    sel = select_fp16(model.eval(), TEST_SMALL, ref, FP16)
    base = sel.trials[0]
    assert base.kept == () and not meets(base.iou_worst, base.iou_median, FP16, {}), base
    assert sel.ranking[0]["part"] == f"image_encoder.trunk.blocks.{block}", sel.ranking[:3]
    assert sel.holds and sel.kept == (f"image_encoder.trunk.blocks.{block}",), sel.as_dict()
    assert sel.chosen.iou_worst >= FP16["min_iou_worst"] and sel.chosen.iou_median >= FP16["min_iou_median"]


def test_onnx_fp16_export_ships_with_the_measured_part_fp32(tmp_path):
    """The real export: fp16_storage keeps the chosen block's initializers fp32 (found by owner), the
    bundle's own fidelity (onnxruntime vs eager fp32) meets the fp16 bars, and the card records the choice."""
    import onnx
    from onnx import TensorProto

    from sam2edge.export.onnx_fp16 import initializer_owners
    from sam2edge.export.pipeline import run_export

    spec, block = FRAGILE[0]
    sd = fp16_fragile(variant_state_dict(spec, TEST_SMALL), block)
    card = run_export("onnx", "test-small", "fp16", tmp_path / "b", weights=(sd, {**SOURCE, "checkpoint": spec}))
    e2e, mixed = card["fidelity"]["end_to_end"], card["extra"]["mixed_precision"]
    assert card["status"] == "shippable" and e2e["iou_worst"] >= FP16["min_iou_worst"], e2e
    assert e2e["iou_median"] >= FP16["min_iou_median"] and mixed["kept_fp32"] == [f"image_encoder.trunk.blocks.{block}"]
    graph = onnx.load(str(tmp_path / "b" / "encoder.onnx")).graph
    owners = initializer_owners(graph)
    big = [i for i in graph.initializer if len(i.dims) and torch.Size(i.dims).numel() >= 256]
    in_block = {i.name: i.data_type for i in big if owners[i.name].startswith(f"image_encoder.trunk.blocks.{block}.")}
    assert in_block and set(in_block.values()) == {TensorProto.FLOAT}, in_block
    others = [i.data_type for i in big if owners[i.name].startswith("image_encoder.trunk.blocks.0.")]
    assert others and set(others) == {TensorProto.FLOAT16}


def test_export_refused_when_the_selection_cannot_hold(tmp_path, monkeypatch):
    """With nothing allowed fp32 (max_kept 0) the fragile checkpoint's fp16 export is refused: one line with the
    failing clicks (photo, prompt kind, IoU) and what the selection kept and reached; nothing is written."""
    import re

    from sam2edge.errors import UserError
    from sam2edge.export import precision
    from sam2edge.export.pipeline import run_export

    spec, block = FRAGILE[1]
    sd = fp16_fragile(variant_state_dict(spec, TEST_SMALL), block)
    real = precision.select_fp16
    monkeypatch.setattr(precision, "select_fp16", lambda *a, **k: real(*a, **{**k, "max_kept": 0}))
    out = tmp_path / "b"
    with pytest.raises(UserError) as err:
        run_export("onnx", "test-small", "fp16", out, weights=(sd, {**SOURCE, "checkpoint": spec}))
    msg = str(err.value)
    assert not out.exists() and "\n" not in msg and msg.startswith("export refused: end-to-end mask IoU"), msg
    assert "keeping nothing in fp32 still missed the bars in the eager emulation (worst " in msg, msg
    assert re.search(r"IoU (worst|median) 0\.\d{4} < 0\.99", msg) and "sam2edge diagnose onnx" in msg, msg
    assert re.search(r"\((lowest: )?\S+\.(png|jpg) [a-z+]+ #\d+ 0\.\d{4}", msg), msg  # photo, kind, index, IoU
    # and how fragile the reference mask is (its area, its logits near the threshold)
    assert re.search(r"0\.\d{4} \[reference mask \d+ px, \d+% of its logits within \+-0\.1 of 0\]", msg), msg


def test_widened_doubles_the_kept_prefix_and_records_the_bundle_it_replaces():
    """After a bundle misses a bar its emulation met, the next selection keeps twice the ranked prefix (at least
    one more part) and records the bundle's measurement; it gives up where nothing more can be kept."""
    from sam2edge.export.mixed import MAX_WIDENINGS, widened

    ranking = [{"part": p} for p in "abcdefg"]
    sel = {"kept_fp32": ["a", "b"], "holds": True, "ranking": ranking, "iou_worst": 0.97, "iou_median": 0.99}
    more = widened(sel, 0.9494, 0.988)
    assert more["kept_fp32"] == ["a", "b", "c", "d"] and sel["kept_fp32"] == ["a", "b"]
    assert more["bundle_checks"] == [{"kept": 2, "iou_worst": 0.9494, "iou_median": 0.988}]
    assert widened({**sel, "kept_fp32": []}, 0.9, 0.98)["kept_fp32"] == ["a"]
    last = more
    for _ in range(MAX_WIDENINGS - 1):
        last = widened(last, 0.9, 0.98)
    assert last["kept_fp32"] == list("abcdefg") and widened(last, 0.9, 0.98) is None  # budget spent
    assert widened({**sel, "holds": False}, 0.9, 0.98) is None  # the emulation missed too
    assert widened({**sel, "ranking": []}, 0.9, 0.98) is None  # nothing ranked (all-reduced held)
    assert widened({**sel, "kept_fp32": list("abcdefg")}, 0.9, 0.98) is None  # everything kept already
    assert widened({**sel, "kept_fp32": ["b"]}, 0.9, 0.98) is None  # not the ranking's prefix
    capped = widened({**sel, "max_kept": 3}, 0.9, 0.98)  # the selection's own limit holds too
    assert capped["kept_fp32"] == ["a", "b", "c"] and widened(capped, 0.9, 0.98) is None


def test_export_keeps_more_when_its_bundle_misses_a_bar_the_emulation_met(tmp_path, monkeypatch):
    """An emulation that says nothing need stay fp32 while the bundle's own check misses the bar: the export
    converts again keeping the ranking's first part, ships, and the card records the missed bundle."""
    from sam2edge.export import precision
    from sam2edge.export.mixed import Selection, Trial
    from sam2edge.export.pipeline import run_export

    spec, block = FRAGILE[0]
    sd = fp16_fragile(variant_state_dict(spec, TEST_SMALL), block)
    rows = ({"part": f"image_encoder.trunk.blocks.{block}"}, {"part": "image_encoder.trunk.blocks.0"})
    wrong = Selection((), True, (Trial((), 0.999, 0.9999, True),), rows)  # an emulation that misses the fragility
    monkeypatch.setattr(precision, "select_fp16", lambda *a, **k: wrong)
    card = run_export("onnx", "test-small", "fp16", tmp_path / "b", weights=(sd, {**SOURCE, "checkpoint": spec}))
    mixed, e2e = card["extra"]["mixed_precision"], card["fidelity"]["end_to_end"]
    assert card["status"] == "shippable" and mixed["kept_fp32"] == [rows[0]["part"]], mixed
    (missed,) = mixed["bundle_checks"]
    assert missed["kept"] == 0 and missed["iou_median"] < FP16["min_iou_median"] <= e2e["iou_median"], missed
    assert card["extra"]["stage_seconds"]["fidelity"] > 0


def test_export_that_passes_where_its_selection_did_not_hold_says_so(tmp_path, monkeypatch, capsys):
    """A bundle whose own check passes while its selection did not hold ships as its check says, and the export
    says, as it ends, that another CPU's rounding may miss (its card too)."""
    from sam2edge.export import precision
    from sam2edge.export.mixed import Selection, Trial
    from sam2edge.export.pipeline import run_export

    unheld = Selection((), False, (Trial((), 0.9, 0.99, False),), ({"part": "image_encoder.trunk.blocks.0"},))
    monkeypatch.setattr(precision, "select_fp16", lambda *a, **k: unheld)
    sd = variant_state_dict("synthetic:0", TEST_SMALL)
    source = {**SOURCE, "checkpoint": "synthetic:0"}
    card = run_export("onnx", "test-small", "fp16", tmp_path / "b", weights=(sd, source))
    assert card["status"] == "shippable" and card["extra"]["mixed_precision"]["holds"] is False
    err = capsys.readouterr().err
    assert "fp16: the bundle passed its check, but its emulation did not meet the bars with 0 layers kept" in err
    from sam2edge.cards.render import render_bundle

    assert "The bundle passed, but its emulation" in render_bundle(tmp_path / "b")["readme"].read_text()


def test_refusal_note_names_the_emulated_choice_and_each_bundle_that_missed():
    """After widening, the refusal's note counts the layers the emulation chose (not its last trial's) and lists
    every bundle that missed."""
    from sam2edge.export.pipeline import mixed_note

    trials = [{"kept": [], "iou_worst": 0.9, "iou_median": 0.98}, {"kept": list("abc"), "iou_worst": 0.97}]
    sel = {"kept_fp32": list("abcdef"), "holds": True, "iou_worst": 0.9772, "iou_median": 0.9902, "trials": trials}
    sel["bundle_checks"] = [{"kept": 2, "iou_worst": 0.9494, "iou_median": 0.9892}]
    note = mixed_note(sel)
    assert note.startswith("the eager emulation met the bars with 2 layers kept (worst 0.9772, median 0.9902)")
    assert "the bundle with 2 kept missed (worst 0.9494, median 0.9892); " in note, note
    drawn = mixed_note({**sel, "draws": 3})
    assert drawn.startswith(
        "the eager emulation met the bars with 2 layers kept (worst 0.9772, median 0.9902, the lowest of 3 draws)"
    )


def test_a_bundle_that_passes_where_its_selection_did_not_hold_says_so_on_its_card():
    """An int8 bundle whose check passed while the emulation's draws missed with every tried set kept: its card
    says that this CPU's rounding passed and to check it on the device; nothing where the selection held, where
    the bundle was refused, or where no selection ran."""
    from sam2edge.cards.precision import precision_section
    from sam2edge.export.mixed import unheld_note

    trials = [{"kept": [], "iou_worst": 0.8571, "iou_median": 0.99}, {"kept": list("ab"), "iou_worst": 0.875}]
    sel = {"kept_fp32": list("ab"), "holds": False, "iou_worst": 0.875, "iou_median": 0.991, "trials": trials}
    fid = {
        "passed": True,
        "end_to_end": {"clicks": 40, "iou_worst": 0.9545, "iou_median": 0.9942},
        "bars": BARS["int8"],
    }
    card = {"precision": "int8", "target": "onnx", "extra": {"mixed_precision": {**sel, "draws": 3}}}
    text = "\n".join(precision_section(card, fid))
    assert (
        "The bundle passed, but its emulation did not meet the bars with 2 layers kept fp32 (worst 0.8750, median "
        "0.9910, the lowest of 3 draws): this CPU's rounding passed, another CPU's may not; check the bundle on the "
        "device that will run it: `sam2edge verify DIR`." in text
    ), text
    assert "lowest of" not in unheld_note(sel) and unheld_note(sel).startswith("its emulation did not meet")
    assert not unheld_note({**sel, "holds": True}) and not unheld_note(None) and not unheld_note({**sel, "trials": []})
    refused = "\n".join(precision_section(card, {**fid, "passed": False}))
    assert "The bundle passed" not in refused and "The bundle passed" not in "\n".join(
        precision_section({**card, "extra": {}}, fid)
    )


def int8_outliers(sd: dict, seed: int, gain: float = 10.0, channels: int = 2) -> dict:
    """``sd`` with ``channels`` random channels of every Hiera LayerNorm weight x ``gain``: activations with
    outlier channels, which widen a per-tensor int8 range (benchmarks/int8_smoothing.py's ``:outliers``)."""
    sd = dict(sd)
    g = torch.Generator().manual_seed(seed)
    for k in list(sd):
        if k.startswith("image_encoder.trunk.blocks.") and ".norm" in k and k.endswith(".weight"):
            w = sd[k].clone()
            w[torch.randperm(w.shape[0], generator=g)[:channels]] *= gain
            sd[k] = w
    return sd


@pytest.mark.parametrize("spec", ["synthetic:1", "synthetic:2"])
def test_int8_selection_keeps_sensitive_layers_until_the_goal_holds(spec):
    """ONNX's int8 (per-tensor activations) on the smoothed weights the export quantises, with outlier channels:
    the all-int8 encoder misses the goal (worst >= 0.95, median >= 0.99); the selection keeps the layers the
    sweep ranks first, and the kept set meets it (20 clicks vs eager fp32, upstream's operations)."""
    from sam2edge.checks.fidelity.measure import CachedReference
    from sam2edge.export.int8_sensitivity import SELECTION_BARS, select_int8
    from sam2edge.export.onnx import ONNX_REWRITES
    from sam2edge.export.smooth import smoothed
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend

    sd = int8_outliers(variant_state_dict(spec, TEST_SMALL), seed=5)
    ref = CachedReference(EagerBackend.from_state_dict(sd, TEST_SMALL, UPSTREAM))
    sel = select_int8(smoothed(sd, TEST_SMALL, ONNX_REWRITES)[0], TEST_SMALL, "onnx", ref, clicks=20, rank_clicks=5)
    base = sel.trials[0]
    assert base.kept == () and not meets(base.iou_worst, base.iou_median, SELECTION_BARS, {}), base
    assert sel.holds and 0 < len(sel.kept) < 8, sel.as_dict()["trials"]
    assert list(sel.kept) == [r["part"] for r in sel.ranking[: len(sel.kept)]]  # the ranking's prefix
    assert meets(sel.chosen.iou_worst, sel.chosen.iou_median, SELECTION_BARS, {})


class _FakeInt8Emulation:
    """Stands in for ``Int8Emulation``: every click reads 0.999 but the box+point click of ``BAD``, which only
    layer "b" kept fp32 lifts; layer "a" kept fp32 lifts the point clicks a little (a ranking over point clicks
    alone would put it first). ``median_only``: every click reads 0.985 unless "c" is kept."""

    BAD, median_only, calls = "", False, []

    def __init__(self, sd, cfg, target, reference) -> None:
        self.layers = {"a": None, "b": None, "c": None}

    def ious(self, prompts, kept=(), draw=0):
        type(self).calls.append((tuple(kept), [(p.photo, p.kind) for p in prompts]))
        if self.median_only:
            return [0.995 if "c" in kept else 0.985 for _ in prompts]
        out = []
        for p in prompts:
            v = 0.9995 if ("a" in kept and p.kind == "point") else 0.999
            if (p.photo, p.kind) == (self.BAD, "box+point"):
                v = 0.99 if "b" in kept else 0.90
            out.append(v)
        return out


@pytest.mark.parametrize("median_only", [False, True])
def test_int8_ranking_measures_every_click_of_the_photos_that_failed(monkeypatch, median_only):
    """The clicks under the worst bar decide what the ranking measures: every click of their photos (all four
    prompt kinds, one encode each), so the layer that lifts a failing box click is ranked first and kept; where
    only the median misses, the point clicks of ``click_set(rank_clicks)``."""
    from sam2edge.checks.fidelity import click_set
    from sam2edge.export import int8_sensitivity as s8

    bad = click_set(40)[3].photo
    monkeypatch.setattr(_FakeInt8Emulation, "BAD", bad)
    monkeypatch.setattr(_FakeInt8Emulation, "median_only", median_only)
    monkeypatch.setattr(_FakeInt8Emulation, "calls", [])
    monkeypatch.setattr(s8, "Int8Emulation", _FakeInt8Emulation)
    sel = s8.select_int8({}, TEST_SMALL, "executorch", None, clicks=40, rank_clicks=10)
    alone = [prompts for kept, prompts in _FakeInt8Emulation.calls if len(kept) == 1 and len(prompts) < 40]
    assert len(alone) == 3 and sel.holds
    if median_only:
        assert sel.ranked_on == ("click_set(10)",) and sel.kept == ("c",)
        assert all(p == [(q.photo, q.kind) for q in click_set(10)] for p in alone)
    else:
        assert sel.ranked_on == (bad,) and sel.kept == ("b",), sel.as_dict()
        for prompts in alone:
            assert {photo for photo, _ in prompts} == {bad}
            assert {kind for _, kind in prompts} == {"point", "points", "box", "box+point"}
    assert sel.as_dict()["ranked_on"] == list(sel.ranked_on)


class _DrawnInt8Emulation:
    """Stands in for ``Int8Emulation``: every click reads 0.999 in every draw but the first click in draw 2,
    which reads 0.90 unless layer "d" is kept fp32 (an XNNPACK program is one more draw)."""

    calls: list = []

    def __init__(self, sd, cfg, target, reference) -> None:
        self.layers = {"a": None, "d": None}

    def ious(self, prompts, kept=(), draw=0):
        type(self).calls.append((tuple(kept), len(prompts), draw))
        return [0.90 if i == 0 and draw == 2 and "d" not in kept else 0.999 for i in range(len(prompts))]


@pytest.mark.parametrize("draws", [1, 3])
def test_int8_selection_holds_in_every_draw(monkeypatch, draws):
    """A click that fails in one emulation draw fails the measurement: with 3 draws the layer that lifts it in
    that draw is ranked on that draw and kept; with one draw nothing is kept."""
    from sam2edge.checks.fidelity import click_set
    from sam2edge.export import int8_sensitivity as s8

    monkeypatch.setattr(_DrawnInt8Emulation, "calls", [])
    monkeypatch.setattr(s8, "Int8Emulation", _DrawnInt8Emulation)
    sel = s8.select_int8({}, TEST_SMALL, "executorch", None, clicks=40, draws=draws)
    assert sel.holds and sel.draws == draws
    if draws == 1:
        assert sel.kept == () and {d for *_, d in _DrawnInt8Emulation.calls} == {0}
        return
    assert sel.kept == ("d",), sel.as_dict()
    assert sel.as_dict()["draws"] == 3 and sel.ranked_on == (click_set(40)[0].photo,)
    ranked = [draw for kept, n, draw in _DrawnInt8Emulation.calls if len(kept) == 1 and n < 40]
    assert ranked == [2, 2]  # each layer kept alone, on the draw that failed
    measured = [(kept, draw) for kept, n, draw in _DrawnInt8Emulation.calls if n == 40]
    assert ((), 1) in measured and (("a", "d"), 1) not in measured  # every layer kept: fp32, one draw


class _GroupInt8Emulation:
    """Stands in for ``Int8Emulation`` of a LiteRT encoder: a Linear "a" and two 1x1 convolutions; the first click
    reads 0.90 unless both convolutions are kept fp32; "a" kept alone lifts the mean a little."""

    def __init__(self, sd, cfg, target, reference) -> None:
        from types import SimpleNamespace

        self.layers = {"a": SimpleNamespace(int8_granularity="per_token")}
        self.layers |= {c: SimpleNamespace(int8_granularity="per_pixel") for c in ("c1", "c2")}

    def ious(self, prompts, kept=(), draw=0):
        rest = 0.9995 if "a" in kept else 0.999
        return [0.99 if i == 0 and {"c1", "c2"} <= set(kept) else 0.90 if i == 0 else rest for i in range(len(prompts))]


def test_int8_ranking_puts_the_1x1_convolutions_first_when_only_together_they_lift_the_worst(monkeypatch):
    """LiteRT's 1x1 convolutions read the trunk's outlier channels; kept fp32 one at a time none lifts the worst
    click, kept together they do. The ranking measures them together too and ranks them first, so the selection
    keeps the two convolutions and not the Linear that a ranking of single layers puts first."""
    from sam2edge.export import int8_sensitivity as s8

    monkeypatch.setattr(s8, "Int8Emulation", _GroupInt8Emulation)
    sel = s8.select_int8({}, TEST_SMALL, "litert", None, clicks=40, draws=1)
    assert sel.holds and sel.kept == ("c1", "c2"), sel.as_dict()
    first, second, last = sel.ranking
    assert (first["part"], second["part"], last["part"]) == ("c1", "c2", "a")
    assert (
        first["kept_together_with"] == 1
        and first["iou_worst_kept_together"] == 0.99
        and "iou_worst_kept_together" not in last
    )
    rows = [{"part": p, "iou_worst_kept_alone": w, "iou_mean_kept_alone": 0.99} for p, w in (("a", 0.995), ("c1", 0.9))]
    assert s8._group_first(rows, ("c1", "c2"), 0.99, 1.0) == rows  # one layer lifts more alone: as ranked


def test_int8_emulation_draws_are_reproducible_and_dither_only_the_rounding():
    """``fake_quant_activation`` with a dither generator: the same seed gives the same values; another seed
    moves a few elements by one quantisation step and no more (the dither is far under a step)."""
    from sam2edge.export.int8_sensitivity import fake_quant_activation

    for seed in (0, 1):
        x = torch.randn(64, 96, generator=torch.Generator().manual_seed(seed)) * 3
        plain = fake_quant_activation(x, "per_token")
        one = fake_quant_activation(x, "per_token", torch.Generator().manual_seed(1))
        again = fake_quant_activation(x, "per_token", torch.Generator().manual_seed(1))
        other = fake_quant_activation(x, "per_token", torch.Generator().manual_seed(2))
        torch.testing.assert_close(one, again, rtol=0, atol=0)
        step = ((x.amax(-1).clamp_min(0) - x.amin(-1).clamp_max(0)) / 255).unsqueeze(-1)
        for y in (one, other):
            moved = (y - plain).abs() / step
            assert moved.max() < 1 + 1e-3 and (moved > 0.5).float().mean() < 0.01


def test_executorch_keeps_the_chosen_layers_out_of_int8_and_fp16():
    """ExecuTorch: the XNNPACK quantizer leaves a kept Linear fp32 (one weight dequantisation fewer), and
    ``fp16_encoder`` leaves a kept part fp32 (weights and arithmetic), by module name under the graph's model."""
    from sam2edge.export.executorch import _quantize_int8
    from sam2edge.export.executorch_graphs import fp16_encoder

    class Graph(torch.nn.Module):  # a graph wrapper holding ``model`` as export.wrappers' graphs do
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Module()
            self.model.a, self.model.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            return self.model.b(torch.relu(self.model.a(x)))

    torch.manual_seed(0)
    graph, args = Graph().eval(), (torch.randn(4, 32),)

    def weight_dequants(keep: tuple[str, ...]) -> int:
        q = _quantize_int8(graph, args, keep)
        return sum("dequantize_per_channel" in str(n.target) for n in q.graph.nodes if n.op == "call_function")

    assert weight_dequants(()) == 2 and weight_dequants(("a",)) == 1 and weight_dequants(("a", "b")) == 0
    half = fp16_encoder(graph, keep=("b",))
    dtypes = {n: p.dtype for n, p in half.inner.named_parameters()}
    assert dtypes["model.a.weight"] == torch.float16 and dtypes["model.b.module.weight"] == torch.float32, dtypes
    with torch.no_grad():  # b runs fp32 on a's fp16 output: its input rounded to fp16, its product fp32
        hidden = torch.relu(copy.deepcopy(graph.model.a).half()(args[0].half())).float()
        (got,) = half(*args)  # HalfGraph: the outputs as a tuple
        torch.testing.assert_close(got, graph.model.b(hidden).half().float(), rtol=0, atol=0)
    assert {p.dtype for p in graph.parameters()} == {torch.float32}  # the graph it was made from is left as it was


def test_executorch_keeps_a_split_qkv_layer_out_of_int8():
    """Hiera's q / k / v run as three products of row blocks cut from ``attn.qkv`` (``Rewrites.qkv="split"``,
    ExecuTorch's form): keeping ``attn.qkv`` fp32 leaves all three fp32 (they run inside that layer's scope)."""
    from sam2edge.export.executorch import REWRITES, _quantize_int8
    from sam2edge.export.executorch_graphs import XnnEncoderGraph, encoder_inputs
    from sam2edge.model import build_sam2
    from sam2edge.weights import synthetic_state_dict

    model = build_sam2(TEST_SMALL, REWRITES)
    model.load_state_dict(synthetic_state_dict(TEST_SMALL))
    graph, args = XnnEncoderGraph(model.eval()).eval(), encoder_inputs(TEST_SMALL)

    def quantised_weights(keep: tuple[str, ...]) -> set[str]:  # names of the weights behind int8 products
        q = _quantize_int8(graph, args, keep)
        deq = [n for n in q.graph.nodes if n.op == "call_function" and "dequantize_per_channel" in str(n.target)]
        return {str(n.args[0].target) for n in deq}

    assert REWRITES.qkv == "split"
    every, kept = quantised_weights(()), quantised_weights(("image_encoder.trunk.blocks.0.attn.qkv",))
    assert len(every) - len(kept) == 3, (len(every), len(kept))
    assert len(quantised_weights(("image_encoder.trunk.blocks.0.attn",))) == len(every) - 4  # q, k, v and proj


def test_onnx_keeps_a_split_qkv_layer_out_of_int8(tmp_path):
    """ONNX's encoder runs q / k / v split too (``ONNX_REWRITES.qkv``): a kept ``attn.qkv`` names its three
    MatMuls, and the quantised file leaves exactly those fp32."""
    import onnx

    from sam2edge.export import onnx as eo
    from sam2edge.export.onnx_int8 import nodes_of, quantize_int8
    from sam2edge.export.pipeline import export_model
    from sam2edge.export.wrappers import EncoderGraph
    from sam2edge.weights import synthetic_state_dict

    model = export_model(synthetic_state_dict(TEST_SMALL), TEST_SMALL, "fp32", eo.ONNX_REWRITES).eval()
    raw, opt = tmp_path / "raw.onnx", tmp_path / "opt.onnx"
    names_in, names_out, _ = eo.IO["encoder"]
    with torch.no_grad():
        torch.onnx.export(EncoderGraph(model), eo.example_inputs(TEST_SMALL)[0], str(raw), dynamo=False,
                          opset_version=eo.OPSET, input_names=list(names_in), output_names=list(names_out))  # fmt: skip
    eo.optimize(raw, opt)
    layer = "image_encoder.trunk.blocks.0.attn.qkv"
    kept = nodes_of(opt, (layer,))
    assert eo.ONNX_REWRITES.qkv == "split" and len(kept) == 3 and all("/attn/qkv/" in n for n in kept), kept
    count = {}
    for keep in ((), (layer,)):
        dst = tmp_path / f"int8_{len(keep)}.onnx"
        quantize_int8(opt, dst, keep=keep)
        count[keep] = [n.op_type for n in onnx.load(str(dst)).graph.node].count("MatMulInteger")
    assert count[()] - count[(layer,)] == 3, count


@pytest.fixture(scope="module")
def robustness_set(tmp_path_factory):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "robustness_set.py"
    spec = importlib.util.spec_from_file_location("robustness_set", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_set(tmp_path_factory.mktemp("robustness_set"))


# the reduced-precision goal on every checkpoint: the fp16 bars; int8's bar (worst) and a median of 0.99
GOAL = {"fp16": FP16, "int8": {"min_iou_worst": BARS["int8"]["min_iou_worst"], "min_iou_median": 0.99}}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("target", ["onnx", "executorch", "litert"])
def test_reduced_exports_ship_on_the_robustness_set(robustness_set, target, precision, tmp_path):
    """Full size (1024 px Hiera-Tiny), the real converter and runtime, every checkpoint of the set: the export
    (with its measured choice of parts kept fp32) ships, and its own 40-click fidelity meets the goal."""
    from sam2edge.export.pipeline import run_export

    bad = []
    for name, path in robustness_set.items():
        out = tmp_path / name
        card = run_export(target, "sam2.1-hiera-tiny", precision, out, checkpoint=str(path), force=True)
        e2e = card["fidelity"]["end_to_end"]
        if card["status"] != "shippable" or not meets(e2e["iou_worst"], e2e["iou_median"], GOAL[precision], {}):
            kept = card["extra"].get("mixed_precision", {}).get("kept_fp32")
            bad.append((name, card["status"], e2e["iou_worst"], e2e["iou_median"], kept))
    assert not bad, (target, precision, bad)


def test_fp16_encoder_exports_a_graph_that_reads_a_parameter_directly():
    """A graph reading one of its model's parameters outside a submodule call (EdgeTAM's frame encoder adds
    ``model.no_mem_embed``) survives ``torch.export(...).module()``, which ExecuTorch's lowering calls: the
    wrapper's submodule must not be named ``graph`` (the unlifted GraphModule's own attribute)."""
    from sam2edge.export.executorch_graphs import fp16_encoder

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.embed = torch.nn.Parameter(torch.randn(8))

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Model()

        def forward(self, x):
            return self.model.lin(x) + self.model.embed

    graph, x = Graph().eval(), torch.randn(2, 8)
    module = torch.export.export(fp16_encoder(graph), (x,)).module()
    m = graph.model
    want = (torch.nn.functional.linear(x.half(), m.lin.weight.half(), m.lin.bias.half()) + m.embed.half()).float()
    (got,) = module(x)  # HalfGraph: the outputs as a tuple
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_smoothing_leaves_a_convolutional_trunk_alone():
    """EdgeTAM's RepViT has no LayerNorm -> Linear pairs: int8 smoothing calibrates nothing there (and does
    not fail), while Hiera's blocks give one pair per norm, one for the values and one for the MLP's hidden
    activations (``INPUTS``)."""
    from sam2edge.config import get_config
    from sam2edge.export.smooth import INPUTS, PAIRS, calibrate
    from sam2edge.model import build_sam2

    for name, pairs in (("test-small-edgetam", 0), ("test-small", None)):
        cfg = get_config(name)
        model = build_sam2(cfg).eval()
        got = calibrate(model, cfg, photos=("horse.png",))
        want = len(model.image_encoder.trunk.blocks) * (len(PAIRS) + len(INPUTS)) if pairs is None else pairs
        assert len(got) == want, (name, len(got))


class _CountingPredictor:
    """A predictor whose mask is a per-photo value: counts its encodes (``set_image`` calls)."""

    def __init__(self, shift: int) -> None:
        self.encodes, self.shift, self.image = 0, shift, None

    def set_image(self, image) -> None:
        self.encodes += 1
        self.image = image

    def predict(self, point_coords=None, point_labels=None, box=None, multimask_output=True):
        masks = np.zeros((1, 8, 8), bool)
        masks[0, : 1 + int(self.image.sum() + self.shift) % 8] = True  # rows set: a function of the photo
        return masks, np.ones(1), np.zeros((1, 8, 8))


def test_selection_measurements_encode_each_photo_once_and_keep_the_prompts_order():
    from sam2edge.checks.fidelity import click_set
    from sam2edge.checks.fidelity.metrics import mask_iou
    from sam2edge.checks.photos import photo
    from sam2edge.export.precision import _ious

    prompts = click_set(10)  # cycles through 5 photos: in its own order every click changes photo
    ref, test = _CountingPredictor(0), _CountingPredictor(3)
    got = _ious(ref, test, prompts)
    assert ref.encodes == test.encodes == len({p.photo for p in prompts}) == 5
    slow_ref, slow_test = _CountingPredictor(0), _CountingPredictor(3)
    one_by_one = []
    for p in prompts:  # each prompt on its own photo, in the prompts' order
        slow_ref.set_image(photo(p.photo))
        slow_test.set_image(photo(p.photo))
        one_by_one.append(mask_iou(slow_test.predict()[0][0], slow_ref.predict()[0][0]))
    assert slow_test.encodes == 10 and got == one_by_one and len(set(got)) > 1


def test_lowest_clicks_say_how_fragile_the_reference_mask_is():
    from sam2edge.checks.fidelity import click_set
    from sam2edge.checks.fidelity.metrics import end_to_end
    from sam2edge.checks.photos import photo

    prompts = click_set(10)
    ref = _CountingPredictor(0)
    e2e = end_to_end(ref, _CountingPredictor(3), prompts)
    for c in e2e["lowest_clicks"]:
        ref.set_image(photo(prompts[c["index"]].photo))
        masks, _, _ = ref.predict()
        assert c["ref_mask_px"] == int(masks[0].sum()) > 0 and c["ref_logits_near_0"] == 1.0  # its logits are all 0
