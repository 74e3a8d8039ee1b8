"""Mixed precision chosen by measurement: keep in fp32 the fewest, most harmful parts until the bars hold.

A reduced-precision export (fp16 storage, dynamic int8) rounds every part of the encoder the same way; for some
weights a few parts cost the end-to-end mask IoU far more than the rest (a checkpoint with outlier channels:
``scripts/robustness_set.py``). This module picks, per checkpoint and at export time, which parts stay fp32:

  1. a ranking of the candidate parts, most harmful first, measured by the caller (fp16: each part rounded
     alone, its error on the encoder's outputs for calibration photos, ``export.precision.rank_fp16``; int8:
     the sensitivity sweep of ``export.int8_sensitivity``);
  2. ``choose_kept``: the all-reduced model measured, then the first k ranked parts kept fp32 for k = 1, 2, 3,
     ... until the measured worst and median meet the bars (plus ``MARGIN``, the emulation is not the runtime);
     if none within ``max_kept`` does, the selection says so (the export then refuses, naming the parts);
  3. a goal beyond the shipping bar (int8: median >= 0.99 over the bar's worst >= 0.95) that even keeping every
     candidate fp32 misses gives way to the shipping bar itself (``fallback``): the fewest parts that ship.

``choose_kept`` is a pure function of the ranking and a measuring callback (``Measure``), so any reduced path
(fp16 storage here, dynamic int8 in ``export.int8_sensitivity``, a calibrated int8 path) reuses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# kept parts -> (worst, median) end-to-end mask IoU with every other part reduced
Measure = Callable[[tuple[str, ...]], tuple[float, float]]
# the emulated IoUs must clear the bars by this much: the runtime's kernels round differently from eager
MARGIN = {"min_iou_worst": 0.001, "min_iou_median": 0.0001}
# prefix sizes tried after 0 (doubling, then a binary search: a long ranking costs few measurements)
STEPS = (1, 2, 4, 8, 16, 32, 64)
# end-to-end measurements one selection may spend (each encodes the click set's 5 photos once): all-reduced,
# everything kept, prefixes of 1, 2, 4, 8, 16, then 3 steps of binary search
MAX_MEASUREMENTS = 10


@dataclass(frozen=True)
class Trial:
    kept: tuple[str, ...]  # parts kept fp32 in this measurement
    iou_worst: float  # end-to-end worst mask IoU vs eager fp32 (upstream operations)
    iou_median: float  # median over the click set
    holds: bool  # meets the bars + MARGIN

    def as_dict(self) -> dict:
        return {
            "kept": list(self.kept),
            "iou_worst": self.iou_worst,
            "iou_median": self.iou_median,
            "holds": self.holds,
        }


@dataclass(frozen=True)
class Selection:
    kept: tuple[str, ...]  # the chosen parts kept fp32 (the last trial's when none holds)
    holds: bool  # the chosen set meets the bars (+ MARGIN) in the emulation
    trials: tuple[Trial, ...]  # every measurement, in order
    ranking: tuple[dict, ...] = ()  # the ranking's rows, most harmful first
    aimed_at: Mapping[str, float] | None = None  # the bars the choice aimed at (None: the bars asked for)
    max_kept: int | None = None  # the most parts the selection may keep fp32 (``widened`` keeps to it too)
    ranked_on: tuple[str, ...] = ()  # what the ranking measured, where the caller says (int8: the photos)
    draws: int = 1  # emulation draws each measurement took (int8: a click holds where it holds in every draw)

    @property
    def chosen(self) -> Trial:
        """The measurement of the chosen set (the last with that set)."""
        return next(t for t in reversed(self.trials) if t.kept == self.kept)

    def as_dict(self) -> dict:
        return {
            "kept_fp32": list(self.kept),
            "iou_worst": self.chosen.iou_worst,
            "iou_median": self.chosen.iou_median,
            "holds": self.holds,
            "trials": [t.as_dict() for t in self.trials],
            "ranking": list(self.ranking),
            **({"aimed_at": dict(self.aimed_at)} if self.aimed_at is not None else {}),
            **({"max_kept": self.max_kept} if self.max_kept is not None else {}),
            **({"ranked_on": list(self.ranked_on)} if self.ranked_on else {}),
            **({"draws": self.draws} if self.draws > 1 else {}),
        }


def meets(worst: float, median: float, bars: Mapping[str, float], margin: Mapping[str, float] = MARGIN) -> bool:
    """Whether (worst, median) clear ``bars`` (``min_iou_worst`` / ``min_iou_median`` of the bar table) + margin."""
    ok = True
    for key, value in (("min_iou_worst", worst), ("min_iou_median", median)):
        if key in bars:
            ok &= value >= bars[key] + margin.get(key, 0.0)
    return ok


def choose_kept(
    ranked: Sequence[str],
    measure: Measure,
    bars: Mapping[str, float],
    max_kept: int,
    margin: Mapping[str, float] = MARGIN,
    budget: int = MAX_MEASUREMENTS,
) -> Selection:
    """The smallest prefix of ``ranked`` (most harmful first) that, kept fp32, meets ``bars`` + ``margin`` by
    ``measure``: prefixes of 0, then ``STEPS`` sizes (doubling) up to ``max_kept``, then a binary search between
    the last failing and the first passing size; at most ``budget`` measurements (then: does not hold)."""
    trials: list[Trial] = []

    def run(k: int) -> Trial:
        kept = tuple(ranked[:k])
        worst, median = measure(kept)
        trials.append(Trial(kept, float(worst), float(median), meets(worst, median, bars, margin)))
        return trials[-1]

    top = min(max_kept, len(ranked))
    sizes = [0, *(s for s in STEPS if s < top)] + ([top] if top > 0 else [])
    last_fail = -1
    for k in sizes:
        if len(trials) >= budget:
            break
        if not run(k).holds:
            last_fail = k
            continue
        lo, hi = last_fail, k  # lo fails (or is -1), hi holds
        while hi - lo > 1 and len(trials) < budget:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if run(mid).holds else (mid, hi)
        return Selection(tuple(ranked[:hi]), True, tuple(trials))
    return Selection(trials[-1].kept, False, tuple(trials))


def select(
    ranking: Callable[[], list[dict]],
    measure: Measure,
    bars: Mapping[str, float],
    max_kept: int,
    margin: Mapping[str, float] = MARGIN,
    upper: Sequence[str] | None = None,
    budget: int = MAX_MEASUREMENTS,
    label: str = "mixed precision",
    fallback: Mapping[str, float] | None = None,
) -> Selection:
    """The whole selection, at most ``budget`` end-to-end measurements (a progress bar steps per measurement):
    the all-reduced model measured first (nothing kept if it holds: no ranking cost), then (``upper``: every
    candidate part) everything kept, to give up at once on bars nothing can meet, else ``ranking()`` (rows with
    a ``"part"`` key, most harmful first) then ``choose_kept`` over it (the all-reduced measurement reused).
    ``fallback`` (looser bars, the ones the export ships by): aimed at instead when everything kept misses
    ``bars`` but meets these; the selection then records ``aimed_at``."""
    measure = _with_progress(measure, f"{label}: end-to-end measurements (at most {budget})", budget)
    try:
        sel = _select(ranking, measure, bars, max_kept, margin, upper, budget, fallback)
        return dataclasses.replace(sel, max_kept=max_kept)
    finally:
        measure.close()


def _select(ranking, measure, bars, max_kept, margin, upper, budget, fallback) -> Selection:
    """``select``'s measurements (``measure`` counting them on a progress bar)."""
    base = measure(())
    first = Trial((), float(base[0]), float(base[1]), meets(*base, bars, margin))
    if first.holds or max_kept <= 0:
        return Selection((), first.holds, (first,))
    trials, aim = [first], None
    if upper is not None:  # every candidate kept: if even that misses the bars, no subset will
        top = measure(tuple(upper))
        trials.append(Trial(tuple(upper), float(top[0]), float(top[1]), meets(*top, bars, margin)))
        if not trials[-1].holds:
            if fallback is None or not meets(*top, fallback, margin):
                return Selection((), False, tuple(trials))
            aim = dict(fallback)
            if meets(*base, aim, margin):  # the all-reduced model already ships
                return Selection((), True, tuple(trials), aimed_at=aim)
    rows = ranking()

    def memo(kept: tuple[str, ...]) -> tuple[float, float]:
        return base if not kept else measure(kept)

    left = budget - len(trials)
    sel = choose_kept([r["part"] for r in rows], memo, aim or bars, max_kept, margin, left + 1)
    ordered = sel.trials[:1] + tuple(trials[1:]) + sel.trials[1:]  # all-reduced, everything kept, prefixes
    return Selection(sel.kept, sel.holds, ordered, tuple(rows), aimed_at=aim)


# conversions one export may add after its bundle missed an end-to-end bar that the emulation met (``widened``)
MAX_WIDENINGS = 2


def outcome(sel: dict) -> dict:
    """What a selection (``Selection.as_dict``) kept and reached: its kept parts, IoUs and whether it held."""
    return {k: sel[k] for k in ("kept_fp32", "iou_worst", "iou_median", "holds")}


def widened(sel: dict, worst: float, median: float) -> dict | None:
    """The selection ``sel`` (``Selection.as_dict``) with more of its ranking kept fp32, after the bundle built
    with its ``kept_fp32`` missed an end-to-end bar in its own check (``worst`` / ``median``): the emulation is
    not the runtime, so the runtime's measurement decides. The kept prefix doubles (at least one more part);
    ``bundle_checks`` records each missed measurement. Where nothing more can be kept - no ranking (the
    all-reduced model met the bars in the emulation), the selection's ``max_kept`` (or every ranked part) kept
    already, or ``MAX_WIDENINGS`` spent - an fp16-arithmetic selection with a storage recipe
    (``storage_fallback``) gives way to that recipe, measured afresh (``fp16_keep``); otherwise None, as where
    the emulation missed too."""
    ranking = [r["part"] for r in sel.get("ranking", [])]
    kept = list(sel["kept_fp32"])
    spent = sel.get("bundle_checks", [])
    top = min(len(ranking), sel.get("max_kept", len(ranking)))  # the selection's own limit
    missed = {"kept": len(kept), "iou_worst": float(worst), "iou_median": float(median)}
    if not sel["holds"] or len(spent) >= MAX_WIDENINGS or len(kept) >= top or ranking[: len(kept)] != kept:
        if not sel.get("storage_fallback"):
            return None
        return {
            "kept_fp32": [],
            "pending": "fp16 storage",
            "fp16_arithmetic": {**outcome(sel), "bundle_checks": [*spent, missed]},
        }
    k = min(top, max(2 * len(kept), len(kept) + 1))
    return {**sel, "kept_fp32": ranking[:k], "bundle_checks": [*spent, missed]}


class _with_progress:
    """``measure`` with a progress bar: one step per end-to-end measurement, noting the kept count and IoUs."""

    def __init__(self, measure: Measure, label: str, total: int) -> None:
        self.measure, self.label, self.total, self.bar = measure, label, total, None

    def __call__(self, kept: tuple[str, ...]) -> tuple[float, float]:
        from sam2edge.progress import Progress

        if self.bar is None:
            self.bar = Progress(self.label, self.total, "measurement")
        worst, median = self.measure(kept)
        self.bar.step(note=f"{len(kept)} kept fp32: worst {worst:.4f} median {median:.4f}")
        return worst, median

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def fp16_keep(job, target: str) -> tuple[str, ...]:
    """The encoder parts an fp16 export (``job``: ``export.pipeline.Job``) keeps fp32, chosen by measurement
    (``export.precision.select_fp16`` on the job's model and eager reference with ``target``'s fp16 emulation,
    at the job's fp16 bars); recorded in ``job.state["mixed_precision"]`` (card.json ``extra.mixed_precision``).
    Where that selection misses the bars and ``target`` has a storage recipe
    (``export.precision.STORAGE_FALLBACK``: fp16 weights, fp32 arithmetic), a second selection measures that
    recipe, and the record says so: ``arithmetic`` "fp32", ``fp16_arithmetic`` the first selection's outcome
    (``fp16_storage_only``). The same happens where the first selection held but its bundles missed the bars
    with every part ``widened`` could keep (its record then ``pending``)."""
    from sam2edge.checks.fidelity.bars import bars_for
    from sam2edge.export.precision import STORAGE_FALLBACK, select_fp16
    from sam2edge.progress import stage

    record = job.state.get("mixed_precision")
    if record is None or record.get("pending"):
        bars = bars_for("fp16", job.bars)
        if record is None:
            stage("fp16: measuring which encoder parts must stay fp32 (eager emulation vs the fp32 reference)")
            sel = select_fp16(job.model, job.cfg, job.reference(), bars, clicks=job.clicks, target=target)
            record = {**sel.as_dict(), **({"storage_fallback": True} if target in STORAGE_FALLBACK else {})}
            first = outcome(record)
        else:  # its bundle missed the bars with every part ``widened`` could keep (``bundle_checks``)
            first = record["fp16_arithmetic"]
        if record.get("pending") or (not first["holds"] and target in STORAGE_FALLBACK):
            stage(
                f"fp16: fp16 arithmetic missed the bars with {len(first['kept_fp32'])} parts kept fp32; measuring "
                "fp16 weights with fp32 arithmetic instead"
            )
            store = select_fp16(
                job.model, job.cfg, job.reference(), bars, clicks=job.clicks, emulation=STORAGE_FALLBACK[target]
            )
            record = {**store.as_dict(), "arithmetic": "fp32", "fp16_arithmetic": first}
        job.state["mixed_precision"] = record
    return tuple(job.state["mixed_precision"]["kept_fp32"])


def fp16_storage_only(job) -> bool:
    """Whether the job's fp16 bundle computes in fp32 on fp16-stored weights (``fp16_keep``'s fallback)."""
    return job.state.get("mixed_precision", {}).get("arithmetic") == "fp32"


def int8_keep(job, target: str) -> tuple[str, ...]:
    """The encoder Linears a dynamic-int8 export (``job``) keeps fp32, chosen by measurement
    (``export.int8_sensitivity.select_int8`` on the weights the export quantises, with ``target``'s
    activation granularity); recorded in ``job.state["mixed_precision"]``."""
    from sam2edge.checks.fidelity.bars import bars_for
    from sam2edge.export.int8_sensitivity import SELECTION_BARS, select_int8
    from sam2edge.progress import stage

    if "mixed_precision" not in job.state:
        stage("int8: measuring which encoder layers must stay fp32 (eager emulation vs the fp32 reference)")
        sd = {k: v.detach() for k, v in job.model.state_dict().items()}
        bars = {**SELECTION_BARS, **(job.bars or {})}
        ship = bars_for("int8", job.bars)
        ship = {k: v for k, v in ship.items() if k in ("min_iou_worst", "min_iou_median")}
        sel = select_int8(sd, job.cfg, target, job.reference(), bars, clicks=job.clicks, fallback=ship)
        job.state["mixed_precision"] = sel.as_dict()
    return tuple(job.state["mixed_precision"]["kept_fp32"])


def unheld_note(sel: Mapping | None) -> str:
    """One sentence for a bundle that passed its own check where its selection (``Selection.as_dict``) did not
    hold in the emulation ('' where it held, or no selection ran): the check is one CPU's rounding, and another
    CPU's may land where the emulation did."""
    if not sel or sel.get("holds", True) or not sel.get("trials"):
        return ""
    draws = f", the lowest of {sel['draws']} draws" if sel.get("draws", 1) > 1 else ""
    return (
        f"its emulation did not meet the bars with {len(sel['kept_fp32'])} layers kept fp32 (worst "
        f"{sel['iou_worst']:.4f}, median {sel['iou_median']:.4f}{draws}): this CPU's rounding passed, another "
        "CPU's may not; check the bundle on the device that will run it: `sam2edge verify DIR`"
    )
