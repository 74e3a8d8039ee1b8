"""ONNX export: build -> convert (fp32 | fp16 weights, fp32 I/O) -> optimise -> verify -> bundle.

Files (single self-contained .onnx each, no external data, opset ``OPSET``, standard ONNX ops only):
  encoder.onnx  ``EncoderGraph``: image 1x3xSxS -> image_embeddings, feat_s0, feat_s1
  decoder.onnx  ``PointDecoderGraph`` (prompt encoder inside), dynamic num_points N; I/O in
                ``sam2edge.runtime.backends.onnx``'s module docstring.
  encoder_vnni.onnx  int8 only, exported on a CPU with VNNI: the encoder with s8 x s8 static QDQ products
                (``export.onnx_static``, the default), or with ``--int8 dynamic`` u8 x s8 dynamic ones
                (``export.onnx_int8``; also the static file's fallback where it misses a bar)
Each carries ``metadata_props`` (model id, checkpoint SHA-256, preprocessing, prompt conventions).

fp16: the encoder's weights are STORED in fp16 and computed in fp32 (``export.onnx_fp16``), like LiteRT's fp16
recipe on a CPU: the error is weight rounding only; decoder.onnx stays fp32 (``export.kept``); I/O stays fp32.

Graph optimisation: onnxruntime's offline BASIC level (constant folding, redundant-node removal;
output stays standard ONNX, so TensorRT / OpenVINO / onnxruntime-web can read it); the optimised graph
is checked against the unoptimised one on the same inputs before it is kept.

Everything else (out-folder guard, weights, fidelity against eager fp32 at ``checks.fidelity.bars``, the atomic
write) is ``sam2edge.export.pipeline``; the optimisation check is this target's (fidelity.json ``checks.optimization``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sam2edge.config import Sam2Config, config_name, model_id
from sam2edge.export import batched as bat
from sam2edge.export import onnx_static as st
from sam2edge.export import video as vid
from sam2edge.export.mixed import fp16_keep
from sam2edge.export.onnx_fp16 import fp16_storage
from sam2edge.export.pipeline import TargetSpec, run_export
from sam2edge.export.wrappers import EncoderGraph, PointDecoderGraph
from sam2edge.model import Rewrites
from sam2edge.runtime.backends import onnx as ob
from sam2edge.runtime.preprocess import MEAN, STD
from sam2edge.runtime.prompts import prompt_layout
from sam2edge.runtime.video.bundle import BATCHED, VIDEO_GRAPHS, graph_io

OPSET = 17  # LayerNormalization is a single standard op from 17 on
# LayerNormalization native; the mask head as upstream's one MatMul (the GPU channel-sum form: ~10 % slower batched,
# benchmarks/bench_everything.py); the decoder's upscaling as GEMMs, channels-last (a click 0.78x -> 0.69x the peer's);
# Hiera's q / k / v as three products, its global attention in 512-query slices (int8 encoder 0.593x -> 0.547x the
# peer's, fp32 0.955x -> 0.936x). Hiera-Tiny, 1024 px, 2 threads: `benchmarks/bench_onnx_forms.py [--graph decoder]`
ONNX_REWRITES = Rewrites(
    attention_rank=4,
    attention_impl="math",
    transposed_conv="matmul",
    layer_norm="native",
    mask_head="matmul",
    texture_limit=0,
    token_fold="folded",  # a click's decoder: 3.56 -> 2.22 GFLOP at 1024 px (no image-side projection)
    qkv="split",
    image_query_chunk=512,
    upscale_layout="nhwc",
    score_keys="rows",
)
CLICKS = 40
# optimised vs unoptimised graph, per output, to ~1e-7 (fp16 / int8: the fp32 graphs before storage / quantisation)
OPT_COSINE = {"fp32": 0.9999999, "fp16": 0.9999999, "int8": 0.9999999}
LABEL_MEANING = "1 foreground, 0 background, 2 box top-left, 3 box bottom-right, -1 not-a-point pad, -2 ignored slot"


GRAPHS = {
    "fp32": (EncoderGraph, PointDecoderGraph),
    "fp16": (EncoderGraph, PointDecoderGraph),  # fp32 graphs; encoder weights fp16-stored after optimisation
    "int8": (EncoderGraph, PointDecoderGraph),  # fp32 graphs; the encoder is quantised after optimisation
}


def example_inputs(cfg: Sam2Config) -> tuple[tuple[torch.Tensor], tuple[torch.Tensor, ...]]:
    """Tracing inputs: (image,), (features..., 3 prompt points, a mask input, has_mask_input)."""
    s, e, c = cfg.image_size, cfg.image_embedding_size, cfg.d_model
    g = torch.Generator().manual_seed(0)
    image = torch.randn(1, 3, s, s, generator=g)
    feats = (
        torch.randn(1, c, e, e, generator=g),
        torch.randn(1, c // 8, 4 * e, 4 * e, generator=g),
        torch.randn(1, c // 4, 2 * e, 2 * e, generator=g),
    )
    coords = torch.rand(1, 3, 2, generator=g) * s
    labels = torch.tensor([[1.0, 0.0, -1.0]])
    return (image,), (*feats, coords, labels, torch.randn(1, 1, 4 * e, 4 * e, generator=g), torch.ones(1))


# role -> (input names, output names, dynamic axes)
IO = {
    "encoder": (ob.ENCODER_INPUTS, ob.ENCODER_OUTPUTS, {}),
    "decoder": (
        ob.DECODER_INPUTS,
        ob.DECODER_OUTPUTS,
        {"point_coords": {1: "num_points"}, "point_labels": {1: "num_points"}},
    ),
    "decoder-batched": (ob.BATCHED_INPUTS, ob.DECODER_OUTPUTS, {}),  # B and N fixed at export
    **{role: (ins, outs, {}) for role, (_, ins, outs) in VIDEO_GRAPHS.items()},
    **{role + BATCHED: (ins, outs, {}) for role, (_, ins, outs) in VIDEO_GRAPHS.items()},  # B fixed (VIDEO_BATCH)
}
WORK = ".work"  # raw and optimised graphs, kept until the optimisation check


def optimize(src: Path, dst: Path, allowed_domains: tuple[str, ...] = ()) -> dict:
    """onnxruntime BASIC optimisation of ``src`` into ``dst`` (node counts); standard ONNX domains only, unless
    ``allowed_domains`` (a benchmark's onnxruntime-only graph: ``Rewrites.attention_impl="ort_mha"``)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    before, after = onnx.load(str(src), load_external_data=False), onnx.load(str(dst), load_external_data=False)
    domains = sorted({n.domain for n in after.graph.node if n.domain not in ("", "ai.onnx", *allowed_domains)})
    if domains:
        raise RuntimeError(f"optimised graph {dst} uses non-standard op domains {domains}")
    return {
        "level": "onnxruntime BASIC (offline)",
        "nodes_before": len(before.graph.node),
        "nodes_after": len(after.graph.node),
    }


def metadata(cfg: Sam2Config, precision: str, source: dict, role: str) -> dict[str, str]:
    """metadata_props of each .onnx: identity, provenance, preprocessing and prompt conventions."""
    from sam2edge import __version__

    s = cfg.image_size
    return {
        "model_id": model_id(config_name(cfg)),
        "role": role,
        "precision": (
            f"fp32 weights ({precision} bundle: only the encoder is {precision}), fp32 inputs and outputs"
            if precision in ("int8", "fp16") and role != "encoder"
            else f"{precision} weights, fp32 inputs and outputs"
        ),
        "resolution": str(s),
        "checkpoint": str(source.get("checkpoint")),
        "checkpoint_sha256": str(source.get("sha256") or "none (synthetic checkpoint: masks are meaningless)"),
        "preprocessing": json.dumps(
            {
                "color": "RGB",
                "resize": [s, s],
                "interpolation": "bilinear, antialiased, aspect not kept",
                "scale": 1 / 255,
                "mean": list(MEAN),
                "std": list(STD),
                "layout": "NCHW float32",
            }
        ),
        "point_coords": f"(X, Y) in model-input pixels of the {s}x{s} resized image: x_orig / W * {s}",
        "point_labels": LABEL_MEANING,
        "prompt_layout": "box corners (2, 3), then points, then one pad point (-1 at 0,0), as upstream",
        "outputs": "masks 1x3 logits, iou_scores, single_mask 1x1 (SAM 2.1 dynamic), single_iou, object_score",
        "producer": f"sam2edge {__version__}",
    }


def finish(src: Path, dst: Path, props: dict[str, str]) -> None:
    """Attach ``props`` as metadata_props, save ``dst`` as one file and run the full onnx checker."""
    import onnx

    m = onnx.load(str(src))
    del m.metadata_props[:]
    for k, v in props.items():
        m.metadata_props.add(key=k, value=v)
    m.producer_name, m.doc_string = "sam2edge", f"SAM 2.1 Hiera-Tiny {props['role']} ({props['precision']})"
    onnx.save(m, str(dst), save_as_external_data=False)
    onnx.checker.check_model(str(dst), full_check=True)


def _prompts(cfg: Sam2Config) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Decoder probe prompts (model-input px): 1 point+pad, 2 points+pad, box+pad, box+point+pad, point+mask."""
    s, side = cfg.image_size, 4 * cfg.image_embedding_size
    rng = np.random.default_rng(0)
    pts = rng.uniform(0.1 * s, 0.9 * s, size=(4, 2)).astype(np.float32)
    box = np.array([[0.2 * s, 0.25 * s], [0.7 * s, 0.8 * s]], np.float32)
    mask = (rng.standard_normal((1, 1, side, side)) * 4).astype(np.float32)
    rows = [  # (box, points, labels, mask input)
        (None, pts[:1], [1], None),
        (None, pts[:2], [1, 0], None),
        (box, None, None, None),
        (box, pts[2:3], [1], None),
        (None, pts[3:4], [1], mask),
    ]
    ones = np.ones(2, np.float32)  # already model-input pixels
    return [(*prompt_layout(b, p, lab, ones, 1.0), m) for b, p, lab, m in rows]


def _worst(rows: list[dict]) -> dict[str, float]:
    """Worst over probes; correlation is left out for one-number outputs (it is undefined there)."""
    if "correlation" not in rows[0]:
        return {"cosine": min(r["cosine"] for r in rows), "max_abs": max(r["max_abs"] for r in rows)}
    return {
        "cosine": min(r["cosine"] for r in rows),
        "correlation": min(r["correlation"] for r in rows),
        "max_abs": max(r["max_abs"] for r in rows),
    }


def compare_backends(test, ref, cfg: Sam2Config) -> dict[str, dict[str, float]]:
    """Per-output agreement of two backends on a real photo: encoder outputs, then decoder outputs
    fed the *reference* features (so decoder error is not mixed with encoder error), worst over probes."""
    from sam2edge.checks.fidelity import compare, photo
    from sam2edge.runtime.preprocess import preprocess

    x = preprocess(photo("astronaut.png"), cfg.image_size).numpy()
    ft, fr = test.encode(x), ref.encode(x)
    out = {
        n: compare(getattr(ft, a), getattr(fr, a))
        for n, a in zip(ob.ENCODER_OUTPUTS, ("image_embed", "feat_s0", "feat_s1"))
    }
    rows: dict[str, list[dict]] = {n: [] for n in ob.DECODER_OUTPUTS}
    for coords, labels, mask in _prompts(cfg):
        dt, dr = test.decode(fr, coords, labels, mask), ref.decode(fr, coords, labels, mask)
        for n, a in zip(ob.DECODER_OUTPUTS, ("masks", "iou", "single_mask", "single_iou", "object_score")):
            row = compare(getattr(dt, a), getattr(dr, a))
            rows[n].append({k: v for k, v in row.items() if k != "correlation" or getattr(dr, a).size > 1})
    out.update({n: _worst(r) for n, r in rows.items()})
    return out


def check_optimization(raw: dict[str, Path], opt: dict[str, Path], cfg: Sam2Config, precision: str) -> dict:
    """Optimised vs unoptimised graphs (both in onnxruntime with no further optimisation), per output."""
    a = ob.OnnxBackend(*(ob.make_session(raw[r], optimize=False) for r in ("encoder", "decoder")), cfg)
    b = ob.OnnxBackend(*(ob.make_session(opt[r], optimize=False) for r in ("encoder", "decoder")), cfg)
    res = compare_backends(b, a, cfg)
    bad = [k for k, v in res.items() if v["cosine"] < OPT_COSINE[precision]]
    if bad:
        raise RuntimeError(f"graph optimisation changed outputs {bad}: {res}")
    return res


def _graphs(job) -> dict:
    enc_cls, dec_cls = GRAPHS[job.precision]
    enc_in, dec_in = example_inputs(job.cfg)
    return {
        ob.ENCODER_FILE: ("encoder", enc_cls(job.model), enc_in),
        ob.DECODER_FILE: ("decoder", dec_cls(job.model), dec_in),
    } | _batched(job)


def _batched(job) -> dict:
    """The batched decoder, fp32 at every precision like decoder.onnx (fp16: FP32_KEPT)."""
    b = bat.batch_size(job)
    graph = bat.BatchedPointDecoderGraph(job.model)
    return {ob.BATCHED_DECODER_FILE: ("decoder-batched", graph, bat.point_sample_args(job.model, b))}


def _backend(job) -> ob.OnnxBackend:
    backend = ob.OnnxBackend.from_files(job.folder / ob.ENCODER_FILE, job.folder / ob.DECODER_FILE, job.cfg)
    has = ob.BATCHED_DECODER_FILE in job.files
    return backend.attach_batched(job.folder / ob.BATCHED_DECODER_FILE) if has else backend


def _convert(job, file: str, module: nn.Module, args: tuple) -> None:
    """Trace ``module`` (legacy TorchScript exporter: fast, exact), optimise it (onnxruntime BASIC), attach
    metadata and run the full checker; the raw and optimised graphs stay in ``.work`` for the check."""
    role = job.files[file]
    (work := job.folder / WORK).mkdir(exist_ok=True)
    names_in, names_out, dynamic = IO[role]
    if role.removesuffix(BATCHED) in VIDEO_GRAPHS:  # a video config's own inputs (runtime.video.bundle.graph_io)
        names_in = graph_io(role, job.vcfg)[1]
    raw, opt = work / f"raw_{role}.onnx", work / f"opt_{role}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(raw),
            dynamo=False,
            opset_version=OPSET,
            do_constant_folding=True,
            input_names=list(names_in),
            output_names=list(names_out),
            dynamic_axes=dynamic,
        )
    job.state.setdefault("census", {})[role] = optimize(raw, opt)
    props = metadata(job.cfg, job.precision, job.source, role)
    if role.removesuffix(BATCHED) in VIDEO_GRAPHS:  # card.json extra.video lists every tensor's shape
        props["outputs"] = ", ".join(names_out)
    final = opt
    if job.precision == "int8" and role == "encoder":  # export.onnx_int8: the portable and the VNNI file
        vnni_props = {**props, "role": ob.VNNI_ENCODER_ROLE}
        final = st.quantize_encoder(job, opt, work, lambda src, dst: finish(src, dst, vnni_props))
    elif job.precision == "fp16" and role == "encoder":
        final = work / "fp16_encoder.onnx"
        keep = fp16_keep(job, "onnx")
        job.state["census"][role]["fp16"] = fp16_storage(opt, final, keep=keep)
    finish(final, job.folder / file, props)


def optimization_check(job) -> dict:
    """Optimised vs unoptimised graphs compute the same (raises otherwise); removes the work folder."""
    work = job.folder / WORK
    raw = {r: work / f"raw_{r}.onnx" for r in ("encoder", "decoder")}
    opt = {r: work / f"opt_{r}.onnx" for r in ("encoder", "decoder")}
    res = check_optimization(raw, opt, job.cfg, job.precision)
    for p in work.iterdir():
        p.unlink()
    work.rmdir()
    return {"graphs": job.state["census"], "optimized_vs_unoptimized": res}


def _extra(job) -> dict:
    return {
        "opset": OPSET,
        "inputs": {"encoder": list(ob.ENCODER_INPUTS), "decoder": list(ob.DECODER_INPUTS)},
        "outputs": {"encoder": list(ob.ENCODER_OUTPUTS), "decoder": list(ob.DECODER_OUTPUTS)},
        "dynamic": {"num_points": "point_coords dim 1, point_labels dim 1"},
        "point_labels": LABEL_MEANING,
        "rewrites": vars(ONNX_REWRITES).copy(),
        **st.card_extra(job),
    }


def export_onnx(
    sd: dict,
    source: dict,
    cfg: Sam2Config,
    config_name: str,
    precision: str,
    out: Path,
    command: str,
    force: bool = False,
    clicks: int = CLICKS,
) -> dict:
    """``run_export`` for ONNX with given weights at ``cfg``'s resolution; returns the card."""
    return run_export(
        "onnx",
        config_name,
        precision,
        out,
        resolution=cfg.image_size,
        weights=(sd, source),
        force=force,
        command=command,
        clicks=clicks,
    )


def summary(card: dict, out: Path) -> str:
    fid = card["fidelity"]
    worst_cos = min(v["cosine"] for v in fid["outputs"].values())
    sizes = ", ".join(f"{a['file']} {a['bytes'] / 1e6:.1f} MB" for a in card["artifacts"])
    e2e = fid["end_to_end"]
    return (
        f"bundle:  {Path(out).resolve()} ({card['status']})\n"
        f"files:   {sizes}\n"
        f"fidelity: worst per-output cosine {worst_cos:.7f}; end-to-end mask IoU worst "
        f"{e2e['iou_worst']:.4f} median {e2e['iou_median']:.4f} over {e2e['clicks']} clicks"
    )


SPEC = TargetSpec(
    name="onnx",
    rewrites=ONNX_REWRITES,
    graphs=_graphs,
    convert=_convert,
    open_backend=_backend,
    extra=_extra,
    summary=summary,
    checks={
        "optimization": optimization_check,
        "batched_decoder": lambda job: bat.check_batched(job, _backend(job)),
        "int8_vnni": lambda job: st.vnni_check(job, job.folder / ob.DECODER_FILE),
    },
    video=lambda job: vid.entries(job, vid.half_if_fp16(job), named=False),
)
