"""Model card section of a reduced-precision bundle: its measured mask IoU against the bars, and what its
export kept in fp32 and why (card.json ``extra.fp32_kept``, written by the export)."""

from __future__ import annotations

from sam2edge.cards.sections import _num, _table
from sam2edge.checks.bench.records import cpu_name
from sam2edge.checks.fidelity.bars import bars_for
from sam2edge.export.mixed import unheld_note

BAR_LABELS = {"min_iou_worst": "worst", "min_iou_median": "median"}  # end-to-end bars shown here


def precision_section(card: dict, fid: dict) -> list[str]:
    """``## Reduced precision`` for fp16 / int8 bundles (nothing for fp32): the export's own end-to-end
    measurement (worst and median mask IoU vs eager fp32), its bars, and the fp32-kept parts with reasons."""
    precision = card["precision"]
    if precision == "fp32":
        return []
    e2e = fid.get("end_to_end") if isinstance(fid.get("end_to_end"), dict) else {}
    bars = {k: v for k, v in (fid.get("bars") or bars_for(precision)).items() if k in BAR_LABELS}
    lines = [f"## Reduced precision ({precision})", ""]
    if e2e:
        measured = {"min_iou_worst": e2e.get("iou_worst"), "min_iou_median": e2e.get("iou_median")}
        rows = [
            [
                f"mask IoU {BAR_LABELS[k]}",
                _num(measured[k], 5),
                f">= {bar}",
                "pass" if _passes(measured[k], bar) else "FAIL",
            ]
            for k, bar in bars.items()
        ]
        lines += [
            f"Measured by the export on {e2e.get('clicks', '?')} clicks against eager fp32 (upstream operations)"
            f"{_measured_on(fid.get('machine'), precision)}:",
            "",
            *_table(["Metric", "Measured", "Bar", "Verdict"], rows),
            "",
        ]
        mixed = (card.get("extra") or {}).get("mixed_precision") or {}
        if precision == "fp16" and card.get("target") == "executorch" and mixed.get("arithmetic") != "fp32":
            lines += [FP16_ARITHMETIC_NOTE, ""]
        unheld = unheld_note(mixed)
        if unheld and fid.get("passed"):
            lines += [f"The bundle passed, but {unheld}.", ""]
    kept = (card.get("extra") or {}).get("fp32_kept") or {}
    if kept:
        lines += ["Kept in fp32, and why:", "", *_table(["Part", "Why"], [[f"{k}", v] for k, v in kept.items()]), ""]
    else:
        lines += ["Kept in fp32: not recorded by this bundle's export.", ""]
    return lines


# ExecuTorch fp16 programs run XNNPACK's fp16 kernels, whose results depend on the CPU's fp16 arithmetic
FP16_ARITHMETIC_NOTE = (
    "The fp16 encoder runs XNNPACK's fp16 kernels, so its accuracy depends on the CPU: where fp16 is computed through "
    "fp32 each operation rounds only its result; with fp16 arithmetic (ARMv8.2 phones, x86 AVX512-FP16) sums and "
    "means accumulate in fp16 and a full-size encoder was measured up to 40x further from fp32. Check the bundle on "
    "the device that will run it: `sam2edge verify DIR`."
)


def _measured_on(machine: object, precision: str) -> str:
    """' on CPU (fp16 arithmetic: ...)' from fidelity's ``machine``; '' where the export did not record one."""
    if not isinstance(machine, dict) or not machine.get("cpu"):
        return ""
    arithmetic = machine.get("fp16_arithmetic") if precision == "fp16" else None
    return f" on {cpu_name(machine)}" + (f", fp16 arithmetic {arithmetic}" if arithmetic else "")


def _passes(value, bar: float) -> bool:
    return isinstance(value, int | float) and value >= bar
