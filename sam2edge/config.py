"""Model configuration: the SAM 2.1 Hiera family (tiny, small, base-plus, large) and EdgeTAM (a RepViT-M1 trunk,
``trunk="repvit"``), as frozen dataclasses.

Every number of ``HIERA_TINY`` / ``HIERA_SMALL`` / ``HIERA_BASE_PLUS`` / ``HIERA_LARGE`` is that of
upstream ``configs/sam2.1/sam2.1_hiera_{t,s,b+,l}.yaml`` (``trunk`` and ``neck``; a field the yaml
leaves out takes upstream ``Hiera.__init__``'s default, as base-plus does for stages, global blocks,
window specs and the pos-embed background). The FPN's ``backbone_channel_list`` is
``reversed(stage_dims)`` for every size (e.g. base-plus [896, 448, 224, 112]). The prompt encoder and
mask decoder are the same in every size.

``CONFIGS`` is the registry of named configs. ``test-small`` shrinks every width of Hiera-Tiny so
that CPU tests run in seconds while every code path (window padding, q-pooling, global blocks,
top-down FPN, high-res skip features) is still exercised; ``test-small-s`` / ``-b+`` / ``-l`` do the
same for the other sizes, each keeping what tells its size apart (``SIZES`` pairs them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sam2Config:
    image_size: int = 1024  # side of the square model input, pixels
    # --- Hiera trunk ---
    embed_dim: int = 96  # channels of stage 1 (doubles each stage)
    num_heads: int = 1  # attention heads of stage 1 (doubles each stage)
    stages: tuple[int, ...] = (1, 2, 7, 2)  # blocks per stage
    global_att_blocks: tuple[int, ...] = (5, 7, 9)  # block indices with global attention
    window_spec: tuple[int, ...] = (8, 4, 14, 7)  # window side per stage
    window_pos_embed_bkg: tuple[int, int] = (7, 7)  # background pos-embed grid, interpolated
    q_pool: int = 3  # number of stage transitions that pool queries
    q_stride: int = 2  # spatial stride at each pooled transition
    mlp_ratio: float = 4.0  # Hiera MLP hidden = dim * mlp_ratio
    patch_kernel: int = 7  # patch-embed conv kernel (stride 4, padding 3)
    # --- trunk choice (EdgeTAM: "repvit"; the Hiera fields above are then unused) ---
    trunk: str = "hiera"  # image trunk: "hiera" (SAM 2.1) or "repvit" (EdgeTAM's RepViT-M1, fields repvit_*)
    repvit_dims: tuple[int, ...] = (48, 96, 192, 384)  # RepViT channels per stage (timm repvit_m1 embed_dim)
    repvit_depths: tuple[int, ...] = (2, 2, 14, 2)  # RepViT blocks per stage after its downsample (timm depth)
    repvit_mlp_ratio: int = 2  # RepViT channel mixer hidden = dim * ratio
    repvit_kernel: int = 3  # RepViT depthwise kernel (token mixer, spatial downsample)
    # --- FPN neck ---
    d_model: int = 256  # FPN width = prompt/decoder width
    fpn_top_down_levels: tuple[int, ...] = (2, 3)  # levels that receive top-down features
    scalp: int = 1  # lowest-resolution FPN levels dropped
    # --- prompt encoder ---
    mask_in_chans: int = 16  # hidden channels of the mask-input downscaler
    # --- mask decoder ---
    decoder_depth: int = 2  # two-way transformer blocks
    decoder_heads: int = 8  # heads in every decoder attention
    decoder_mlp_dim: int = 2048  # two-way transformer MLP hidden size
    attention_downsample_rate: int = 2  # cross-attention internal dim = d_model / rate
    num_multimask_outputs: int = 3  # candidate masks (plus one single-mask token)
    iou_head_depth: int = 3  # layers of the IoU / object-score MLPs
    iou_head_hidden_dim: int = 256  # hidden size of the IoU MLP
    stability_delta: float = 0.05  # dynamic multimask: logit band for stability
    stability_thresh: float = 0.98  # dynamic multimask: stable if score >= this

    @property
    def stage_dims(self) -> tuple[int, ...]:
        """Channels per trunk stage, stage 1 first (the FPN's backbone_channel_list reversed)."""
        if self.trunk == "repvit":
            return tuple(self.repvit_dims)
        return tuple(self.embed_dim * 2**i for i in range(len(self.stages)))

    @property
    def image_embedding_size(self) -> int:
        """Side of the lowest-resolution decoder feature (image_size / 16)."""
        return self.image_size // 16

    @property
    def num_mask_tokens(self) -> int:
        return self.num_multimask_outputs + 1

    def at_resolution(self, image_size: int) -> Sam2Config:
        """Same weights, another input side (must be a multiple of 32)."""
        if image_size % 32:
            raise ValueError(f"resolution {image_size} is not a multiple of 32; use e.g. 512 or 1024")
        return replace(self, image_size=image_size)


HIERA_TINY = Sam2Config()  # sam2.1_hiera_t.yaml: embed 96, heads 1, stages [1, 2, 7, 2], global [5, 7, 9]

HIERA_SMALL = Sam2Config(  # sam2.1_hiera_s.yaml; every other number as Hiera-Tiny
    embed_dim=96,  # trunk.embed_dim; FPN backbone_channel_list [768, 384, 192, 96]
    num_heads=1,  # trunk.num_heads (1, 2, 4, 8 per stage)
    stages=(1, 2, 11, 2),  # trunk.stages: 16 blocks
    global_att_blocks=(7, 10, 13),  # trunk.global_att_blocks: every 3rd block of stage 3, its last one included
    window_spec=(8, 4, 14, 7),  # Hiera default (not in the yaml)
    window_pos_embed_bkg=(7, 7),  # trunk.window_pos_embed_bkg_spatial_size
)

HIERA_BASE_PLUS = Sam2Config(  # sam2.1_hiera_b+.yaml sets only embed_dim and num_heads; the rest are Hiera defaults
    embed_dim=112,  # trunk.embed_dim; FPN backbone_channel_list [896, 448, 224, 112]
    num_heads=2,  # trunk.num_heads (2, 4, 8, 16 per stage): 56 channels per head throughout
    stages=(2, 3, 16, 3),  # Hiera default stages: 24 blocks
    global_att_blocks=(12, 16, 20),  # Hiera default global blocks: every 4th block of stage 3, its last one included
    window_spec=(8, 4, 14, 7),  # Hiera default
    window_pos_embed_bkg=(14, 14),  # Hiera default background size (tiny, small and large use 7x7)
)

HIERA_LARGE = Sam2Config(  # sam2.1_hiera_l.yaml
    embed_dim=144,  # trunk.embed_dim; FPN backbone_channel_list [1152, 576, 288, 144]
    num_heads=2,  # trunk.num_heads (2, 4, 8, 16 per stage): 72 channels per head throughout
    stages=(2, 6, 36, 4),  # trunk.stages: 48 blocks
    global_att_blocks=(23, 33, 43),  # trunk.global_att_blocks: every 10th block of stage 3, its last one included
    window_spec=(8, 4, 16, 8),  # trunk.window_spec: stages 3 and 4 tile their 64 / 32 grids without padding
    window_pos_embed_bkg=(7, 7),  # trunk.window_pos_embed_bkg_spatial_size
)

# Every width shrunk; same topology as Hiera-Tiny (4 stages, 3 q-pool transitions, window
# padding at stages 3/4, global blocks, two-way decoder with 3 multimask outputs).
TEST_SMALL = Sam2Config(
    image_size=256,
    embed_dim=16,
    num_heads=1,
    stages=(1, 1, 3, 1),
    global_att_blocks=(3,),
    d_model=32,
    mask_in_chans=8,
    decoder_heads=4,
    decoder_mlp_dim=64,
    iou_head_hidden_dim=32,
)

# Reduced-depth stand-ins of the other sizes: test-small's widths (stage-1 channels per head kept at
# the size's ratio), a short stage 3 that still has windowed blocks between its global ones and ends
# on a global block, the size's stage-1 depth, heads, window specs and pos-embed background.
TEST_SMALL_S = replace(
    TEST_SMALL,
    stages=(1, 2, 5, 2),  # stage 4 has a plain windowed block (7-window over an 8x8 grid: padding)
    global_att_blocks=(4, 7),  # every 3rd block of stage 3 (small: 7, 10, 13)
)
TEST_SMALL_B_PLUS = replace(
    TEST_SMALL,
    embed_dim=16,  # 2 heads of 8 channels in stage 1 (base-plus: 2 heads of 56)
    num_heads=2,
    stages=(2, 3, 5, 3),  # two blocks in stage 1 (a stage-1 block without a shortcut projection)
    global_att_blocks=(7, 9),  # every 2nd block of stage 3, its last one included (base-plus: 12, 16, 20 of 5..20)
    window_pos_embed_bkg=(14, 14),
)
TEST_SMALL_L = replace(
    TEST_SMALL,
    image_size=384,  # 24x24 stage-3 and 12x12 stage-4 grids: the 16 and 8 windows pad, as no other config does
    embed_dim=24,  # 2 heads of 12 channels in stage 1 (large: 2 heads of 72)
    num_heads=2,
    stages=(2, 3, 5, 2),
    global_att_blocks=(7, 9),  # every 2nd block of stage 3, its last one included (large: 23, 33, 43)
    window_spec=(8, 4, 16, 8),
)

# EdgeTAM (configs/edgetam.yaml of the original code): timm repvit_m1 trunk (features of 48/96/192/384 channels at
# strides 4/8/16/32), the FPN neck with backbone_channel_list [384, 192, 96, 48], top-down levels [2, 3], nearest,
# scalp 1; prompt encoder and mask decoder as SAM 2.1's. Its memory path is VIDEO_EDGETAM below.
EDGETAM = Sam2Config(trunk="repvit")

# EdgeTAM at test-small's widths and 256 px: a narrow RepViT (16/32/64/128 channels; stage 1 holds an SE block and
# a plain one, every later stage a downsample and one or two blocks), FPN width 32, test-small's decoder.
TEST_SMALL_EDGETAM = replace(TEST_SMALL, trunk="repvit", repvit_dims=(16, 32, 64, 128), repvit_depths=(2, 1, 2, 1))

CONFIGS: dict[str, Sam2Config] = {
    "sam2.1-hiera-tiny": HIERA_TINY,
    "sam2.1-hiera-small": HIERA_SMALL,
    "sam2.1-hiera-base-plus": HIERA_BASE_PLUS,
    "sam2.1-hiera-large": HIERA_LARGE,
    "test-small": TEST_SMALL,
    "test-small-s": TEST_SMALL_S,
    "test-small-b+": TEST_SMALL_B_PLUS,
    "test-small-l": TEST_SMALL_L,
    "edgetam": EDGETAM,
    "test-small-edgetam": TEST_SMALL_EDGETAM,
}

# model family -> (full-size config, its reduced CI stand-in), beside the SAM 2.1 SIZES
FAMILIES: dict[str, tuple[str, str]] = {"edgetam": ("edgetam", "test-small-edgetam")}

# size -> (full-size config, its reduced-depth CI stand-in, upstream yaml under sam2/configs/sam2.1/)
SIZES: dict[str, tuple[str, str, str]] = {
    "tiny": ("sam2.1-hiera-tiny", "test-small", "sam2.1_hiera_t.yaml"),
    "small": ("sam2.1-hiera-small", "test-small-s", "sam2.1_hiera_s.yaml"),
    "base-plus": ("sam2.1-hiera-base-plus", "test-small-b+", "sam2.1_hiera_b+.yaml"),
    "large": ("sam2.1-hiera-large", "test-small-l", "sam2.1_hiera_l.yaml"),
}


def get_config(name: str) -> Sam2Config:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown config {name!r}; choose one of {sorted(CONFIGS)}") from None


@dataclass(frozen=True)
class Sam2VideoConfig:
    """The memory path of SAM 2.1 (upstream ``sam2.1_hiera_t.yaml`` + the video predictor's overrides).

    Widths not listed here come from the image ``Sam2Config`` (d_model = memory-attention width).
    """

    mem_dim: int = 64  # channels of a spatial memory and of an object-pointer token (d_model / mem_dim tokens each)
    attn_layers: int = 4  # memory-attention layers (self RoPE attention + cross RoPE attention + MLP)
    attn_heads: int = 1  # heads of both RoPE attentions
    attn_mlp_dim: int = 2048  # memory-attention MLP hidden size
    rope_theta: float = 10000.0  # RoPE base frequency
    fuser_layers: int = 2  # ConvNeXt blocks fusing image features and the downsampled mask
    fuser_kernel: int = 7  # depthwise kernel of the fuser blocks
    mask_stride: int = 16  # total stride of the mask downsampler (4 convs of stride 2)
    num_maskmem: int = 7  # temporal memory encodings (1 conditioning + 6 previous-frame positions)
    memory_slots: int = 7  # spatial memory slots in the per-frame graph (conditioning + recent frames)
    max_obj_ptrs: int = 16  # object-pointer slots (upstream max_obj_ptrs_in_encoder)
    sigmoid_scale: float = 20.0  # memory-encoder mask: sigmoid(logits) * scale + bias
    sigmoid_bias: float = -10.0
    no_obj_score: float = -1024.0  # mask logits written where the object is judged absent
    ptr_tpos_enc: bool = True  # pointers get a projected temporal sine encoding (add/proj_tpos_enc_in_obj_ptrs)
    no_obj_embed_spatial: bool = True  # a learned embedding is added to the memory of a frame judged "no object"
    # --- EdgeTAM's spatial perceiver (perceiver_layers 0: none, a memory frame is e*e tokens) ---
    perceiver_layers: int = 0  # PerceiverEncoderLayers (cross-attention, FF, self-attention, FF)
    perceiver_latents: int = 0  # global latents (read the whole memory; no RoPE in the memory attention)
    perceiver_latents_2d: int = 0  # 2-D latents on a square grid, each reading its own window of the memory
    perceiver_dim_head: int = 64  # channels per perceiver head (heads x dim_head = mem_dim)
    perceiver_heads: int = 1  # perceiver attention heads
    perceiver_ff_mult: int = 4  # perceiver FF hidden = mem_dim * ff_mult
    perceiver_self_attn: bool = True  # self-attention + FF among the latents in every layer
    # cross-attention RoPE grids (upstream RoPEAttentionv2 q_sizes / k_sizes); 0: the frame's grid for both (SAM
    # 2.1's RoPEAttention with rope_k_repeat); the query grid is the frame's e x e grid (``at_resolution``)
    cross_rope_q_grid: int = 0
    cross_rope_k_grid: int = 0  # side of the 2-D latents' grid; the global latents of a frame get no RoPE

    def at_resolution(self, image_size: int) -> Sam2VideoConfig:
        """The same memory path for frames of ``image_size`` px (an e x e grid, e = image_size / 16): the
        cross-attention's query RoPE grid follows the frame (the original built with ``image_size`` and
        ``q_sizes`` [e, e]); the 2-D latents keep their G x G grid and read e/G x e/G windows (the original's
        ``window_size = H // num_window``). ValueError when G does not divide e."""
        e = image_size // 16
        g = math.isqrt(self.perceiver_latents_2d)
        if self.perceiver_layers and e % g:
            sides = ", ".join(str(16 * g * k) for k in (2, 3, 4))
            raise ValueError(f"resolution {image_size}: the {g}x{g} memory latents need a side of 16*{g}*k ({sides})")
        return replace(self, cross_rope_q_grid=e if self.cross_rope_q_grid else 0)

    @property
    def memory_tokens(self) -> int | None:
        """Tokens of one memory frame after the perceiver (L + G*G); None without a perceiver (e*e)."""
        return self.perceiver_latents + self.perceiver_latents_2d if self.perceiver_layers else None

    def memory_frame_shape(self, e: int) -> tuple[int, ...]:
        """Shape of one object's memory frame: (M, e, e) spatial, or (L + G*G, M) perceiver tokens."""
        n = self.memory_tokens
        return (self.mem_dim, e, e) if n is None else (n, self.mem_dim)


VIDEO_TINY = Sam2VideoConfig()

# test-small's d_model is 32: a pointer splits into 2 tokens of mem_dim 16.
VIDEO_TEST_SMALL = Sam2VideoConfig(mem_dim=16, attn_layers=2, attn_mlp_dim=64)

# configs/edgetam.yaml: memory attention of 2 layers (self RoPEAttention over the 64x64 frame grid, cross
# RoPEAttentionv2 with q_sizes [64, 64], k_sizes [16, 16], kv_in_dim 64), spatial_perceiver (depth 2, dim 64,
# dim_head 64, heads 1, ff_mult 4, 256 + 256 latents, use_self_attn, pos_enc_at_key_value, no concat_kv_latents),
# add_tpos_enc_to_obj_ptrs false, no no_obj_embed_spatial; num_maskmem 7, memory encoder as SAM 2.1's.
VIDEO_EDGETAM = Sam2VideoConfig(
    attn_layers=2,
    ptr_tpos_enc=False,
    no_obj_embed_spatial=False,
    perceiver_layers=2,
    perceiver_latents=256,
    perceiver_latents_2d=256,
    cross_rope_q_grid=64,
    cross_rope_k_grid=16,
)

# EdgeTAM's memory path at test-small widths (d_model 32, mem_dim 16) and 256 px (a 16x16 frame grid): 16 global
# + 16 2-D latents on a 4x4 grid (4x4 windows), one perceiver head of 16 channels.
VIDEO_EDGETAM_TEST = replace(
    VIDEO_EDGETAM,
    mem_dim=16,
    attn_mlp_dim=64,
    perceiver_latents=16,
    perceiver_latents_2d=16,
    perceiver_dim_head=16,
    cross_rope_q_grid=16,
    cross_rope_k_grid=4,
)

# sam2.1_hiera_{s,b+,l}.yaml hold the same memory path as sam2.1_hiera_t.yaml, field for field (diff of the
# model.memory_attention / memory_encoder blocks, num_maskmem 7, the sigmoid scale / bias and every SAM2Base flag:
# only comments differ; max_obj_ptrs_in_encoder is SAM2Base's default 16 in all four, and build_sam2_video_predictor
# adds the same overrides to each). Only the image trunk tells the sizes apart.
VIDEO_SMALL = VIDEO_BASE_PLUS = VIDEO_LARGE = VIDEO_TINY

VIDEO_CONFIGS: dict[str, Sam2VideoConfig] = {
    "sam2.1-hiera-tiny": VIDEO_TINY,
    "sam2.1-hiera-small": VIDEO_SMALL,
    "sam2.1-hiera-base-plus": VIDEO_BASE_PLUS,
    "sam2.1-hiera-large": VIDEO_LARGE,
    "test-small": VIDEO_TEST_SMALL,
    "test-small-s": VIDEO_TEST_SMALL,  # the reduced sizes share test-small's widths (d_model 32)
    "test-small-b+": VIDEO_TEST_SMALL,
    "test-small-l": VIDEO_TEST_SMALL,
    "edgetam": VIDEO_EDGETAM,
    "test-small-edgetam": VIDEO_EDGETAM_TEST,
}


def get_video_config(name: str, image_size: int | None = None) -> Sam2VideoConfig:
    """The memory path of config ``name``, at ``image_size`` px (``Sam2VideoConfig.at_resolution``; None: the
    config's own resolution)."""
    try:
        vcfg = VIDEO_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown config {name!r}; choose one of {sorted(VIDEO_CONFIGS)}") from None
    return vcfg if image_size is None else vcfg.at_resolution(image_size)


def config_name(cfg: Sam2Config) -> str:
    """Registered name of ``cfg`` at any resolution, e.g. 'sam2.1-hiera-large'; ValueError if unregistered."""
    for name, c in CONFIGS.items():
        if replace(c, image_size=cfg.image_size) == cfg:
            return name
    raise ValueError("config is not registered in sam2edge.config.CONFIGS")


def model_id(name: str) -> str:
    """The model a config name stands for ('test-small-l' -> 'sam2.1-hiera-large'); cards' model_id."""
    for full, reduced, *_ in (*SIZES.values(), *FAMILIES.values()):
        if name in (full, reduced):
            return full
    return name
