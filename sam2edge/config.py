"""Model configuration: the SAM 2.1 Hiera-Tiny numbers, as a frozen dataclass.

The values of ``HIERA_TINY`` are those of upstream ``configs/sam2.1/sam2.1_hiera_t.yaml``.
``CONFIGS`` is the registry of named configs; ``test-small`` shrinks every width so that
CPU tests run in seconds while every code path (window padding, q-pooling, global blocks,
top-down FPN, high-res skip features) is still exercised.
"""

from __future__ import annotations

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
        """Channels per Hiera stage, stage 1 first."""
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


HIERA_TINY = Sam2Config()

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

CONFIGS: dict[str, Sam2Config] = {
    "sam2.1-hiera-tiny": HIERA_TINY,
    "test-small": TEST_SMALL,
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


VIDEO_TINY = Sam2VideoConfig()

# test-small's d_model is 32: a pointer splits into 2 tokens of mem_dim 16.
VIDEO_TEST_SMALL = Sam2VideoConfig(mem_dim=16, attn_layers=2, attn_mlp_dim=64)

VIDEO_CONFIGS: dict[str, Sam2VideoConfig] = {
    "sam2.1-hiera-tiny": VIDEO_TINY,
    "test-small": VIDEO_TEST_SMALL,
}


def get_video_config(name: str) -> Sam2VideoConfig:
    try:
        return VIDEO_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown config {name!r}; choose one of {sorted(VIDEO_CONFIGS)}") from None
