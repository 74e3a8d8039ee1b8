"""Multi-head attention as ONE onnxruntime operator (``Rewrites.attention_impl="ort_mha"``).

onnxruntime's ``com.microsoft.MultiHeadAttention`` takes q (B, Nq, C), k (B, Nk, C), v (B, Nk, Cv) with the heads
packed head-major in the channels, exactly the layout our projections produce, and computes
softmax(q_h k_h^T / sqrt(C / heads)) v_h per head in one kernel: no head transposes, no score tensor written out
between three operators. In PyTorch it computes the same function with ``F.scaled_dot_product_attention``;
``torch.onnx.export`` (TorchScript exporter, ``custom_opsets={"com.microsoft": 1}``) writes the one node.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sam2edge.model.layers import _heads

DOMAIN = "com.microsoft"  # the contrib-op domain onnxruntime registers MultiHeadAttention in


class OrtMultiHeadAttention(torch.autograd.Function):
    """(B, Nq, C), (B, Nk, C), (B, Nk, Cv), heads -> (B, Nq, Cv); inference only."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
        B, Nq, _ = q.shape
        out = F.scaled_dot_product_attention(*(_heads(t, num_heads) for t in (q, k, v)))  # (B, nh, Nq, dv)
        return out.transpose(1, 2).reshape(B, Nq, v.shape[2])  # (B, Nq, Cv)

    @staticmethod
    def symbolic(g, q, k, v, num_heads: int):
        out = g.op(f"{DOMAIN}::MultiHeadAttention", q, k, v, num_heads_i=num_heads)
        qs, vs = q.type().sizes(), v.type().sizes()
        if qs is not None and vs is not None:  # (B, Nq, Cv): the exporter cannot infer a contrib op's shape
            out.setType(q.type().with_sizes([qs[0], qs[1], vs[2]]))
        return out


def ort_multi_head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``OrtMultiHeadAttention`` applied: q (B, Nq, C), k (B, Nk, C), v (B, Nk, Cv) -> (B, Nq, Cv)."""
    return OrtMultiHeadAttention.apply(q, k, v, num_heads)
