"""Weights of the video model: the image path through ``load.to_sam2edge`` plus the memory path.

* Meta ``.pt``: sam2edge's video names are upstream ``SAM2Base`` names (identity), the prefixes that
  ``keymap.META_VIDEO_ONLY`` lists as video-only for the image model, plus EdgeTAM's ``spatial_perceiver.``
  (the original EdgeTAM ``edgetam.pt`` holds the same names).
* HF ``.safetensors`` (transformers ``Sam2VideoModel`` names): ``VIDEO_HF_RULES`` rewrite a sam2edge
  video name into the HF name (checked against transformers' ``Sam2VideoModel`` state dict).
* HF ``.safetensors`` of transformers' ``EdgeTamVideoModel``: ``EDGETAM_HF_RULES`` first (the perceiver's names,
  the memory attention's MLP), then ``VIDEO_HF_RULES``. The perceiver's fused key-value projection ``to_kv``
  (2 inner, dim) is HF's ``k_proj`` and ``v_proj`` stacked in that order (``KV``). transformers'
  ``enable_temporal_pos_encoding_for_object_pointers`` / ``enable_occlusion_spatial_embedding`` (on in its default
  config, off in EdgeTAM's ``configs/edgetam.yaml`` and its converted checkpoint) add tensors EdgeTAM's model has no
  place for: a file holding them is refused by name (``HF_UNMAPPED``), as is any memory-path tensor left unused.
Every SAM 2.1 size (``config.VIDEO_CONFIGS``) has the same memory-path names and shapes; the size is read from
the image trunk's shapes (``sizes.detect_config``) as for the image path. Kept apart from ``load.py`` so the image
loader stays as it is.
"""

from __future__ import annotations

import re

import torch

from sam2edge.config import HIERA_TINY, VIDEO_TINY, Sam2Config, Sam2VideoConfig
from sam2edge.model.sam2_video import build_sam2_video
from sam2edge.weights.keymap import HF_VIDEO_ONLY, META_VIDEO_ONLY
from sam2edge.weights.load import (
    SYNTHETIC,
    WeightsError,
    expected_shapes,
    read_checkpoint,
    resolve_checkpoint,
    sha256_file,
    to_sam2edge,
)
from sam2edge.weights.sizes import check_size

# (pattern, replacement) applied one after another with re.sub to a sam2edge video name.
VIDEO_HF_RULES: tuple[tuple[str, str], ...] = (
    (r"^maskmem_tpos_enc$", "memory_temporal_positional_encoding"),
    (r"^no_mem_pos_enc$", "no_memory_positional_encoding"),
    (r"^no_obj_ptr$", "no_object_pointer"),
    (r"^no_obj_embed_spatial$", "occlusion_spatial_embedding_parameter"),
    (r"^obj_ptr_proj\.layers\.0\.", "object_pointer_proj.proj_in."),
    (r"^obj_ptr_proj\.layers\.1\.", "object_pointer_proj.layers.0."),
    (r"^obj_ptr_proj\.layers\.2\.", "object_pointer_proj.proj_out."),
    (r"^obj_ptr_tpos_proj\.", "temporal_positional_encoding_projection_layer."),
    (r"(memory_attention\.layers\.\d+)\.norm([123])\.", r"\1.layer_norm\2."),
    (r"^memory_attention\.norm\.", "memory_attention.layer_norm."),
    (r"\.out_proj\.", ".o_proj."),
    (r"^memory_encoder\.o_proj\.", "memory_encoder.projection."),
    (r"^memory_encoder\.pix_feat_proj\.", "memory_encoder.feature_projection."),
    (r"^memory_encoder\.fuser\.", "memory_encoder.memory_fuser."),
    (r"(memory_fuser\.layers\.\d+)\.gamma$", r"\1.scale"),
    (r"(memory_fuser\.layers\.\d+)\.dwconv\.", r"\1.depthwise_conv."),
    (r"(memory_fuser\.layers\.\d+)\.norm\.", r"\1.layer_norm."),
    (r"(memory_fuser\.layers\.\d+)\.pwconv([12])\.", r"\1.pointwise_conv\2."),
)
# EdgeTAM (perceiver_layers > 0): applied before VIDEO_HF_RULES. "{kv}" marks a tensor stacked from HF's k / v.
KV = "{kv}"
EDGETAM_HF_RULES: tuple[tuple[str, str], ...] = (
    (r"^spatial_perceiver\.latents$", "spatial_perceiver.latents_1d"),  # the global latents
    (r"^spatial_perceiver\.norm\.", "spatial_perceiver.layer_norm."),
    (r"^(spatial_perceiver\.layers\.\d+)\.attn\.norm_x\.", r"\1.layer_norm_input."),
    (r"^(spatial_perceiver\.layers\.\d+)\.attn\.norm_latents\.", r"\1.layer_norm_latents."),
    (r"^(spatial_perceiver\.layers\.\d+)\.attn\.to_q\.", r"\1.cross_attention.q_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.attn\.to_kv\.", r"\1.cross_attention.{kv}_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.attn\.to_out\.", r"\1.cross_attention.o_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.self_attn\.norm\.", r"\1.layer_norm_self."),
    (r"^(spatial_perceiver\.layers\.\d+)\.self_attn\.to_q\.", r"\1.self_attention.q_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.self_attn\.to_kv\.", r"\1.self_attention.{kv}_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.self_attn\.to_out\.", r"\1.self_attention.o_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.(self_)?ff\.0\.", r"\1.\2mlp.layer_norm."),  # LayerNorm, Linear, GELU, Linear
    (r"^(spatial_perceiver\.layers\.\d+)\.(self_)?ff\.1\.", r"\1.\2mlp.up_proj."),
    (r"^(spatial_perceiver\.layers\.\d+)\.(self_)?ff\.3\.", r"\1.\2mlp.down_proj."),
    (r"^(memory_attention\.layers\.\d+)\.linear1\.", r"\1.mlp.up_proj."),
    (r"^(memory_attention\.layers\.\d+)\.linear2\.", r"\1.mlp.down_proj."),
)
# HF memory-path tensors a model without that part cannot take: (name prefix, what it is)
HF_UNMAPPED: tuple[tuple[str, str], ...] = (
    (
        "temporal_positional_encoding_projection_layer.",
        "a temporal encoding of object pointers (transformers' enable_temporal_pos_encoding_for_object_pointers)",
    ),
    (
        "occlusion_spatial_embedding_parameter",
        "an occlusion embedding of memories (transformers' enable_occlusion_spatial_embedding)",
    ),
)
MEMORY_PATH = tuple(dict.fromkeys((*META_VIDEO_ONLY, "spatial_perceiver.")))  # sam2edge names of the memory path
_DOWNSAMPLER = re.compile(r"^memory_encoder\.mask_downsampler\.encoder\.(\d+)\.(.+)$")


def video_hf_name(name: str, final_index: int, edgetam: bool = False) -> str:
    """sam2edge video name -> HF name; ``final_index`` is the downsampler's last (1x1 conv) index; ``edgetam``:
    transformers' ``EdgeTamVideoModel`` names (a name holding ``KV`` is two HF tensors, k then v)."""
    m = _DOWNSAMPLER.match(name)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        if i == final_index:
            return f"memory_encoder.mask_downsampler.final_conv.{rest}"
        part = "conv" if i % 3 == 0 else "layer_norm"
        return f"memory_encoder.mask_downsampler.layers.{i // 3}.{part}.{rest}"
    for pattern, repl in (*EDGETAM_HF_RULES, *VIDEO_HF_RULES) if edgetam else VIDEO_HF_RULES:
        name = re.sub(pattern, repl, name)
    return name


def _hf_tensor(sd: dict[str, torch.Tensor], src: str) -> tuple[torch.Tensor | None, list[str]]:
    """(tensor or None when missing, the HF names it reads); a ``KV`` name stacks HF's k and v along dim 0."""
    if KV not in src:
        return sd.get(src), [src]
    names = [src.replace(KV, part) for part in ("k", "v")]
    if any(n not in sd for n in names):
        return None, names
    return torch.cat([sd[n] for n in names], dim=0), names


def video_expected_shapes(cfg: Sam2Config, vcfg: Sam2VideoConfig) -> dict[str, torch.Size]:
    """Shapes of the memory-path tensors only (the image path is ``load.expected_shapes``)."""
    sd = build_sam2_video(cfg, vcfg).state_dict()
    return {k: v.shape for k, v in sd.items() if k.startswith(MEMORY_PATH)}


def map_video_tensors(
    sd: dict[str, torch.Tensor], fmt: str, cfg: Sam2Config, vcfg: Sam2VideoConfig, source: str
) -> dict[str, torch.Tensor]:
    """The memory-path tensors of a checkpoint under sam2edge names, strictly (missing / mis-shaped raise)."""
    expected = video_expected_shapes(cfg, vcfg)
    final = 3 * (vcfg.mask_stride.bit_length() - 1)  # index of the downsampler's 1x1 conv
    edgetam = vcfg.perceiver_layers > 0
    out, problems, used = {}, [], set()
    for name, shape in expected.items():
        src = name if fmt == "meta" else video_hf_name(name, final, edgetam)
        t, names = (sd.get(src), [src]) if fmt == "meta" else _hf_tensor(sd, src)
        used.update(names)
        if t is None:
            problems.append("missing " + " + ".join(n for n in names if n not in sd))
        elif t.shape != shape:
            problems.append(f"{src.replace(KV, 'k+v')} {tuple(t.shape)} != {tuple(shape)}")
        else:
            out[name] = t.float()
    if fmt == "hf":
        left = sorted(k for k in sd if k.startswith(HF_VIDEO_ONLY) and k not in used)
        for k in left:
            why = next((w for p, w in HF_UNMAPPED if k.startswith(p)), None)
            if why and not problems:
                family = "EdgeTAM" if edgetam else "this SAM 2.1 size"
                raise WeightsError(
                    f"checkpoint {source} holds {k}, {why}, which {family}'s model does not have; pass a file saved"
                    " with that option off, as EdgeTAM's official checkpoint is"
                )
        problems += [f"unexpected {k}" for k in left]
    if problems:
        shown = ", ".join(problems[:4]) + (f", +{len(problems) - 4} more" if len(problems) > 4 else "")
        family, pt = ("EdgeTAM", "edgetam.pt") if vcfg.perceiver_layers else ("SAM 2.1", "sam2.1_hiera_*.pt")
        raise WeightsError(
            f"checkpoint {source} lacks {family}'s video tensors ({shown}); pass an unmodified official"
            f" {family} checkpoint ({pt} or a Hugging Face model.safetensors)"
        )
    return out


def synthetic_video_state_dict(
    cfg: Sam2Config = HIERA_TINY, vcfg: Sam2VideoConfig = VIDEO_TINY, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Deterministic stand-in weights for the whole video model (seeded init + 0.02 * randn)."""
    torch.manual_seed(seed)
    model = build_sam2_video(cfg, vcfg)
    g = torch.Generator().manual_seed(seed + 1)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def video_configs(
    spec: str | None, cfg: Sam2Config | None = None, vcfg: Sam2VideoConfig | None = None
) -> tuple[Sam2Config, Sam2VideoConfig]:
    """(cfg, vcfg) for a checkpoint spec: those given, else the model its tensor shapes name (SAM 2.1 size or
    EdgeTAM; Hiera-Tiny for synthetic weights)."""
    from sam2edge.config import get_config, get_video_config
    from sam2edge.weights.sizes import checkpoint_config

    if cfg is None or vcfg is None:
        name = checkpoint_config(spec)
        cfg = cfg or get_config(name)
        vcfg = vcfg or get_video_config(name, cfg.image_size)
    return cfg, vcfg


def load_video_weights(
    spec: str | None, cfg: Sam2Config = HIERA_TINY, vcfg: Sam2VideoConfig = VIDEO_TINY
) -> tuple[dict[str, torch.Tensor], dict]:
    """Video-model state dict + provenance {"checkpoint", "format", "sha256"} for a checkpoint spec."""
    path = resolve_checkpoint(spec)
    if path == SYNTHETIC:
        return synthetic_video_state_dict(cfg, vcfg), {"checkpoint": SYNTHETIC, "format": SYNTHETIC, "sha256": None}
    sd, fmt = read_checkpoint(path)
    check_size(sd, cfg, f"checkpoint {path}")  # another size than cfg: one line naming both
    image = {k: v for k, v in sd.items() if not k.startswith("spatial_perceiver.")}  # memory path, mapped below
    mapped = to_sam2edge(image, fmt, expected_shapes(cfg), str(path))
    mapped.update(map_video_tensors(sd, fmt, cfg, vcfg, str(path)))
    return mapped, {"checkpoint": str(path), "format": fmt, "sha256": sha256_file(path)}
