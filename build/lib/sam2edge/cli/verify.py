"""``sam2edge verify DIR``: a bundle vs eager fp32 with its recorded checkpoint; writes fidelity.json.

Exit 0 when every bar holds, 1 when one fails (each failure printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import shlex

from sam2edge.checks.fidelity.verify import BARS, MIN_CLICKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="bundle folder written by `sam2edge export` (holds card.json)")
    p.add_argument("--checkpoint", help="the checkpoint file, when the recorded path is not on this machine")
    p.add_argument("--clicks", type=int, default=MIN_CLICKS, help=f"prompts on real photos (>= {MIN_CLICKS})")
    defaults = "; ".join(f"{k}: " + ", ".join(f"{n} {v}" for n, v in b.items()) for k, b in BARS.items())
    p.add_argument("--min-cosine", type=float, help=f"bar: cosine per output (defaults {defaults})")
    p.add_argument("--min-iou-worst", type=float, help="bar: worst end-to-end mask IoU")
    p.add_argument("--min-iou-median", type=float, help="bar: median end-to-end mask IoU")
    p.add_argument("--no-write", action="store_true", help="print only; write no fidelity.json")


def print_report(report: dict) -> None:
    print(f"{'output':<26} {'cosine':>10} {'worst cos':>10} {'corr':>10} {'max-abs':>10} {'max-rel':>10}")
    for name, m in report["outputs"].items():
        print(
            f"{name:<26} {m['cosine']:>10.7f} {m['cosine_worst_sample']:>10.7f} {m['correlation']:>10.7f}"
            f" {m['max_abs']:>10.3e} {m['max_rel']:>10.3e}"
        )
    e = report["end_to_end"]
    print(
        f"end to end: {e['clicks']} clicks on {len(e['photos'])} photos: mask IoU median {e['iou_median']:.5f},"
        f" worst {e['iou_worst']:.5f}; same candidate {e['selection_agreement']:.3f};"
        f" IoU-score max diff {e['iou_score_max_abs_diff']:.3e}"
    )
    bars = ", ".join(f"{k} {v}" for k, v in report["bars"].items()) or "none"
    print(f"bars ({report['precision']}): {bars}")


def command_line(args: argparse.Namespace, bars: dict[str, float]) -> str:
    """The command that reproduces this verification (for fidelity.json)."""
    parts = ["sam2edge", "verify", str(args.bundle), "--clicks", str(args.clicks)]
    if args.checkpoint:
        parts += ["--checkpoint", args.checkpoint]
    for name, value in bars.items():
        parts += ["--" + name.replace("_", "-"), str(value)]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from sam2edge.checks.fidelity.verify import record_report, verify_bundle
    from sam2edge.errors import UserError

    if args.clicks < MIN_CLICKS:
        raise UserError(f"--clicks {args.clicks} is below the bar's minimum; use --clicks {MIN_CLICKS} or more")
    bars = {
        k: v
        for k, v in (
            ("min_cosine", args.min_cosine),
            ("min_iou_worst", args.min_iou_worst),
            ("min_iou_median", args.min_iou_median),
        )
        if v is not None
    }
    report = verify_bundle(args.bundle, clicks=args.clicks, bars=bars, checkpoint=args.checkpoint)
    print_report(report)
    if not args.no_write:
        record_report(args.bundle, report, command_line(args, bars))
        print(f"wrote {args.bundle}/fidelity.json (and refreshed card.json fidelity, manifest.json)")
    if report["failures"]:
        for f in report["failures"]:
            print(f"FAIL: {f}")
        return 1
    print("PASS: every bar holds")
    return 0
