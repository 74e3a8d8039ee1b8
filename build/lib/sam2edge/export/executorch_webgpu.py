"""ExecuTorch WebGPU export: the 512x512 programs of reference card 004, plus proof on CPU.

Bundle (``sam2edge export --target executorch-webgpu``; e = 32, C = 256 for Hiera-Tiny at 512):

  sam2_encoder.pte  forward(pixels [1,3,512,512] ImageNet-normalised RGB)
                    -> image_embeddings [1,C,e,e] (no_mem_embed added), hr0 [1,C,4e,4e], hr1 [1,C,2e,2e]
                       (raw FPN levels; the decoder applies conv_s0 / conv_s1)
  sam2_decoder.pte  forward(image_embeddings, image_pe [1,C,e,e], sparse [1,1,3,C], dense [1,C,e,e], hr0, hr1)
                    -> masks [1,3,4e,4e] (logits of the 3 candidates), iou_scores [1,1,3] (after sigmoid),
                       object_score_logits [1,1,1]
  prompt_*.bin      raw little-endian float32 host tables: gaussian [2,C/2], point_embed_fg / _bg,
                    box_tl / box_br, not_a_point [C], img_pos = image_pe [1,C,e,e], dense = no-mask [1,C,e,e]
  manifest.json     SHA-256 and size of every file; card.json; fidelity.json

Sparse tokens (host): [sin(2 pi c G), cos(2 pi c G)] + e with c = 2 (p + 0.5) / 512 - 1; a click is
[point, pad, pad], a box [top-left, bottom-right, pad], pad = not_a_point alone. The decoder ignores a
pad that follows a pad (exactly removed from attention), so a click gives upstream's [point, pad] answer.

Programs are lowered with ``executorch.backends.webgpu.WebGPUPartitioner``. The Python runtime here runs
no Vulkan/WebGPU program, so the same exported graphs are also lowered to XNNPACK (with the exact XNNPACK
legalization of ``executorch_lower``; portable kernels for the rest) and run against upstream's operations
at 512 on 5 click and 5 box prompts on real photos (mask IoU, all three candidates); the result is in
fidelity.json. Inputs are passed contiguous: ExecuTorch reads a strided tensor's storage as if dense (a permuted
image_pe fed that way cost the twin 0.013 of mask IoU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from sam2edge.checks.fidelity import click_set, compare, mask_iou, photo
from sam2edge.config import Sam2Config
from sam2edge.errors import UserError
from sam2edge.export.executorch_graphs import XnnEncoderGraph
from sam2edge.export.executorch_lower import lower
from sam2edge.export.pipeline import TargetSpec, run_export
from sam2edge.model import Rewrites, Sam2ImageModel
from sam2edge.runtime.backends import EagerBackend, Features
from sam2edge.runtime.preprocess import preprocess
from sam2edge.runtime.prompts import encode_points, prompt_layout, prompt_tables

RESOLUTION = 512
SLOTS = 3
ENCODER_FILE, DECODER_FILE = "sam2_encoder.pte", "sam2_decoder.pte"
VERIFY_PROMPTS = 20  # click_set entries (5 of each kind); the 5 point and 5 box prompts are kept


class WebGpuEncoderGraph(XnnEncoderGraph):
    """pixels -> (image_embeddings, hr0, hr1) with raw high-res FPN levels (card 004)."""

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fpn0, fpn1, fpn2 = self.backbone_fpn(pixels)
        return fpn2 + self.model.no_mem_embed.reshape(1, -1, 1, 1), fpn0, fpn1


class WebGpuDecoderGraph(nn.Module):
    """(image_embeddings, image_pe, sparse [1,1,3,C], dense, hr0, hr1) -> (masks, iou_scores, object_score_logits)."""

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeddings, image_pe, sparse, dense, hr0, hr1):
        dec = self.model.sam_mask_decoder
        c = sparse.shape[-1]
        tokens = sparse.reshape(1, SLOTS, c)  # (1, 3, C)
        nap = self.model.sam_prompt_encoder.not_a_point_embed.weight  # (1, C)
        is_pad = (((tokens - nap) ** 2).sum(-1) == 0).to(tokens.dtype)  # (1, 3): token equals not_a_point
        after_pad = torch.cat([torch.zeros_like(is_pad[:, :1]), is_pad[:, :-1]], dim=1)  # (1, 3)
        valid = 1.0 - is_pad * after_pad  # a pad that follows a pad is ignored
        masks, iou, obj = dec(image_embeddings, image_pe, tokens, dense, dec.conv_s0(hr0), dec.conv_s1(hr1), valid)
        m3, i3 = dec.multimask(masks, iou)  # (1, 3, 4e, 4e), (1, 3)
        return m3, i3.reshape(1, 1, SLOTS), obj.reshape(1, 1, 1)


def write_tables(model: Sam2ImageModel, folder: Path) -> dict[str, str]:
    """The card-004 prompt_*.bin files (raw little-endian float32); returns file -> role."""
    t = prompt_tables(model)
    pe = model.sam_prompt_encoder
    arrays = {
        "prompt_gaussian.bin": t["gaussian"],
        "prompt_point_embed_bg.bin": t["point_embed"][0],
        "prompt_point_embed_fg.bin": t["point_embed"][1],
        "prompt_box_tl.bin": t["point_embed"][2],
        "prompt_box_br.bin": t["point_embed"][3],
        "prompt_not_a_point.bin": t["not_a_point"],
        "prompt_img_pos.bin": pe.image_pe.detach().numpy(),
        "prompt_dense.bin": pe.no_mask_dense.detach().numpy(),
    }
    for name, a in arrays.items():
        np.ascontiguousarray(a, dtype="<f4").tofile(folder / name)
    return {name: "prompt-table" for name in arrays}


def host_sparse(coords: np.ndarray, labels: np.ndarray, tables: dict) -> np.ndarray:
    """coords Nx2 model px (512 grid), labels N (N <= 3; -1 pads) -> sparse [1,1,3,C] padded with pads."""
    n = len(labels)
    c = np.concatenate([np.asarray(coords, np.float32).reshape(-1, 2), np.zeros((SLOTS - n, 2), np.float32)])
    lab = np.concatenate([np.asarray(labels, np.float32), -np.ones(SLOTS - n, np.float32)])
    tokens, _ = encode_points(c, lab, tables, RESOLUTION)
    return tokens.reshape(1, 1, SLOTS, -1)


def sample_inputs(cfg: Sam2Config) -> tuple[tuple, tuple]:
    e, c = cfg.image_embedding_size, cfg.d_model
    enc = (torch.randn(1, 3, RESOLUTION, RESOLUTION),)
    dec = (
        torch.randn(1, c, e, e),
        torch.randn(1, c, e, e),
        torch.randn(1, 1, SLOTS, c),
        torch.randn(1, c, e, e),
        torch.randn(1, c, 4 * e, 4 * e),
        torch.randn(1, c, 2 * e, 2 * e),
    )
    return enc, dec


def _model_prompt(p, hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A click_set prompt (point or box, original pixels) in the one prompt layout on the 512 grid (N x 2, N)."""
    box = p.box if p.kind == "box" else None
    points, labels = (p.point_coords, p.point_labels) if p.kind == "point" else (None, None)
    coords, labs = prompt_layout(box, points, labels, np.array([hw[1], hw[0]], np.float32), RESOLUTION)
    return coords[0], labs[0]


def verify_on_cpu(programs: dict, model: Sam2ImageModel, ref: EagerBackend, folder: Path) -> dict:
    """Run the XNNPACK/portable twins with host-encoded prompts; compare with upstream's operations at 512."""
    from executorch.runtime import Runtime

    rt = Runtime.get()
    meth = {}
    for name, (prog, _) in programs.items():
        path = folder / f"cpu_{name}"
        path.write_bytes(prog.buffer)
        meth[name] = rt.load_program(path).load_method("forward")
    tables = prompt_tables(model)
    pe = model.sam_prompt_encoder
    # ExecuTorch reads an input's storage as contiguous whatever its strides: a permuted buffer such as
    # image_pe would be fed transposed (this was the twin's 0.987 IoU), so every input is made dense.
    image_pe, dense = pe.image_pe.detach().contiguous(), pe.no_mask_dense.detach().contiguous()
    worst: dict[str, float] = {}
    rows, current = [], None
    for p in (p for p in click_set(VERIFY_PROMPTS) if p.kind in ("point", "box")):
        if p.photo != current:
            img, current = photo(p.photo), p.photo
            x = preprocess(img, RESOLUTION)
            emb, hr0, hr1 = (t.clone() for t in meth[ENCODER_FILE].execute([x]))  # outputs may alias the arena
            rf = ref.encode(x.numpy())
            feats = Features(rf.image_embed, rf.feat_s0, rf.feat_s1)
            cos = compare(emb.numpy(), rf.image_embed)["cosine"]
            worst["image_embeddings_cosine"] = min(worst.get("image_embeddings_cosine", 1.0), cos)
        coords, labels = _model_prompt(p, img.shape[:2])
        sparse = torch.from_numpy(host_sparse(coords, labels, tables))
        masks, iou, _ = meth[DECODER_FILE].execute([emb, image_pe, sparse, dense, hr0, hr1])
        r = ref.decode(feats, coords[None], labels[None], None)
        per = [mask_iou(masks.numpy()[0, k] > 0, r.masks[0, k] > 0) for k in range(3)]
        worst["masks_cosine"] = min(worst.get("masks_cosine", 1.0), compare(masks.numpy(), r.masks)["cosine"])
        d_iou = float(np.abs(iou.numpy().ravel() - r.iou.ravel()).max())
        worst["iou_scores_max_abs"] = max(worst.get("iou_scores_max_abs", 0.0), d_iou)
        rows.append({"photo": p.photo, "kind": p.kind, "mask_iou_min_over_3": min(per)})
    for name in programs:
        (folder / f"cpu_{name}").unlink()
    return {"prompts": rows, "mask_iou_worst": min(r["mask_iou_min_over_3"] for r in rows), **worst}


def _config(cfg: Sam2Config, resolution: int | None) -> Sam2Config:
    if resolution not in (None, RESOLUTION):
        raise UserError(f"the WebGPU contract is {RESOLUTION}x{RESOLUTION} (card 004); drop --resolution or pass 512")
    return cfg.at_resolution(RESOLUTION)


def _graphs(job) -> dict:
    enc_args, dec_args = sample_inputs(job.cfg)
    return {
        ENCODER_FILE: ("encoder", WebGpuEncoderGraph(job.model), enc_args),
        DECODER_FILE: ("decoder", WebGpuDecoderGraph(job.model), dec_args),
    }


def _convert(job, file: str, module: nn.Module, args: tuple) -> None:
    """Lower with the WebGPU partitioner (written) and, for the proof on CPU, to XNNPACK (kept in state)."""
    from executorch.backends.webgpu.partitioner import WebGPUPartitioner
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    prog, census = lower(module, args, [WebGPUPartitioner()], legalize=False)
    (job.folder / file).write_bytes(prog.buffer)
    job.state.setdefault("delegation", {})[file] = census.as_dict()
    twin, twin_census = lower(module, args, [XnnpackPartitioner()], legalize=True)
    job.state.setdefault("twins", {})[file] = (twin, twin_census)


def measure_twin(job, ref: EagerBackend) -> dict:
    """fidelity.json (the one schema) from the XNNPACK twins vs upstream's operations at 512: outputs =
    worst cosines, end_to_end = mask IoU over the point / box prompts; bar: mask IoU worst 1.0."""
    v = verify_on_cpu(job.state["twins"], job.model, ref, job.folder)
    ious = [r["mask_iou_min_over_3"] for r in v["prompts"]]
    failures = (
        []
        if v["mask_iou_worst"] >= 1.0
        else [f"CPU twin mask IoU worst {v['mask_iou_worst']:.4f} < 1.000 vs upstream at {RESOLUTION}"]
    )
    return {
        "reference": "sam2edge eager fp32 with upstream's operations at 512 (Rewrites=UPSTREAM)",
        "method": "the exported graphs lowered to XNNPACK/portable (this runtime cannot run WebGPU programs)",
        "outputs": {
            "encoder.image_embeddings": {"cosine": v["image_embeddings_cosine"]},
            "decoder.masks": {"cosine": v["masks_cosine"]},
            "decoder.iou_scores": {"cosine": 1.0, "max_abs": v["iou_scores_max_abs"]},
        },
        "end_to_end": {
            "clicks": len(ious),
            "photos": sorted({r["photo"] for r in v["prompts"]}),
            "iou_median": float(np.median(ious)),
            "iou_worst": float(min(ious)),
        },
        "cpu_twin": v,
        "bars": {"mask_iou_worst_min": 1.0},
        "failures": failures,
        "passed": not failures,
    }


def _extra(job) -> dict:
    return {
        "delegation": job.state["delegation"],
        "cpu_twin_delegation": {n: c.as_dict() for n, (_, c) in job.state["twins"].items()},
        "partitioner": "executorch.backends.webgpu.WebGPUPartitioner",
        "slots": SLOTS,
        "prompt_layout": "click [point, pad, pad]; box [top-left, bottom-right, pad]; pad = not_a_point alone",
        "executable_here": False,
    }


def export_webgpu(
    cfg: Sam2Config,
    config_name: str,
    checkpoint: str | None,
    out: str | Path,
    *,
    force: bool = False,
    command: str = "",
) -> dict:
    """``run_export`` for the card-004 WebGPU programs (fp32, 512x512); returns the card."""
    return run_export(
        "executorch-webgpu", config_name, "fp32", out, checkpoint=checkpoint, force=force, command=command
    )


def summary(card: dict, out: Path) -> str:
    d, v = card["extra"]["delegation"], card["fidelity"]["cpu_twin"]
    lines = [f"bundle: {Path(out).resolve()} (WebGPU, {RESOLUTION}px, status {card['status']})"]
    for name, c in d.items():
        lines.append(f"  {name:<18} {c['delegated_ops']}/{c['total_ops']} ops in {c['delegates']} WebGPU partition(s)")
    n = len(v["prompts"])
    lines.append(f"  CPU twin vs upstream: mask IoU worst {v['mask_iou_worst']:.4f} over {n} click/box prompts")
    return "\n".join(lines)


SPEC = TargetSpec(
    name="executorch-webgpu",
    rewrites=Rewrites(),
    graphs=_graphs,
    convert=_convert,
    open_backend=None,
    extra=_extra,
    summary=summary,
    config=_config,
    tables=lambda job: write_tables(job.model, job.folder),
    measure=measure_twin,
)
