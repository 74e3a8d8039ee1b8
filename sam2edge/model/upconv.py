"""The mask decoder's 2x upsampling (ConvTranspose2d, kernel 2, stride 2) in the forms export targets accept."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sam2edge.model.layers import Rewrites


def zero_stuff_2x(x: torch.Tensor) -> torch.Tensor:
    """Insert a zero after every row and column: (B, C, H, W) -> (B, C, 2H, 2W).

    Output[2i, 2j] = x[i, j], everything else 0. Rank <= 4 throughout. The zeros come from
    zero-padding (PAD), not from concatenating ``zeros_like`` tensors, which converters fold into
    large all-zero constants stored in the model file. No axis grows beyond max(B*C, 2W): GPU
    delegates map tensors to textures, and WebGPU's default texture side limit is 8192 (a C*H axis
    reached 16384 at 1024 px).
    """
    B, C, H, W = x.shape
    x = F.pad(x.reshape(B * C, H, W, 1), (0, 1))  # (B*C, H, W, 2)
    x = F.pad(x.reshape(B * C, H, 1, 2 * W), (0, 0, 0, 1))  # (B*C, H, 2, 2W)
    return x.reshape(B, C, 2 * H, 2 * W)  # (B, C, 2H, 2W)


class UpConv2x2(nn.Module):
    """ConvTranspose2d(kernel 2, stride 2), optionally as an exact identity (``Rewrites.transposed_conv``).

    Holds the upstream ConvTranspose2d parameters ``weight`` (Cin, Cout, 2, 2) and ``bias``; every form
    computes out[2i+a, 2j+b] = sum_c x[c, i, j] * weight[c, :, a, b] + bias.
    The zero-stuff form convolves the zero-inserted input, padded by one row/column at the
    top/left, with the spatially flipped, in/out-swapped kernel (every other product an exact zero).
    The matmul form is one product per pixel with the kernel as a (Cin, 4 Cout) matrix (a CPU's
    GEMM, where TRANSPOSE_CONV runs at half its rate), then rank-4 reshapes place the 2x2 blocks.
    The flipped kernel and the matrix are buffers baked from ``weight`` whenever weights are loaded.
    """

    def __init__(self, cin: int, cout: int, rw: Rewrites) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cin, cout, 2, 2))
        self.bias = nn.Parameter(torch.zeros(cout))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.form = rw.transposed_conv
        self.register_buffer("conv_weight", torch.empty(cout, cin, 2, 2), persistent=False)
        self.register_buffer("mm_weight", torch.empty(4 * cout, cin), persistent=False)  # Linear layout
        self.register_buffer("mm_bias", torch.empty(4 * cout), persistent=False)
        self.refresh_constants()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_constants())

    @torch.no_grad()
    def refresh_constants(self) -> None:
        w = self.weight.detach()
        self.conv_weight = w.transpose(0, 1).flip(2, 3).contiguous()
        self.mm_weight = w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]).contiguous()  # (4 Cout (a, b, o), Cin)
        self.mm_bias = self.bias.detach().repeat(4)  # (4 Cout): bias[o] at (a, b, o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "native":
            return F.conv_transpose2d(x, self.weight, self.bias, stride=2)
        if self.form == "matmul":
            return self._matmul(x)
        z = F.pad(zero_stuff_2x(x), (1, 0, 1, 0))  # (B, Cin, 2H+1, 2W+1)
        return F.conv2d(z, self.conv_weight, self.bias)  # (B, Cout, 2H, 2W)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        return self._matmul_nhwc(x.reshape(B, C, H * W).transpose(1, 2), H).permute(0, 3, 1, 2)  # (B, O, 2H, 2W)

    def channels_last(self, x: torch.Tensor) -> torch.Tensor:
        """The same map on (B, H, W, Cin) -> (B, 2H, 2W, Cout)."""
        B, H, W, C = x.shape
        if self.form == "matmul":
            return self._matmul_nhwc(x.reshape(B, H * W, C), H)
        return self.forward(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)

    def _matmul_nhwc(self, x: torch.Tensor, H: int) -> torch.Tensor:
        """x (B, HW, Cin), rows in raster order of H rows -> (B, 2H, 2W, Cout)."""
        B, HW, _ = x.shape
        W, O = HW // H, self.bias.shape[0]
        y = F.linear(x, self.mm_weight, self.mm_bias)  # (B, HW, 4O): (a, b, o)
        y = y.reshape(B * H, W, 2, 2 * O).transpose(1, 2)  # (B*H, 2 (a), W, 2O (b, o))
        return y.reshape(B, 2 * H, 2 * W, O)  # (B, 2H, 2W, O): row 2i+a, column 2j+b
