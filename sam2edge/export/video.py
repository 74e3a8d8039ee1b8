"""The video graphs of ``sam2edge export --video``: new entries of the one pipeline's graph set.

Three graphs (I/O contract: ``sam2edge.runtime.video.bundle``), the same modules for every target; a
target only says how it wraps them (LiteRT: named outputs; ONNX / ExecuTorch fp16: ``HalfGraph``):

  memory-attention  the current frame conditioned on K spatial memory slots and P object pointers,
                    each with a validity mask (an empty slot changes nothing)
  memory-encoder    one frame's memory from its mask logits (binarised for point prompts) and features
  video-decoder     the mask decoder with host-encoded prompt tokens + mask input, returning all four
                    mask tokens, their IoU, the object score and the object pointers tracking needs

plus ``video_const.bin`` (no_mem_embed, no_obj_ptr, the 4x4 mask-prompt downsampler), ``rope_tables.bin``
(the memory attention's RoPE tables, fed as inputs) and the prompt tables. EdgeTAM: the memory encoder ends in the
perceiver (memory frames of L + G*G tokens) and its memory attention has no pointer positions and per-slot key
tables (``runtime.video.bundle.graph_io``). The frame encoder is the bundle's
image encoder. Fidelity: ``checks.fidelity.video`` runs a clip through the staged bundle and through eager
fp32 (upstream's operations), per frame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from sam2edge.config import Sam2Config, Sam2VideoConfig
from sam2edge.errors import UserError
from sam2edge.export.half import HalfGraph
from sam2edge.model import UPSTREAM
from sam2edge.model.sam2_video import Sam2VideoModel, build_sam2_video
from sam2edge.runtime.backends.litert import TABLE_FILES, write_tables
from sam2edge.runtime.prompts import prompt_tables
from sam2edge.runtime.video.backend import EagerVideoBackend
from sam2edge.runtime.video.bundle import (
    BATCHED,
    CONST_FILE,
    DEFAULT_VIDEO_TOKENS,
    LATENTS_FILE,
    ROPE_FILE,
    VIDEO_BATCH,
    VIDEO_GRAPHS,
    BundleVideoBackend,
    const_layout,
    graph_io,
    outputs,
    video_file,
)

# int8: the frame encoder is the bundle's int8 encoder; the three video graphs stay fp32 (export.kept.VIDEO_FP32_KEPT)
VIDEO_PRECISIONS = ("fp32", "fp16", "int8")
GRAPH_SET_VIDEO: dict[str, str] = {
    "memory-attention": "vision + K memory slots + P object pointers (validity masks) -> pix_feat 1xCxexe",
    "memory-encoder": "vision + low-res mask logits, binarize, object score -> memory 1xMxexe",
    "video-decoder": "pix_feat + feats + T prompt tokens + mask input -> 4 masks, iou, object score, pointers",
}
GRAPH_SET_VIDEO.update(
    {role + BATCHED: f"{what}; {VIDEO_BATCH} objects per call (padded rows)" for role, what in GRAPH_SET_VIDEO.items()}
)


class MemoryAttentionGraph(nn.Module):
    def __init__(self, model: Sam2VideoModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, vision, mem_feats, mem_tpos, mem_valid, ptrs, ptr_pos, ptr_valid, rope_cos, rope_sin):
        rope = (rope_cos, rope_sin)  # (HW, C) inputs, not constants (see MemoryAttention.forward)
        return self.model.memory_attention_step(vision, mem_feats, mem_tpos, mem_valid, ptrs, ptr_pos, ptr_valid, rope)


class TokenMemoryAttentionGraph(nn.Module):
    """EdgeTAM's memory attention: memory frames of perceiver tokens, no pointer positions, key RoPE tables."""

    def __init__(self, model: Sam2VideoModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, vision, mem_feats, mem_tpos, mem_valid, ptrs, ptr_valid, rope_cos, rope_sin, rope_cos_k, rope_sin_k
    ):
        rope = (rope_cos, rope_sin, rope_cos_k, rope_sin_k)  # inputs, not constants (see MemoryAttention.forward)
        unused = ptr_valid.new_zeros(ptr_valid.shape)  # pointer positions: not read without ptr_tpos_enc
        return self.model.memory_attention_step(vision, mem_feats, mem_tpos, mem_valid, ptrs, unused, ptr_valid, rope)


class MemoryEncoderGraph(nn.Module):
    def __init__(self, model: Sam2VideoModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, vision, low_res, binarize, score):
        return self.model.encode_memory(rows(vision, low_res.shape[0]), low_res, binarize, score)


class TokenMemoryEncoderGraph(nn.Module):
    """EdgeTAM's memory encoder (+ perceiver): no object score (no no-object embedding to add)."""

    def __init__(self, model: Sam2VideoModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, vision, low_res, binarize, latents):
        vision = rows(vision, low_res.shape[0])
        return self.model.encode_memory(vision, low_res, binarize, binarize, latents)  # the score is not read


class VideoDecoderGraph(nn.Module):
    """Host-encoded prompt tokens (T slots, ignored slots removed) + mask input -> VideoDecoded fields."""

    def __init__(self, model: Sam2VideoModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pix_feat, feat_s0, feat_s1, sparse_prompt, sparse_valid, mask_input, has_mask):
        pe = self.model.sam_prompt_encoder
        b = pix_feat.shape[0]  # objects: B = 1, or VIDEO_BATCH rows sharing the frame's feat_s0 / feat_s1
        has = has_mask.reshape(b, 1, 1, 1)
        dense = has * pe.embed_mask(mask_input) + (1.0 - has) * pe.no_mask_dense  # (B, C, e, e)
        s0, s1 = rows(feat_s0, b), rows(feat_s1, b)
        return self.model.decode_video(pix_feat, s0, s1, sparse_prompt, dense, sparse_valid)


def rows(x: torch.Tensor, b: int) -> torch.Tensor:
    """x (1, ...) -> (b, ...): the frame's features once per object, by concatenation (a converter folds it;
    GPU delegates reject BROADCAST_TO); b = 1: x itself (the single-object graphs are unchanged)."""
    return torch.cat([x] * b) if b > x.shape[0] else x


MODULES: dict[str, type[nn.Module]] = {
    "memory-attention": MemoryAttentionGraph,
    "memory-encoder": MemoryEncoderGraph,
    "video-decoder": VideoDecoderGraph,
}


def modules(vcfg: Sam2VideoConfig, batched: bool = False) -> dict[str, type[nn.Module]]:
    """role -> graph module for a video config (EdgeTAM's take ``graph_io``'s inputs); ``batched``: also the
    roles + ``BATCHED`` (the same modules: every batched shape follows from the inputs' rows)."""
    if all(graph_io(r, vcfg)[1] == VIDEO_GRAPHS[r][1] for r in VIDEO_GRAPHS):
        out = MODULES
    elif vcfg.ptr_tpos_enc or not vcfg.cross_rope_k_grid or vcfg.no_obj_embed_spatial:
        raise ValueError("no video graphs for this video config's inputs")
    else:
        out = {**MODULES, "memory-attention": TokenMemoryAttentionGraph, "memory-encoder": TokenMemoryEncoderGraph}
    return {**out, **{role + BATCHED: cls for role, cls in out.items()}} if batched else out


def perceiver_latents(model: Sam2VideoModel) -> torch.Tensor:
    """The perceiver's global then 2-D latents, (L + G*G, M): the memory encoder's ``latents`` input."""
    p = model.spatial_perceiver
    return torch.cat([p.latents, p.latents_2d]).detach().clone()


def samples(
    cfg: Sam2Config, vcfg: Sam2VideoConfig, tokens: int, model: Sam2VideoModel | None = None, batch: int = 1
) -> dict[str, dict[str, torch.Tensor]]:
    """role -> named tracing inputs, in call order (half the slots valid); ``model`` gives the RoPE tables;
    ``batch`` > 1: also the roles + ``BATCHED``, per-object inputs with ``batch`` rows (blocks) of objects."""
    out = _samples(cfg, vcfg, tokens, model or build_sam2_video(cfg, vcfg), 1)
    if batch > 1:
        out.update({role + BATCHED: s for role, s in _samples(cfg, vcfg, tokens, model, batch).items()})
    return out


def _samples(cfg: Sam2Config, vcfg: Sam2VideoConfig, tokens: int, model: Sam2VideoModel, b: int) -> dict:
    c, e, k, p = cfg.d_model, cfg.image_embedding_size, vcfg.memory_slots, vcfg.max_obj_ptrs
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    def per_object(row: torch.Tensor) -> torch.Tensor:  # (1, n) -> (b, n)
        return torch.cat([row] * b)

    half = (torch.arange(k) < (k + 1) // 2).float().reshape(1, k)
    rope = model.memory_attention.tables()  # (HW, C) each [+ (N, C) each]
    attention = {
        "vision": r(1, c, e, e),
        "mem_feats": r(b * k, *vcfg.memory_frame_shape(e)),
        "mem_tpos": per_object(torch.arange(k, dtype=torch.float32).reshape(1, k) % vcfg.num_maskmem),
        "mem_valid": per_object(half),
        "ptrs": r(b * p, c),
        "ptr_pos": per_object(torch.linspace(-1, 1, p).reshape(1, p)),
        "ptr_valid": per_object((torch.arange(p) < p // 2).float().reshape(1, p)),
        **{n: t.clone() for n, t in zip(("rope_cos", "rope_sin", "rope_cos_k", "rope_sin_k"), rope)},
    }
    return {
        "memory-attention": {n: attention[n] for n in graph_io("memory-attention", vcfg)[1]},
        "memory-encoder": {
            n: t
            for n, t in (
                ("vision", r(1, c, e, e)),
                ("low_res", r(b, 1, 4 * e, 4 * e) * 4),
                ("binarize", torch.ones(b, 1)),
                ("score", torch.ones(b, 1)),
                ("latents", model.spatial_perceiver and perceiver_latents(model)),
            )
            if n in graph_io("memory-encoder", vcfg)[1]
        },
        "video-decoder": {
            "pix_feat": r(b, c, e, e),
            "feat_s0": r(1, c // 8, 4 * e, 4 * e),
            "feat_s1": r(1, c // 4, 2 * e, 2 * e),
            "sparse_prompt": r(b, tokens, c),
            "sparse_valid": per_object((torch.arange(tokens) < 3).float().reshape(1, tokens)),
            "mask_input": r(b, 1, 4 * e, 4 * e),
            "has_mask": torch.ones(b, 1),
        },
    }


CLIP_NOTE = "two-object clip with a correction and reverse propagation"


def check_request(spec, vcfg: Sam2VideoConfig, precision: str) -> Sam2VideoConfig:
    """``vcfg`` if ``spec`` ships video graphs at ``precision``; else one line naming what is offered."""
    if spec.video is None:
        raise UserError(f"--video is not offered for --target {spec.name}; use litert, onnx or executorch")
    if precision not in VIDEO_PRECISIONS:
        raise UserError(f"--video offers --precision {' or '.join(VIDEO_PRECISIONS)}, not {precision!r}")
    return vcfg


def image_part(sd: dict, cfg: Sam2Config) -> dict:
    """The image model's tensors of a video state dict."""
    from sam2edge.weights.load import expected_shapes

    return {k: sd[k] for k in expected_shapes(cfg)}


def prepare(job, sd: dict, rewrites) -> None:
    """Build the fp32 video model with the target's rewrites into ``job.state['video']``."""
    model = build_sam2_video(job.cfg, job.vcfg, rewrites)
    model.load_state_dict(sd, strict=True)
    batch = int(job.state.get("video_batch", VIDEO_BATCH))  # options video_batch=1: no batched video graphs
    if batch not in (1, VIDEO_BATCH):
        raise UserError(f"video_batch {batch}: the video graphs are exported at 1 or {VIDEO_BATCH} objects per call")
    job.state["video"] = {"model": model.eval(), "sd": sd, "tokens": DEFAULT_VIDEO_TOKENS, "batch": batch}


def entries(job, wrap: Callable[[nn.Module, str], nn.Module], named: bool) -> dict:
    """file -> (role, wrapped module, sample) for the three video graphs of ``job.target``."""
    v = job.state["video"]
    sample = samples(job.cfg, job.vcfg, v["tokens"], v["model"], v["batch"])
    out = {}
    for role, cls in modules(job.vcfg, v["batch"] > 1).items():
        s = sample[role]
        out[video_file(job.target.name, role)] = (role, wrap(cls(v["model"]), role), s if named else tuple(s.values()))
    return out


def half_if_fp16(job) -> Callable[[nn.Module, str], nn.Module]:
    return lambda module, role: HalfGraph(module) if job.precision == "fp16" else module


def write_video_tables(job) -> dict[str, str]:
    """video_const.bin (+ the prompt tables where the target did not write them); file -> role."""
    model = job.state["video"]["model"]
    parts = {
        "no_mem_embed": model.no_mem_embed,
        "no_obj_ptr": model.no_obj_ptr,
        "mask_downsample_weight": model.mask_downsample.weight,
        "mask_downsample_bias": model.mask_downsample.bias,
    }
    assert list(parts) == list(const_layout(job.cfg.d_model))
    flat = np.concatenate([t.detach().float().numpy().ravel() for t in parts.values()]).astype("<f4")
    flat.tofile(job.folder / CONST_FILE)
    tables = model.memory_attention.tables()  # frame (cos, sin) [+ key (cos, sin)], the graph's input order
    np.concatenate([t.numpy().ravel() for t in tables]).astype("<f4").tofile(job.folder / ROPE_FILE)
    files = {CONST_FILE: "video-table", ROPE_FILE: "video-table"}
    if model.spatial_perceiver is not None:
        perceiver_latents(model).numpy().astype("<f4").tofile(job.folder / LATENTS_FILE)
        files[LATENTS_FILE] = "video-table"
    if not all(name in job.files for name in TABLE_FILES):
        files.update(write_tables(prompt_tables(model), job.folder))
    return files


def _shapes(named: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in named.items()}


@torch.no_grad()
def extra(job) -> dict:
    """card.json ``extra.video``: config, slot layout, every graph's tensors, the host tables."""
    v, cfg, vcfg = job.state["video"], job.cfg, job.vcfg
    e, n = cfg.image_embedding_size, cfg.d_model // vcfg.mem_dim
    frame_tokens = vcfg.memory_tokens or e * e
    graphs = {}
    graph_modules = modules(vcfg, v["batch"] > 1)
    for role, named in samples(cfg, vcfg, v["tokens"], v["model"], v["batch"]).items():
        outs = graph_modules[role](v["model"])(*named.values())
        outs = (outs,) if isinstance(outs, torch.Tensor) else outs
        graphs[role] = {
            "file": video_file(job.target.name, role),
            "computes": GRAPH_SET_VIDEO[role],
            "inputs": _shapes(named),
            "outputs": {k: list(o.shape) for k, o in zip(outputs(role), outs)},
        }
    return {
        "config": dataclasses.asdict(vcfg),
        "num_tokens": v["tokens"],
        "batch": v["batch"],  # objects per call of the graphs with role + "-batched" (1: none)
        "graphs": graphs,
        "slot_layout": {
            "memory_slots": vcfg.memory_slots,
            "pointer_slots": vcfg.max_obj_ptrs,
            "tokens_per_pointer": n,
            "tokens_per_memory": frame_tokens,
            "key_tokens": vcfg.memory_slots * frame_tokens + vcfg.max_obj_ptrs * n,
            "spatial": "mem_feats[k]: one frame's memory (every conditioning frame, t_pos 0, then the previous "
            "num_maskmem - 1 frames in the tracking direction, upstream's selection in runtime.video.memory_bank); "
            "mem_tpos[k] = num_maskmem - t_pos - 1 (index into maskmem_tpos_enc); mem_valid[k] 1 filled / 0 empty",
            "pointers": "ptrs[p] = object pointer of an earlier frame, ptr_pos[p] = signed frame distance / "
            "t_max, ptr_valid[p] 1 filled / 0 empty; each pointer is split into C/M tokens of mem_dim",
            "empty": "empty slots are zeros with valid 0; their keys get a -1e4 logit bias (exactly no effect)",
        },
        "tables": {CONST_FILE: {k: {"offset": o, "count": c} for k, (o, c) in const_layout(cfg.d_model).items()}},
        "frame_encoder": "the image encoder; vision = image_embeddings - no_mem_embed on the host",
    }


def measure(job, image_backend, bars: dict | None = None) -> dict:
    """The clip measurement of the staged bundle, ``image_backend`` its frame encoder, vs eager fp32 (upstream's
    operations); the eager clip runs once per export (``job.measured``), whichever frame encoder comes first."""
    from sam2edge.checks.fidelity.video import clip, measure_video, run_clip

    v = job.state["video"]
    if "video_clip" not in job.measured:
        ref = EagerVideoBackend.from_state_dict(v["sd"], job.cfg, job.vcfg, UPSTREAM)
        job.measured["video_clip"] = run_clip(ref, clip())
    kw = {"num_tokens": v["tokens"], "batch": v["batch"]}  # the clip's two objects run through the batched graphs
    test = BundleVideoBackend(image_backend, job.target.name, job.folder, job.cfg, job.vcfg, **kw)
    return measure_video(None, test, job.precision, bars=bars, want=job.measured["video_clip"])
