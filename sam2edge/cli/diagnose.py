"""``sam2edge diagnose BUNDLE_OR_TARGET``: where does a target's fp16 arithmetic lose the answer?

Runs the target's fp16 emulation (``sam2edge.export.precision.EMULATIONS``) and the fp32 graphs side
by side over the click set, then, for the worst click, reports per module the output error against
fp32 (relative, max-abs, inf/NaN, reference values beyond fp16's +-65504) and per aten op the local
error of that op computed in fp16: the first place the error jumps names the layer, op and tensor.
A bundle folder gives target, config, resolution and checkpoint from its card.json.
Exit 0 when the emulation meets the fp16 bar (worst >= 0.99, median >= 0.999), 1 when not, 2 on bad input.

``--int8``: the int8 sensitivity sweep instead (``export.int8_sensitivity``): the target's dynamic int8 encoder
(its weights smoothed as an int8 export smooths them, ``export.smooth``) emulated in eager, its end-to-end mask IoU
and the clicks under the int8 bar (photo, prompt kind), then every encoder Linear ranked by the worst IoU reached
with that layer alone kept fp32. Exit 0 when the all-int8 encoder meets the int8 bar (worst >= 0.95), 1 when not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

IOU_WORST, IOU_MEDIAN = 0.99, 0.999


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle_or_target", help="a bundle folder (card.json) or a target: litert, onnx, executorch")
    p.add_argument(
        "--config",
        default="sam2.1-hiera-tiny",
        help="model config for a target (default full size; also test-small-wide-decoder)",
    )
    p.add_argument("--resolution", type=int, help="input side for a target (multiple of 32)")
    p.add_argument(
        "--checkpoint",
        help="checkpoint file, hub id, 'synthetic', or synthetic:SEED[:rangeF|:xF] (seeded; rangeF: encoder "
        "ranges x F, same function; xF: every weight x F)",
    )
    p.add_argument("--clicks", type=int, default=40, help="prompts on real photos (default 40)")
    p.add_argument("--top", type=int, default=8, help="ops listed per stage (default 8)")
    p.add_argument(
        "--int8",
        action="store_true",
        help="rank the encoder's Linear layers by their effect on the int8 mask IoU (sensitivity sweep); "
        "use a reduced --clicks (default 40: one pass per layer)",
    )
    p.add_argument("--json", dest="json_out", help="also write the full report (every module) to this JSON file")


def _resolve(args: argparse.Namespace):
    from sam2edge.config import get_config
    from sam2edge.errors import UserError
    from sam2edge.export.precision import EMULATIONS

    target, config, res, ckpt = args.bundle_or_target, args.config, args.resolution, args.checkpoint
    if Path(target).is_dir():
        from sam2edge.export.bundle import load_card

        card = load_card(Path(target))
        target, config, res = card["target"], card["config"], int(card["resolution"])
        ckpt = ckpt or card.get("source", {}).get("checkpoint")
    if target not in EMULATIONS:
        raise UserError(f"{target!r} is neither a bundle folder nor a target; use one of {', '.join(EMULATIONS)}")
    try:
        from sam2edge.checks.fidelity.checkpoints import PRECISION_CONFIGS

        cfg = PRECISION_CONFIGS[config] if config in PRECISION_CONFIGS else get_config(config)
        cfg = cfg.at_resolution(res) if res else cfg
    except ValueError as e:
        raise UserError(str(e)) from None
    return target, cfg, _state_dict(ckpt, cfg)


def _state_dict(spec: str | None, cfg) -> dict:
    if spec and spec.startswith("synthetic:"):
        from sam2edge.checks.fidelity.checkpoints import variant_state_dict

        return variant_state_dict(spec, cfg)
    from sam2edge.weights import load_weights

    return load_weights(spec, cfg)[0]


def _print_stage(name: str, stage: dict) -> None:
    from sam2edge.checks.fidelity.localize import Stat, format_stat

    def line(row):
        return format_stat(Stat(**{**row, "shape": tuple(row["shape"])}))

    print(f"{name}: output {line(stage['output']) if stage['output'] else '-'}")
    jump = stage["first_module_jump"]
    print(f"  first module over the jump threshold: {line(jump) if jump else 'none'}")
    op = stage["first_op_jump"]
    print(f"  first op that cannot be fp16 here:    {line(op) if op else 'none'}")
    print("  worst ops (local fp16 error on fp32 inputs):")
    for row in stage["worst_ops"]:
        print("    " + line(row))


def run(args: argparse.Namespace) -> int:
    from sam2edge.errors import UserError
    from sam2edge.export.precision import diagnose

    if args.clicks < 1:
        raise UserError(f"--clicks {args.clicks}: give at least 1")
    if args.json_out and Path(args.json_out).exists():
        raise UserError(f"{args.json_out} exists; choose a new --json path (nothing is overwritten)")
    target, cfg, sd = _resolve(args)
    if args.int8:
        return _run_int8(args, target, cfg, sd)
    report = diagnose(sd, cfg, target, args.clicks, args.top)
    w = report["worst_click"]
    print(
        f"{target} fp16 emulation ({report['emulated_arithmetic']}), {cfg.image_size}px: mask IoU vs fp32 over "
        f"{report['clicks']} clicks: median {report['iou_median']:.5f}, worst {report['iou_worst']:.5f} "
        f"(click {w['index']}, {w['kind']} on {w['photo']})"
    )
    print(
        f"worst click: fp32 graphs {report['worst_click_iou_fp32_graphs']:.5f}; the target's decoder (as exported) "
        f"on fp32 features {report['worst_click_iou_reduced_decoder_only']:.5f}"
    )
    _print_stage("encoder", report["encoder"])
    _print_stage("decoder", report["decoder"])
    _write_json(args, report)
    return 0 if report["iou_worst"] >= IOU_WORST and report["iou_median"] >= IOU_MEDIAN else 1


INT8_WORST = 0.95


def _write_json(args: argparse.Namespace, report: dict) -> None:
    if args.json_out:
        from sam2edge.io import atomic_path

        with atomic_path(Path(args.json_out)) as tmp:
            Path(tmp).write_text(json.dumps(report, indent=1))


def _run_int8(args: argparse.Namespace, target: str, cfg, sd: dict) -> int:
    from sam2edge.export.int8_sensitivity import sweep
    from sam2edge.export.smooth import export_weights

    r = sweep(export_weights(sd, cfg, "int8"), cfg, target, args.clicks, INT8_WORST)  # as an int8 export smooths
    print(
        f"{target} int8 emulation (encoder Linears: int8 weights per channel, activations {r['activations']}; "
        f"fp32 decoder), {cfg.image_size}px: mask IoU vs fp32 over {r['clicks']} clicks: median "
        f"{r['iou_median']:.5f}, worst {r['iou_worst']:.5f}"
    )
    for c in r["failed_clicks"]:
        print(f"  under {INT8_WORST}: click {c['index']} ({c['kind']} on {c['photo']}): IoU {c['iou']:.5f}")
    print(f"encoder Linear layers ({r['layers']}) ranked by the worst IoU with that layer alone kept fp32:")
    for row in r["ranking"][: args.top]:
        print(f"  {row['layer']:<48} worst {row['iou_worst']:.5f}  mean {row['iou_mean']:.5f}")
    if r["iou_worst"] < INT8_WORST and r["ranking"]:
        print(
            f"try: keep {r['ranking'][0]['layer']} (and the next ones) in fp32, or export at --precision fp16 "
            "(fp16 weights, fp32 arithmetic)"
        )
    _write_json(args, r)
    return 0 if r["iou_worst"] >= INT8_WORST else 1
