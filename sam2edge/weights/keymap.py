"""The one key map between sam2edge parameter names and the two official checkpoint formats.

* Meta ``sam2.1_hiera_tiny.pt`` (``{"model": state_dict}``): sam2edge uses upstream SAM2Base's
  names for the image path, so the map is the identity; the video-only parts are named in
  ``META_VIDEO_ONLY`` and skipped.
* EdgeTAM's ``edgetam.pt`` is the same layout with timm's RepViT names under ``image_encoder.trunk.body.`` and the
  perceiver (``spatial_perceiver.``) among the video-only parts; transformers' ``EdgeTamModel`` /
  ``EdgeTamVideoModel`` hold that trunk under ``vision_encoder.backbone.timm_model.``, the rest as ``Sam2Model``.
* Hugging Face ``model.safetensors`` (transformers ``Sam2Model`` / ``Sam2VideoModel`` names):
  ``HF_RULES`` rewrites a sam2edge name into the HF name, applied in order. Special cases:
  - ``sam_prompt_encoder.point_embeddings.{i}.weight`` (1, C) is row i of HF's
    ``prompt_encoder.point_embed.weight`` (4, C) (``HF_ROW_KEYS``);
  - the prompt/point positional Gaussian matrix is stored twice by HF (a tied buffer);
    the second copy (``HF_ALIASES``) must equal the first, bit for bit.
"""

from __future__ import annotations

import re

META_VIDEO_ONLY = (
    "memory_attention.",
    "memory_encoder.",
    "obj_ptr_proj.",
    "obj_ptr_tpos_proj.",
    "mask_downsample.",
    "maskmem_tpos_enc",
    "no_mem_pos_enc",
    "no_obj_ptr",
    "no_obj_embed_spatial",
    "spatial_perceiver.",  # EdgeTAM's memory compressor
)

HF_VIDEO_ONLY = (
    "memory_attention.",
    "memory_encoder.",
    "object_pointer_proj.",
    "temporal_positional_encoding_projection_layer.",
    "mask_downsample.",
    "memory_temporal_positional_encoding",
    "no_memory_positional_encoding",
    "no_object_pointer",
    "occlusion_spatial_embedding_parameter",
    "spatial_perceiver.",  # EdgeTamVideoModel's memory compressor
)

# (pattern, replacement) applied one after another with re.sub to a sam2edge name.
HF_RULES: tuple[tuple[str, str], ...] = (
    # top-level modules
    (r"^no_mem_embed$", "no_memory_embedding"),
    (r"^image_encoder\.trunk\.body\.", "vision_encoder.backbone.timm_model."),  # EdgeTAM's RepViT (timm names)
    (r"^image_encoder\.trunk\.", "vision_encoder.backbone."),
    (r"^image_encoder\.neck\.convs\.(\d+)\.conv\.", r"vision_encoder.neck.convs.\1."),
    (
        r"^sam_prompt_encoder\.pe_layer\.positional_encoding_gaussian_matrix$",
        "shared_image_embedding.positional_embedding",
    ),
    (r"^sam_prompt_encoder\.mask_downscaling\.0\.", "prompt_encoder.mask_embed.conv1."),
    (r"^sam_prompt_encoder\.mask_downscaling\.1\.", "prompt_encoder.mask_embed.layer_norm1."),
    (r"^sam_prompt_encoder\.mask_downscaling\.3\.", "prompt_encoder.mask_embed.conv2."),
    (r"^sam_prompt_encoder\.mask_downscaling\.4\.", "prompt_encoder.mask_embed.layer_norm2."),
    (r"^sam_prompt_encoder\.mask_downscaling\.6\.", "prompt_encoder.mask_embed.conv3."),
    (r"^sam_prompt_encoder\.", "prompt_encoder."),
    (r"^sam_mask_decoder\.output_upscaling\.0\.", "mask_decoder.upscale_conv1."),
    (r"^sam_mask_decoder\.output_upscaling\.1\.", "mask_decoder.upscale_layer_norm."),
    (r"^sam_mask_decoder\.output_upscaling\.3\.", "mask_decoder.upscale_conv2."),
    (r"^sam_mask_decoder\.", "mask_decoder."),
    # inside modules
    (r"\.patch_embed\.proj\.", ".patch_embed.projection."),
    (r"(backbone\.blocks\.\d+)\.norm([12])\.", r"\1.layer_norm\2."),
    (r"(transformer\.layers\.\d+)\.norm([1234])\.", r"\1.layer_norm\2."),
    (r"\.norm_final_attn\.", ".layer_norm_final_attn."),
    (r"\.out_proj\.", ".o_proj."),
    # 2-layer MLPs (Hiera blocks, two-way transformer): layers.0/1 -> proj_in/proj_out
    (r"\.mlp\.layers\.0\.", ".mlp.proj_in."),
    (r"\.mlp\.layers\.1\.", ".mlp.proj_out."),
    # 3-layer MLP heads: layers.0/1/2 -> proj_in/layers.0/proj_out
    (r"(head|mlps\.\d+)\.layers\.0\.", r"\1.proj_in."),
    (r"(head|mlps\.\d+)\.layers\.1\.", r"\1.layers.0."),
    (r"(head|mlps\.\d+)\.layers\.2\.", r"\1.proj_out."),
)

HF_ROW_KEYS = re.compile(r"^sam_prompt_encoder\.point_embeddings\.(\d)\.weight$")
HF_POINT_EMBED = "prompt_encoder.point_embed.weight"
HF_ALIASES = {"prompt_encoder.shared_embedding.positional_embedding": "shared_image_embedding.positional_embedding"}


def hf_name(name: str) -> tuple[str, int | None]:
    """sam2edge name -> (HF name, row index or None when the whole tensor maps)."""
    m = HF_ROW_KEYS.match(name)
    if m:
        return HF_POINT_EMBED, int(m.group(1))
    for pattern, repl in HF_RULES:
        name = re.sub(pattern, repl, name)
    return name, None


def is_video_only(name: str, fmt: str) -> bool:
    prefixes = META_VIDEO_ONLY if fmt == "meta" else HF_VIDEO_ONLY
    return name.startswith(prefixes)
