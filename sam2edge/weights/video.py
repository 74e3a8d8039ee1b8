"""Weights of the video model: the image path through ``load.to_sam2edge`` plus the memory path.

* Meta ``.pt``: sam2edge's video names are upstream ``SAM2Base`` names (identity), the prefixes that
  ``keymap.META_VIDEO_ONLY`` lists as video-only for the image model, plus EdgeTAM's ``spatial_perceiver.``
  (the original EdgeTAM ``edgetam.pt`` holds the same names).
* HF ``.safetensors`` (transformers ``Sam2VideoModel`` names): ``VIDEO_HF_RULES`` rewrite a sam2edge
  video name into the HF name (checked against transformers' ``Sam2VideoModel`` state dict).
Every SAM 2.1 size (``config.VIDEO_CONFIGS``) has the same memory-path names and shapes; the size is read from
the image trunk's shapes (``sizes.detect_config``) as for the image path. Kept apart from ``load.py`` so the image
loader stays as it is.
"""

from __future__ import annotations

import re

import torch

from sam2edge.config import HIERA_TINY, VIDEO_TINY, Sam2Config, Sam2VideoConfig
from sam2edge.model.sam2_video import build_sam2_video
from sam2edge.weights.keymap import META_VIDEO_ONLY
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
MEMORY_PATH = tuple(dict.fromkeys((*META_VIDEO_ONLY, "spatial_perceiver.")))  # sam2edge names of the memory path
_DOWNSAMPLER = re.compile(r"^memory_encoder\.mask_downsampler\.encoder\.(\d+)\.(.+)$")


def video_hf_name(name: str, final_index: int) -> str:
    """sam2edge video name -> HF name; ``final_index`` is the downsampler's last (1x1 conv) index."""
    m = _DOWNSAMPLER.match(name)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        if i == final_index:
            return f"memory_encoder.mask_downsampler.final_conv.{rest}"
        part = "conv" if i % 3 == 0 else "layer_norm"
        return f"memory_encoder.mask_downsampler.layers.{i // 3}.{part}.{rest}"
    for pattern, repl in VIDEO_HF_RULES:
        name = re.sub(pattern, repl, name)
    return name


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
    out, problems = {}, []
    for name, shape in expected.items():
        src = name if fmt == "meta" else video_hf_name(name, final)
        if src not in sd:
            problems.append(f"missing {src}")
        elif sd[src].shape != shape:
            problems.append(f"{src} {tuple(sd[src].shape)} != {tuple(shape)}")
        else:
            out[name] = sd[src].float()
    if problems:
        shown = ", ".join(problems[:4]) + (f", +{len(problems) - 4} more" if len(problems) > 4 else "")
        family = "EdgeTAM" if vcfg.perceiver_layers else "SAM 2.1"
        raise WeightsError(
            f"checkpoint {source} lacks {family}'s video tensors ({shown}); pass an unmodified official"
            f" {family} checkpoint (edgetam.pt, sam2.1_hiera_*.pt or a Hugging Face model.safetensors)"
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
        cfg, vcfg = cfg or get_config(name), vcfg or get_video_config(name)
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
