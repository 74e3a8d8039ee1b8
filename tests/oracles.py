"""Upstream oracles for parity tests: Meta's ``sam2`` modules and transformers' ``Sam2Model``.

Both are built from a ``Sam2Config`` so that the small test config and Hiera-Tiny use the
same code. Random weights: upstream init, then every floating tensor perturbed by
0.02 * randn so that no branch is trivially zero (NOTES).
"""

from __future__ import annotations

import torch
from torch import nn

from sam2edge.checks.fidelity.upstream import UpstreamImagePath
from sam2edge.config import Sam2Config


def perturb_(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.add_(0.02 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return module


def meta_image_path(cfg: Sam2Config, seed: int = 0) -> UpstreamImagePath:
    """Upstream's image-path modules built from ``cfg`` (sam2edge.checks.fidelity.upstream), perturbed."""
    torch.manual_seed(seed)
    return perturb_(UpstreamImagePath(cfg), seed + 1000)


def hf_sam2_model(seed: int = 0):
    """transformers ``Sam2Model`` (Hiera-Tiny defaults) with perturbed random weights, eval mode."""
    from transformers import Sam2Config as HFConfig
    from transformers import Sam2Model

    torch.manual_seed(seed)
    model = Sam2Model(HFConfig()).eval()
    perturb_(model, seed + 2000)
    # the prompt encoder's Gaussian matrix is a buffer tied to shared_image_embedding's; keep the tie
    model.prompt_encoder.shared_embedding.positional_embedding.copy_(model.shared_image_embedding.positional_embedding)
    return model


class TorchvisionStandIn:
    """Registers a minimal ``torchvision.transforms`` (ToTensor, Resize, Normalize) in sys.modules.

    Upstream's SAM2ImagePredictor imports only these three; torchvision itself cannot be installed
    beside the CPU torch (NOTES). Resize is exact only when the image is already at the target size,
    so predictor parity tests use 1024x1024 crops.
    """

    @staticmethod
    def install() -> None:
        import sys
        import types

        import numpy as np
        import torch.nn.functional as F

        class ToTensor:
            def __call__(self, pic):
                return torch.from_numpy(np.array(pic, dtype=np.uint8)).permute(2, 0, 1).float().div(255.0)

        class Resize(nn.Module):
            def __init__(self, size: tuple[int, int]) -> None:
                super().__init__()
                self.size = (int(size[0]), int(size[1]))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if x.shape[-2] == self.size[0] and x.shape[-1] == self.size[1]:
                    return x
                y = F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", align_corners=False, antialias=True)
                return y.squeeze(0)

        class Normalize(nn.Module):
            def __init__(self, mean: list[float], std: list[float]) -> None:
                super().__init__()
                self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
                self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return (x - self.mean) / self.std

        tv = types.ModuleType("torchvision")
        tr = types.ModuleType("torchvision.transforms")
        tr.ToTensor, tr.Resize, tr.Normalize = ToTensor, Resize, Normalize
        tv.transforms = tr
        sys.modules.setdefault("torchvision", tv)
        sys.modules.setdefault("torchvision.transforms", tr)


def meta_sam2base(seed: int = 0):
    """Upstream's full SAM2Base (video parts included) from the official Hiera-Tiny config, perturbed."""
    from sam2.build_sam import build_sam2 as upstream_build

    torch.manual_seed(seed)
    model = upstream_build("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu", mode="eval")
    return perturb_(model, seed + 3000)
