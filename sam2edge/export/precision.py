"""Reduced-precision emulations per export target, and what each target keeps in fp32 (card data).

``EMULATIONS[target]`` rebuilds, in eager PyTorch, the arithmetic a target's fp16 program performs, so
``sam2edge diagnose`` can hook every layer (the exported runtimes cannot be hooked). All three use the
ExecuTorch I/O graphs (``XnnEncoderGraph`` / ``XnnDecoderGraph``: same functions as every target's
graphs, prompt tokens in fp32), built with the target's own ``Rewrites``:

  executorch  fp16 weights and arithmetic in the encoder, its kept parts fp32 (``fp16_arithmetic``, the
              function ``executorch_graphs.fp16_encoder`` exports). Eager fp16 on the CPU underestimates
              XNNPACK's fp16 error (``benchmarks/executorch_fp16_error.py``, docs/design/precision.md), so the
              export's own check on the real program decides; the decoder graph fp32 (decoder.pte is fp32 in
              an fp16 bundle, ``FP32_KEPT``). Where no selection holds in that arithmetic, the export falls
              back to ``STORAGE_FALLBACK["executorch"]``: fp32 arithmetic on fp16-rounded Linear weights
              (``fp16_linear_weights``, what ``executorch_storage.fp16_linear_storage`` writes);
  onnx        fp32 arithmetic on fp16-rounded encoder weights, with ONNX's rewrites (native
              LayerNormalization): ``export.onnx_fp16.fp16_storage`` stores the encoder's initializers as fp16
              behind Casts to fp32; fp32 decoder.onnx;
  litert      fp32 arithmetic on fp16-rounded encoder weights: litert-torch's ``full_fp16_recipe`` stores
              weights as fp16 and the CPU kernels dequantize them (activations stay fp32); the decoder
              graphs keep fp32 weights (``FP32_KEPT``).

``FP32_KEPT[target][precision]`` (``export.kept``) lists, for the card, what a target's reduced-precision
export computes in fp32 and why; ``FP16_MEASURED`` the measured end-to-end IoUs behind them
(docs/design/precision.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.export.executorch import REWRITES as EXECUTORCH_REWRITES
from sam2edge.export.executorch_graphs import XnnDecoderGraph, XnnEncoderGraph
from sam2edge.export.half import half_except
from sam2edge.export.kept import FP32_KEPT  # noqa: F401  (card data, re-exported)
from sam2edge.export.onnx import ONNX_REWRITES
from sam2edge.model import Rewrites, Sam2ImageModel, build_sam2
from sam2edge.runtime.backends import Decoded, Features
from sam2edge.runtime.backends.executorch import MAX_POINTS, pad_prompt


def fp16_arithmetic(model: Sam2ImageModel, keep: tuple[str, ...] = ()) -> Sam2ImageModel:
    """fp16 weights and arithmetic (XNNPACK's fp16 graphs), the modules of ``keep`` in fp32 (``half_except``)."""
    return half_except(model, keep)


def in_parts(name: str, parts: tuple[str, ...]) -> bool:
    """Whether parameter ``name`` belongs to one of ``parts`` (module or parameter names)."""
    return any(name == p or name.startswith(p + ".") for p in parts)


def _rounded(model: Sam2ImageModel, chosen: Callable[[Sam2ImageModel], Iterable[torch.Tensor]]) -> Sam2ImageModel:
    """A copy of ``model`` with the weights ``chosen(copy)`` yields rounded to fp16 (and back to fp32), the
    constants baked from weights (position embeddings, Hiera's split q / k / v) baked again."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in chosen(out):
            p.copy_(p.half().float())
    for m in out.modules():
        if hasattr(m, "refresh_constants"):
            m.refresh_constants()
    return out


def fp16_weights(model: Sam2ImageModel, keep: tuple[str, ...] = ()) -> Sam2ImageModel:
    """fp32 arithmetic on weights rounded to fp16 (LiteRT's fp16 recipe on CPU), the parameters of ``keep``
    (module or parameter names) left fp32."""
    return _rounded(model, lambda m: (p for name, p in m.named_parameters() if not in_parts(name, keep)))


def fp16_linear_weights(model: Sam2ImageModel, keep: tuple[str, ...] = ()) -> Sam2ImageModel:
    """fp32 arithmetic on Linear weights rounded to fp16, everything else fp32 (ExecuTorch's fp16 storage,
    ``executorch_storage.fp16_linear_storage``), the Linears under ``keep`` (module names) left fp32."""
    return _rounded(
        model,
        lambda m: (x.weight for name, x in m.named_modules() if isinstance(x, nn.Linear) and not in_parts(name, keep)),
    )


@dataclass(frozen=True)
class Emulation:
    rewrites: Rewrites  # the target's model build
    reduce: Callable[..., Sam2ImageModel]  # (fp32 model, parts kept fp32 = ()) -> reduced-precision model
    arithmetic: str  # one line for reports
    decoder_fp32: bool = False  # the fp16 export keeps its decoder graph in fp32 (FP32_KEPT)
    whole_modules: bool = False  # ``reduce`` keeps whole modules fp32 only (not a bare parameter such as pos_embed)


EMULATIONS: dict[str, Emulation] = {
    "executorch": Emulation(
        EXECUTORCH_REWRITES,
        fp16_arithmetic,
        "fp16 encoder weights and arithmetic (XNNPACK fp16), fp32 decoder",
        decoder_fp32=True,
        whole_modules=True,
    ),
    "onnx": Emulation(ONNX_REWRITES, fp16_weights, "fp16 encoder weights, fp32 activations and decoder", True),
    "litert": Emulation(Rewrites(), fp16_weights, "fp16 encoder weights, fp32 activations and decoder", True),
}

# target -> the fp16 recipe its export falls back to where no selection meets the fp16 bars in its fp16
# arithmetic: fp16 storage with fp32 arithmetic (what LiteRT's and ONNX's fp16 bundles are), measured by a
# selection of its own (``export.mixed.fp16_keep``)
STORAGE_FALLBACK: dict[str, Emulation] = {
    "executorch": replace(
        EMULATIONS["executorch"],
        reduce=fp16_linear_weights,
        arithmetic="fp16 encoder Linear weights, fp32 arithmetic and decoder",
    ),
}

# Not kept in fp32 but rewritten (every target): LayerNorm statistics as ``Rewrites.layer_norm="scaled"``,
# because "safe" squares (x - mean) / sqrt(C), which overflows fp16 once |x - mean| > 256 sqrt(C).
REWRITTEN = {
    "LayerNorm / LayerNorm2d": 'Rewrites.layer_norm="scaled": statistics of (x - mean) / mean|x - mean|, every '
    "intermediate in [0, C] whatever the scale of x (was: inf in the decoder's norm2 for a range-stressed checkpoint)",
}


# Measured (test-small-wide-decoder, 40 clicks on 5 photos, vs eager fp32 with upstream's operations); checkpoint
# -> (worst, median). litert: fp16 weights, fp32 arithmetic (today's form of every target); onnx and executorch:
# their fp16-arithmetic encoders (``fp16_arithmetic``); ONNX has since moved to fp16 storage with fp32 compute
FP16_MEASURED: dict[str, dict[str, tuple[float, float]]] = {
    "litert": {  # fp32 decoder weights (docs/design/precision.md)
        "synthetic:3": (0.9982, 0.9997),
        "synthetic:1": (0.9989, 0.9997),
        "synthetic:3:range4": (0.9983, 0.9997),
    },
    "onnx": {"synthetic:3": (0.9979, 0.9996), "synthetic:1": (0.9987, 0.9994), "synthetic:3:range4": (0.9980, 0.9996)},
    "executorch": {
        "synthetic:3": (0.9980, 0.9996),
        "synthetic:1": (0.9985, 0.9992),
        "synthetic:3:range4": (0.9981, 0.9995),
    },
}
# test-small, int8 encoder as the XNNPACK quantizer's converted module, fp32 decoder
INT8_MEASURED: dict[str, dict[str, tuple[float, float]]] = {
    "executorch": {
        "synthetic:1": (0.9741, 0.9930),
        "synthetic:2": (0.9641, 0.9932),
        "synthetic:0:range4": (0.9877, 0.9942),
    },
}
MEASURED_HOW = (
    "eager emulation of each target's arithmetic (sam2edge.export.precision), 40 clicks; fp16 at "
    "test-small-wide-decoder (fp16 encoder, fp32 decoder), int8 at test-small"
)


class _Program:
    def __init__(self, graph: nn.Module) -> None:
        self.graph = graph  # already in eval mode (a quantized GraphModule refuses .eval())

    @torch.no_grad()
    def __call__(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        return list(self.graph(*xs))


class GraphBackend:
    """A backend (``runtime.backends`` protocol) over the two eager graphs; remembers its last inputs."""

    name = "emulation"

    def __init__(
        self,
        model: Sam2ImageModel,
        cfg: Sam2Config,
        encoder_graph: nn.Module | None = None,
        decoder_model: Sam2ImageModel | None = None,
    ) -> None:
        self.cfg = cfg
        self.encoder_graph = encoder_graph if encoder_graph is not None else XnnEncoderGraph(model).eval()
        self.decoder_graph = XnnDecoderGraph(decoder_model if decoder_model is not None else model).eval()
        self.last_encoder_inputs: tuple = ()
        self.last_decoder_inputs: tuple = ()

    def encode(self, image) -> Features:
        x = (torch.as_tensor(image, dtype=torch.float32),)
        self.last_encoder_inputs = x
        return Features(*(t.numpy() for t in _Program(self.encoder_graph)(*x)))

    def decode(self, feats: Features, coords, labels, mask_input) -> Decoded:
        import numpy as np

        pts, lab = pad_prompt(coords, labels, MAX_POINTS)
        side = 4 * self.cfg.image_embedding_size
        has = np.zeros((1,), np.float32) if mask_input is None else np.ones((1,), np.float32)
        mask = np.zeros((1, 1, side, side), np.float32) if mask_input is None else mask_input
        ins = [feats.image_embed, feats.feat_s0, feats.feat_s1, pts, lab, mask, has]
        x = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in ins)
        self.last_decoder_inputs = x
        return Decoded(*(t.numpy() for t in _Program(self.decoder_graph)(*x)))


def emulated_pair(sd: dict, cfg: Sam2Config, target: str) -> tuple[GraphBackend, GraphBackend]:
    """(fp32 graphs, reduced-precision graphs) of ``target`` for state dict ``sd``."""
    emu = EMULATIONS[target]
    model = build_sam2(cfg, emu.rewrites)
    model.load_state_dict(sd)
    model.eval()
    reduced = emu.reduce(model).eval()
    return GraphBackend(model, cfg), GraphBackend(reduced, cfg, decoder_model=model if emu.decoder_fp32 else None)


def int8_emulation(sd: dict, cfg: Sam2Config) -> GraphBackend:
    """ExecuTorch int8: the encoder graph after the XNNPACK quantizer's prepare/convert (its quantize /
    dequantize ops run in eager, i.e. the int8 rounding of weights and activations), fp32 decoder; on the weights
    the export quantises (``export.smooth.export_weights``: smoothed)."""
    from sam2edge.export.executorch import _quantize_int8, build_model
    from sam2edge.export.executorch_graphs import encoder_inputs
    from sam2edge.export.smooth import export_weights

    model = build_model(export_weights(sd, cfg, "int8"), cfg, "int8").eval()
    return GraphBackend(model, cfg, _quantize_int8(XnnEncoderGraph(model).eval(), encoder_inputs(cfg)))


def _ious(ref, test, prompts) -> list[float]:
    """Mask IoU per prompt of ``test`` vs ``ref`` predictors at the reference's chosen candidate, in the order
    of ``prompts`` (``predict_pairs`` encodes each photo once)."""
    import numpy as np

    from sam2edge.checks.fidelity.metrics import mask_iou, predict_pairs

    out = [0.0] * len(prompts)
    for i, _, (rm, rs, _), (tm, _, _) in predict_pairs(ref, test, prompts):
        k = int(np.argmax(rs))
        out[i] = mask_iou(tm[k], rm[k])
    return out


def _localize_stage(ref_graph: nn.Module, test_graph: nn.Module, inputs: tuple, top: int) -> dict:
    from sam2edge.checks.fidelity import localize as lz

    modules = lz.module_errors(ref_graph, test_graph, inputs)
    ops = lz.op_errors(ref_graph, inputs)
    jump, op_jump = lz.first_jump(modules), lz.first_jump(ops)
    return {
        "first_module_jump": jump and lz.as_rows([jump])[0],
        "first_op_jump": op_jump and lz.as_rows([op_jump])[0],
        "worst_ops": lz.as_rows(lz.worst(ops, top)),
        "modules": lz.as_rows(modules),
        "output": lz.as_rows(modules[-1:])[0] if modules else None,
    }


def diagnose(sd: dict, cfg: Sam2Config, target: str, num_clicks: int = 40, top: int = 8) -> dict:
    """End-to-end IoU of ``target``'s fp16 emulation vs eager fp32 (upstream operations) over
    ``click_set(num_clicks)``, then, for the worst click, per-module and per-op localization of
    the encoder (on its photo) and of the decoder (fed the fp32 features, so its error is its own)."""
    import numpy as np

    from sam2edge.checks.fidelity import click_set
    from sam2edge.model import UPSTREAM
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.runtime.predictor import Sam2Predictor

    prompts = click_set(num_clicks)
    ref = Sam2Predictor(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
    fp32_graphs, test_graphs = emulated_pair(sd, cfg, target)
    fp32, test = Sam2Predictor(fp32_graphs), Sam2Predictor(test_graphs)
    ious = _ious(ref, test, prompts)
    w = int(np.argmin(ious))
    p = prompts[w]
    fp32_iou = _ious(ref, fp32, [p])[0]  # the fp32 graphs alone on the worst click (rewrites, not precision)
    decoder_only = _ious(fp32, Sam2Predictor(_DecoderOnly(fp32_graphs, test_graphs)), [p])[0]
    return {
        "target": target,
        "emulated_arithmetic": EMULATIONS[target].arithmetic,
        "clicks": len(prompts),
        "iou_worst": float(min(ious)),
        "iou_median": float(np.median(ious)),
        "worst_click": {"index": w, "photo": p.photo, "kind": p.kind, "iou": float(ious[w])},
        "worst_click_iou_fp32_graphs": fp32_iou,
        "worst_click_iou_reduced_decoder_only": decoder_only,
        "encoder": _localize_stage(
            fp32_graphs.encoder_graph, test_graphs.encoder_graph, fp32_graphs.last_encoder_inputs, top
        ),
        "decoder": _localize_stage(
            fp32_graphs.decoder_graph, test_graphs.decoder_graph, fp32_graphs.last_decoder_inputs, top
        ),
    }


class _DecoderOnly:
    """fp32 encoder + reduced-precision decoder: how much of the loss is the decoder's own."""

    name = "decoder-only"

    def __init__(self, fp32: GraphBackend, test: GraphBackend) -> None:
        self.cfg, self.fp32, self.test = fp32.cfg, fp32, test

    def encode(self, image) -> Features:
        return self.fp32.encode(image)

    def decode(self, feats, coords, labels, mask_input) -> Decoded:
        return self.test.decode(feats, coords, labels, mask_input)


def fp16_parts(model: Sam2ImageModel, whole_modules: bool = False) -> list[str]:
    """The encoder's parts the fp16 selection may keep fp32 (``export.mixed``): the trunk's stem (patch
    embedding, position embeddings), each trunk block, the neck, and the decoder's feature projections that the
    encoder graph folds in; module / parameter names of ``model``. ``whole_modules``: the submodules among them
    only (an emulation that keeps whole modules fp32, ``Emulation.whole_modules``, leaves out bare parameters)."""
    parts: list[str] = []
    for name, _ in model.named_parameters():
        if name.startswith("image_encoder.trunk.blocks."):
            part = ".".join(name.split(".")[:4])  # image_encoder.trunk.blocks.i
        elif name.startswith("image_encoder.trunk."):
            part = "image_encoder.trunk." + name.split(".")[2]  # patch_embed, pos_embed, pos_embed_window
        elif name.startswith("image_encoder.neck."):
            part = "image_encoder.neck"
        elif name.startswith(("sam_mask_decoder.conv_s0", "sam_mask_decoder.conv_s1")):
            part = ".".join(name.split(".")[:2])
        else:
            continue
        if part not in parts:
            parts.append(part)
    if whole_modules:
        modules = dict(model.named_modules())
        parts = [p for p in parts if p in modules]
    return parts


def rank_fp16(
    model: Sam2ImageModel, cfg: Sam2Config, parts: list[str], photos: tuple[str, ...], reduce: Callable = fp16_weights
) -> list[dict]:
    """``parts`` most harmful first: each reduced to fp16 alone (``reduce`` with every other part kept fp32;
    default ``fp16_weights``: its weights rounded), the largest relative L2 error it causes on the encoder's three
    outputs over ``photos`` (one encode per part and photo: a proxy ranking, cheap at full size; ``choose_kept``
    then measures end to end)."""
    import numpy as np

    from sam2edge.checks.fidelity import photo
    from sam2edge.runtime.preprocess import preprocess

    xs = [torch.as_tensor(np.asarray(preprocess(photo(p), cfg.image_size))) for p in photos]
    from sam2edge.progress import Progress

    with torch.no_grad(), Progress("fp16: ranking encoder parts (each in fp16 alone)", len(parts), "part") as bar:
        refs = [XnnEncoderGraph(model)(x) for x in xs]
        rows = []
        for part in parts:
            bar.step(note=part)
            reduced = reduce(model, tuple(p for p in parts if p != part)).eval()
            err = max(
                float((a - b).norm() / b.norm().clamp_min(1e-30))
                for x, ref in zip(xs, refs, strict=True)
                for a, b in zip(XnnEncoderGraph(reduced)(x), ref, strict=True)
            )
            rows.append({"part": part, "encoder_rel_error_alone": err})
    return sorted(rows, key=lambda r: -r["encoder_rel_error_alone"])


def select_fp16(
    model: Sam2ImageModel,
    cfg: Sam2Config,
    reference,
    bars: dict,
    clicks: int = 40,
    max_kept: int = 8,
    target: str = "litert",
    emulation: Emulation | None = None,
):
    """Which encoder parts (``fp16_parts``) an fp16 export for ``target`` keeps fp32 for ``model``'s weights,
    chosen by measurement (``export.mixed.select``): ranked by ``rank_fp16`` on calibration photos outside the
    click set, then the fewest kept until the target's emulation (``EMULATIONS[target].reduce``: fp16-rounded
    weights with fp32 arithmetic, or ExecuTorch's fp16 arithmetic) of the other parts, with an fp32 decoder,
    meets ``bars`` end to end vs ``reference`` (the export's eager fp32 backend with upstream's operations)
    over ``click_set(clicks)``; ``emulation`` replaces the target's (``STORAGE_FALLBACK``). Returns an
    ``export.mixed.Selection``."""
    import numpy as np

    from sam2edge.checks.fidelity import click_set
    from sam2edge.export.mixed import select
    from sam2edge.export.smooth import CALIBRATION_PHOTOS
    from sam2edge.runtime.predictor import Sam2Predictor

    prompts = click_set(clicks)
    ref = Sam2Predictor(reference)
    emu = emulation or EMULATIONS[target]
    parts = fp16_parts(model, emu.whole_modules)

    def measure(kept: tuple[str, ...]) -> tuple[float, float]:
        reduced = emu.reduce(model, kept).eval()
        ious = _ious(ref, Sam2Predictor(GraphBackend(reduced, cfg, decoder_model=model)), prompts)
        return float(min(ious)), float(np.median(ious))

    def rank() -> list[dict]:
        return rank_fp16(model, cfg, parts, CALIBRATION_PHOTOS[:1], emu.reduce)

    return select(rank, measure, bars, max_kept, label="fp16")
