"""LiteRT int8 with static activation ranges (the full-integer path an NPU takes) against the shipped dynamic int8.

    .venv/bin/python benchmarks/litert_static_int8.py FP32_BUNDLE --checkpoint CKPT [--work DIR] [--runs 4]
        [--clicks 40] [--record FILE]

FP32_BUNDLE is a LiteRT fp32 export of CKPT (``sam2edge export --target litert --checkpoint CKPT --gpu-check skip``):
its decoders and host tables serve every row, so the rows differ by their encoder only. The encoder is converted
fp32 from CKPT's weights smoothed as an int8 export smooths them (``export.pipeline.export_model``), then
quantised three ways by ai-edge-quantizer, nothing kept fp32, graph inputs and outputs fp32:

  dynamic            litert-torch's ``full_dynamic_recipe`` (what ``--precision int8`` ships): int8 weights per
                     channel, activations quantised per call by XNNPACK
  static products    ``static_wi8_ai8`` on FULLY_CONNECTED and CONV_2D: int8 weights, int8 activations with
                     ranges calibrated on photos (``export.onnx_static.CALIBRATION``), the rest fp32
  static, every op   ``static_wi8_ai8`` on every supported op (full integer, an NPU's form)

Each row: the image embedding's cosine to the fp32 encoder's on astronaut.png, the encoder's median time (rows
interleaved, one call after 0.25 s idle, ``--runs`` rounds, 2 threads), and the end-to-end mask IoU over the
export's click set against eager fp32 with upstream's operations. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from sam2edge.checks.bench.script import at_least, first, missing_files, new_file, parsed

ENCODER = "encoder.tflite"
# row -> ai-edge-quantizer ops with static int8 activations (None: litert-torch's dynamic recipe)
ROWS: dict[str, tuple[str, ...] | None] = {
    "fp32": (),
    "dynamic": None,
    "static products": ("FULLY_CONNECTED", "CONV_2D"),
    "static, every op": ("ALL_SUPPORTED",),
}


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    card = Path(args.bundle) / "card.json"
    if not card.is_file():
        return f"{args.bundle}: no card.json; give a LiteRT fp32 bundle (sam2edge export --target litert)"
    c = json.loads(card.read_text())
    if c.get("target") != "litert" or c.get("precision") != "fp32":
        return f"{args.bundle} is a {c.get('target')} {c.get('precision')} bundle; give a LiteRT fp32 one"
    return first(
        missing_files([args.checkpoint], "give the checkpoint the bundle was exported from"),
        at_least("--runs", args.runs),
        at_least("--clicks", args.clicks),
        new_file(args.record, "--record"),
    )


def static_recipe(ops: tuple[str, ...]):
    """ai-edge-quantizer recipe: int8 weights and static int8 activations on ``ops``; graph I/O stays fp32."""
    from ai_edge_quantizer import recipe_manager
    from ai_edge_quantizer.algorithm_manager import AlgorithmName
    from ai_edge_quantizer.qtyping import TFLOperationName

    rm = recipe_manager.RecipeManager()
    for op in ops:
        rm.add_static_config(
            regex=".*",
            operation_name=getattr(TFLOperationName, op),
            activation_num_bits=8,
            weight_num_bits=8,
            algorithm_key=AlgorithmName.MIN_MAX_UNIFORM_QUANT,
        )
    for io in (TFLOperationName.INPUT, TFLOperationName.OUTPUT):
        rm.add_quantization_config(regex=".*", operation_name=io, algorithm_key=AlgorithmName.NO_QUANTIZE)
    return rm.get_quantization_recipe()


def quantize_static(fp32: Path, dst: Path, ops: tuple[str, ...], cfg) -> None:
    from ai_edge_quantizer import quantizer
    from ai_edge_quantizer.calibrator import CalibrationMode

    from sam2edge.export.onnx_static import CALIBRATION, calibration_inputs

    q = quantizer.Quantizer(str(fp32), static_recipe(ops))
    feeds = list(calibration_inputs(cfg, CALIBRATION, "image"))
    # profiler-based: keeping every intermediate of the full-size encoder ran out of 23 GB
    ranges = q.calibrate({"serving_default": feeds}, num_threads=2, mode=CalibrationMode.CALIBRATION_PROFILER_BASED)
    q.quantize(ranges).export_model(str(dst), overwrite=False)


def encoders(sd: dict, cfg, work: Path) -> dict[str, Path]:
    """row -> encoder.tflite, converted and quantised into ``work`` (reused where already there)."""
    from sam2edge.export.litert import ENCODER_FILE, graphs
    from sam2edge.export.litert_convert import convert_graph
    from sam2edge.export.litert_mixed import Owners, model_prefix, quantize
    from sam2edge.export.pipeline import export_model
    from sam2edge.model import Rewrites

    model = export_model(sd, cfg, "int8", Rewrites()).eval()  # smoothed, as the int8 export converts it
    module, sample = graphs(model, 8)[ENCODER_FILE]
    fp32 = work / "fp32.tflite"
    if not fp32.is_file():
        print("converting the smoothed encoder (fp32)", flush=True)
        convert_graph(module, sample, fp32, "fp32")
    files = {"fp32": fp32}
    for row, ops in ROWS.items():
        if row == "fp32":
            continue
        files[row] = path = work / f"{row.replace(' ', '_').replace(',', '')}.tflite"
        if path.is_file():
            continue
        print(f"quantising: {row}", flush=True)
        if ops is None:
            path.write_bytes(quantize(fp32.read_bytes(), "int8", Owners(module, model_prefix(module, model)), ())[0])
        else:
            quantize_static(fp32, path, ops, cfg)
    return files


def backend_with(bundle: Path, encoder: Path, folder: Path, cfg):
    """A LiteRT backend of ``bundle``'s files with ``encoder`` as its encoder.tflite (a copy in ``folder``)."""
    from sam2edge.runtime.backends.litert import LiteRTBackend

    if not folder.is_dir():
        shutil.copytree(bundle, folder, ignore=shutil.ignore_patterns(ENCODER))
    shutil.copyfile(encoder, folder / ENCODER)
    k = int(json.loads((bundle / "card.json").read_text()).get("extra", {}).get("num_tokens", 8))
    return LiteRTBackend(folder, cfg, k, num_threads=2)


def measure(backends: dict, sd: dict, cfg, runs: int, clicks: int) -> list[dict]:
    """One row per backend: image-embedding cosine to the fp32 row's, encoder median (rows interleaved, one call
    after 0.25 s idle per round), end-to-end mask IoU against eager fp32 with upstream's operations."""
    from sam2edge.checks.fidelity import click_set, photo
    from sam2edge.checks.fidelity.metrics import compare, end_to_end
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.runtime.preprocess import preprocess

    x = preprocess(photo("astronaut.png"), cfg.image_size).numpy()
    ref = backends["fp32"].encode(x).image_embed
    cosine = {row: compare(b.encode(x).image_embed, ref)["cosine"] for row, b in backends.items()}
    times: dict[str, list[float]] = {row: [] for row in backends}
    for _ in range(runs):  # interleaved: drift hits every row alike
        for row, b in backends.items():
            time.sleep(0.25)
            t0 = time.perf_counter()
            b.encode(x)
            times[row].append((time.perf_counter() - t0) * 1e3)
    reference = Sam2Predictor(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
    prompts, fp32_ms = click_set(clicks), statistics.median(times["fp32"])
    rows = []
    for row, b in backends.items():
        e, ms = end_to_end(reference, Sam2Predictor(b), prompts), statistics.median(times[row])
        rows.append(
            {
                "encoder": row,
                "cosine": f"{cosine[row]:.5f}",
                "encoder_ms": round(ms),
                "vs_fp32": f"{fp32_ms / ms:.2f}x",
                "mask_iou": f"{e['iou_worst']:.4f} ({e['iou_median']:.4f})",
            }
        )
        print(" | ".join(str(v) for v in rows[-1].values()), flush=True)
    return rows


def table(rows: list[dict], args, cfg) -> dict:
    """The published record (``sam2edge.table/1``)."""
    from sam2edge import __version__
    from sam2edge.checks.bench.records import machine

    m = machine()
    return {
        "schema": "sam2edge.table/1",
        "id": "litert-static-int8-1024",
        "title": f"LiteRT int8 encoders, static against dynamic activations ({Path(args.checkpoint).stem}, "
        f"{cfg.image_size} px, 2 threads)",
        "date": dt.date.today().isoformat(),
        "command": f"python benchmarks/litert_static_int8.py FP32_BUNDLE --checkpoint {Path(args.checkpoint).name} "
        f"--runs {args.runs} --clicks {args.clicks} --record FILE",
        "machine": {"cpu": m["cpu"], "cores": m["cores"], "vector_extensions": m["vector_extensions"]},
        "sam2edge": {"version": __version__},
        "columns": [
            ["encoder", "encoder"],
            ["cosine", "image embedding cosine to fp32"],
            ["encoder_ms", "encoder p50 (ms)"],
            ["vs_fp32", "faster than fp32"],
            ["mask_iou", f"mask IoU worst (median), {args.clicks} clicks"],
        ],
        "rows": rows,
        "notes": [
            "Every encoder from the same smoothed fp32 conversion, nothing kept fp32; the fp32 bundle's decoders. "
            "Rows interleaved, one encode after 0.25 s idle per round, medians over the rounds.",
            "int8 bar: mask IoU worst >= 0.95 (goal: median >= 0.99 too). Cosine: the image embedding on "
            "astronaut.png.",
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="a LiteRT fp32 bundle of --checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--work", default="litert-static-work", help="converted encoders and bundle copies (reused)")
    p.add_argument("--runs", type=int, default=4, help="interleaved timing rounds")
    p.add_argument("--clicks", type=int, default=40, help="end-to-end prompts per row")
    p.add_argument("--record", help="write the sam2edge.table/1 record here (never over a file)")
    args = parsed(p, argv, _problem)
    if args is None:
        return 2
    import torch

    from sam2edge.checks.fidelity.verify import bundle_config
    from sam2edge.weights import load_weights

    torch.set_num_threads(2)
    bundle, work = Path(args.bundle), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cfg = bundle_config(json.loads((bundle / "card.json").read_text()))
    sd, _ = load_weights(args.checkpoint, cfg)  # read once: the conversion and the eager reference
    files = encoders(sd, cfg, work)
    backends = {row: backend_with(bundle, f, work / f"bundle-{f.stem}", cfg) for row, f in files.items()}
    rows = measure(backends, sd, cfg, args.runs, args.clicks)
    if args.record:
        Path(args.record).write_text(json.dumps(table(rows, args, cfg), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
