"""Official checkpoints (Meta .pt, HF .safetensors) -> sam2edge weights, through one key map."""

from sam2edge.weights.load import (
    DEFAULT_CHECKPOINT,
    HUB_ID,
    OFFICIAL_SHA256,
    SYNTHETIC,
    WeightsError,
    load_weights,
    read_checkpoint,
    save_checkpoint,
    sha256_file,
    synthetic_state_dict,
    to_sam2edge,
)
from sam2edge.weights.sizes import SizeError, checkpoint_config, detect_config

__all__ = [
    "DEFAULT_CHECKPOINT",
    "HUB_ID",
    "OFFICIAL_SHA256",
    "SYNTHETIC",
    "SizeError",
    "WeightsError",
    "checkpoint_config",
    "detect_config",
    "load_weights",
    "read_checkpoint",
    "save_checkpoint",
    "sha256_file",
    "synthetic_state_dict",
    "to_sam2edge",
]
