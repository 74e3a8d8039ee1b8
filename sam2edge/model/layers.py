"""Building blocks shared by every model stage, each with an export switch.

``Rewrites`` selects, per model build, how the few export-sensitive operations are
expressed. Every setting computes the same function (fp32 agreement to ~1e-6 relative);
the defaults are the forms that mobile GPU delegates and XNNPACK accept whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Rewrites:
    attention_rank: int = 4  # 4: q/k/v as [B, heads, N, d]; 3: [B*heads, N, d]
    # "math": softmax(q k^T / sqrt(d)) v; "sdpa": F.scaled_dot_product_attention; "ort_mha": onnxruntime's fused
    # MultiHeadAttention node where no key bias or transposed keys are involved (``model.fused_attention``)
    attention_impl: str = "math"
    # the attention's softmax over keys: "native" torch.softmax; "shifted" exp(s - max + SOFTMAX_SHIFT) divided by its
    # mean and by the key count (the same function). XNNPACK's fp16 kernels flush subnormals, so exp(s - max) loses
    # every term below e^-9.7 of the largest: a softmax over 4096 random scores is 4.3x further from fp32 than eager
    # fp16, shifted as exact as eager (``benchmarks/executorch_fp16_ops.py``). A measured option: the full-size fp16
    # encoder's error did not change with it (docs/design/precision.md), so no export uses it
    softmax: str = "native"
    # "zero_stuff": zero-insert + Conv2d; "native": ConvTranspose2d; "matmul": one (HW, Cin) x (Cin, 4 Cout) product
    # (kernel 2, stride 2: the 2x2 output blocks do not overlap), the blocks put in place by rank-4 reshapes
    transposed_conv: str = "zero_stuff"
    # "scaled": statistics of x / mean|x - mean| (every intermediate in [0, C] whatever the scale of x: fp16-stable);
    # "safe": scale by 1/sqrt(C) before squaring; "native": F.layer_norm / upstream LayerNorm2d
    layer_norm: str = "scaled"
    mask_head: str = "channel_sum"  # "channel_sum": per-token weighted channel sums; "matmul": hyper_in @ features
    texture_limit: int = 8192  # slice attention (batch, then heads) so matmul operands fit a texture; 0: off
    # memory attention: "folded" attends over the raw mem_dim-channel memory and applies v_proj after (softmax rows
    # sum to 1: the same function, 4x fewer multiply-adds in attn @ v); "projected": v_proj on every key (upstream)
    memory_values: str = "folded"
    # two-way transformer cross-attention: "folded" moves the image side's projections onto the few tokens by
    # associativity (q W_k k^T, P (v W_v^T), ...; a key bias is constant along a softmax row), so no 4096 x C
    # image tensor is projected; "projected": upstream's order. Fewer multiply-adds while heads x tokens < inner
    # width (every SAM 2.1 size: 8 heads, inner 128): a click (8 tokens) 3.56 -> 2.22 GFLOP, 14 tokens -9 %
    token_fold: str = "projected"
    # memory attention keys: "transposed" rotates and attends them as (C, Nk), so a real TRANSPOSE feeds the
    # score matmul (LiteRT lowers q @ k^T as a FULLY_CONNECTED with k as dynamic weights, which XNNPACK does not
    # take: 1.5 s against 0.18 s for 4096 queries x 28736 keys); "rows": upstream's (Nk, C)
    rope_keys: str = "transposed"
    # additive key bias (empty memory slots) with transposed keys: "folded" appends a ones column to the scaled
    # queries and the bias row to k^T, so the score product adds it (K = d + 1; no separate ADD over the
    # Nq x Nk scores); "added": scores + bias. Kept keys add an exact 0 either way
    key_bias: str = "folded"
    # the mask decoder's output upscaling, its LayerNorm2d and mask head: "nchw" as upstream; "nhwc" channels-last
    # from the transformer's (B, HW, C) image to the (B, 4e, 4e, C/8) features, so each 2x2 transposed conv
    # (``transposed_conv="matmul"``) is one GEMM on the last dim and the channel norm reduces the last dim, with
    # no layout transposes between them (exact: the same sums; only feat_s0 / feat_s1 are permuted, once)
    upscale_layout: str = "nchw"
    # Hiera's query / shortcut pooling on (B, H, W, C): "max_pool" permutes to NCHW for max_pool2d and back;
    # "maxima" takes elementwise maxima of the window's row and column slices in place (exact; an ExecuTorch
    # encoder spends 212 -> 119 ms in layout transposes at 1024 px, docs/design/encoder.md)
    q_pool: str = "max_pool"
    # Hiera's q/k/v projection: "fused" is one (C_in -> 3C) Linear whose output is sliced into q, k and v;
    # "split" multiplies by the three row blocks of the same weight, cut once at load (exact: the same dot
    # products, no slice copies; an ExecuTorch encoder 1828 -> 1737 ms at 1024 px, docs/design/encoder.md)
    qkv: str = "fused"
    # memory attention's cross-attention: queries per slice of the score matrix (0: all at once), and objects one at
    # a time. Each query row's softmax is its own: exact. 4096 queries x 28736 keys is 470 MB of fp32 scores per
    # object; whole, 4 objects cost 10.9 s each, in 1024-query slices 4.0 s (3.6 s alone; math attention, 1024 px,
    # 2 threads, benchmarks/bench_memory_attention.py). sdpa (UPSTREAM) stays linear without it
    query_chunk: int = 1024
    # Hiera's global attention (one image, N queries x N keys): queries per slice of the score matrix (0: whole).
    # Exact (each query row's softmax is its own); slices keep the scores in the CPU's cache: 4096 queries x 4096
    # keys x 4 heads, onnxruntime at 2 threads, 89 -> 68 ms per block in 512-query slices (``export.onnx``)
    image_query_chunk: int = 0
    # the score product's keys (B, Nk, C): "permuted" once to (B, nh, d, Nk), a real transpose of d, the contiguous
    # dim; "rows" split into heads (B, nh, Nk, d) and multiplied as q @ k^T, a transpose onnxruntime fuses into a
    # one-head product (FusedMatMul transB: no copy); with more heads its optimiser merges both into one permutation
    score_keys: str = "permuted"

    def __post_init__(self) -> None:
        checks = {
            "attention_rank": (self.attention_rank, (3, 4)),
            "attention_impl": (self.attention_impl, ("math", "sdpa", "ort_mha")),
            "transposed_conv": (self.transposed_conv, ("zero_stuff", "native", "matmul")),
            "layer_norm": (self.layer_norm, ("scaled", "safe", "native")),
            "softmax": (self.softmax, ("native", "shifted")),
            "mask_head": (self.mask_head, ("channel_sum", "matmul")),
            "memory_values": (self.memory_values, ("folded", "projected")),
            "token_fold": (self.token_fold, ("folded", "projected")),
            "rope_keys": (self.rope_keys, ("transposed", "rows")),
            "key_bias": (self.key_bias, ("folded", "added")),
            "upscale_layout": (self.upscale_layout, ("nchw", "nhwc")),
            "q_pool": (self.q_pool, ("max_pool", "maxima")),
            "qkv": (self.qkv, ("fused", "split")),
            "score_keys": (self.score_keys, ("permuted", "rows")),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"Rewrites.{name}={value!r}; allowed: {allowed}")
        if self.texture_limit < 0:
            raise ValueError(f"Rewrites.texture_limit={self.texture_limit}; allowed: 0 (off) or a positive side")
        for name in ("query_chunk", "image_query_chunk"):
            if getattr(self, name) < 0:
                raise ValueError(f"Rewrites.{name}={getattr(self, name)}; allowed: 0 (off) or queries per slice")


UPSTREAM = Rewrites(
    attention_rank=4,
    attention_impl="sdpa",
    transposed_conv="native",
    layer_norm="native",
    mask_head="matmul",
    texture_limit=0,
    memory_values="projected",
    token_fold="projected",
    rope_keys="rows",
    key_bias="added",
    query_chunk=0,
)


def texture_rows(num_heads: int, d: int, nk: int) -> int:
    """Texture rows one batch item's attention matmuls need (see ``attention_chunk``): heads x ceil(max(d, Nk)/4)."""
    return num_heads * math.ceil(max(d, nk) / 4)


def attention_chunk(batch: int, num_heads: int, d: int, nk: int, texture_limit: int) -> int:
    """Largest batch slice whose attention matmuls fit GPU textures of side ``texture_limit``.

    ML Drift (LiteRT's GPU delegate) stores the right-hand operand of a BATCH_MATMUL
    (batch, K, N) as a 2-D texture of ceil(N/4) x batch*ceil(K/4) texels (measured from the
    delegate's WebGPU validation errors on the full-size encoder: all seven oversized textures fit
    this rule). In q k^T the contraction is d; in softmax(.) v it is Nk. Hiera's windowed blocks
    batch up to 1024 windows (stage 1: 1024 x 24 = 24576 rows), so they run in slices. Returns
    ``batch`` when no split is needed or ``texture_limit`` is 0; at least 1.
    """
    if not texture_limit:
        return batch
    rows_per_item = texture_rows(num_heads, d, nk)
    if batch * rows_per_item <= texture_limit:
        return batch
    pieces = math.ceil(batch / max(1, texture_limit // rows_per_item))  # fewest slices that fit
    return math.ceil(batch / pieces)  # equal slices, each no larger than the largest that fits


def head_chunk(num_heads: int, d: int, nk: int, texture_limit: int) -> int:
    """Most heads per slice such that ONE batch item's attention operands fit ``texture_limit`` rows.

    Batch slicing (``attention_chunk``) cannot shrink below one item, whose rows are
    num_heads * ceil(max(d, Nk)/4); wider models (more heads at a global block) can overflow there.
    Heads are independent, so equal head groups compute the same function. Returns ``num_heads``
    when one item fits or ``texture_limit`` is 0; at least 1.
    """
    rows_per_head = math.ceil(max(d, nk) / 4)
    if not texture_limit or num_heads * rows_per_head <= texture_limit:
        return num_heads
    pieces = math.ceil(num_heads / max(1, texture_limit // rows_per_head))
    return math.ceil(num_heads / pieces)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_heads: int,
    rw: Rewrites,
    key_bias: torch.Tensor | None = None,
    keys_transposed: bool = False,
    query_chunk: int = 0,
) -> torch.Tensor:
    """Multi-head attention on already-projected tensors.

    q: (B, Nq, C), k: (B, Nk, C) or, with ``keys_transposed``, (B, C, Nk); v: (B, Nk, Cv); C, Cv divisible by
    num_heads. key_bias: optional (B, Nk) additive logit bias per key (0 keeps a key, -1e4 removes it).
    Returns (B, Nq, Cv). No tensor above rank 4 is created. With ``rw.texture_limit`` the batch
    is processed in static slices (see ``attention_chunk``), each item's arithmetic unchanged. With
    ``query_chunk`` (see ``Rewrites.query_chunk``) batch items run one at a time and each item's queries in
    slices of ``query_chunk`` rows against the same prepared keys (every query row's softmax is its own: exact).
    """
    B, Nk = q.shape[0], k.shape[2 if keys_transposed else 1]
    d, dv = q.shape[2] // num_heads, v.shape[2] // num_heads
    group = head_chunk(num_heads, d, Nk, rw.texture_limit)
    if group < num_heads:  # one item's heads overflow a texture: head groups, each exact on its own
        outs = []
        for h in range(0, num_heads, group):
            n = min(group, num_heads - h)
            kh = k[:, h * d : (h + n) * d] if keys_transposed else k[..., h * d : (h + n) * d]
            vh = v[..., h * dv : (h + n) * dv]
            qh = q[..., h * d : (h + n) * d]
            outs.append(attention(qh, kh, vh, n, rw, key_bias, keys_transposed, query_chunk))
        return torch.cat(outs, -1)  # (B, Nq, Cv), heads in order
    step = 1 if query_chunk else attention_chunk(B, num_heads, d, Nk, rw.texture_limit)
    if step >= B:
        return _attention(q, k, v, num_heads, rw, key_bias, keys_transposed, query_chunk)
    outs = []
    for i in range(0, B, step):
        kb = None if key_bias is None else key_bias[i : i + step]
        qi, ki, vi = q[i : i + step], k[i : i + step], v[i : i + step]
        outs.append(_attention(qi, ki, vi, num_heads, rw, kb, keys_transposed, query_chunk))
    return torch.cat(outs, 0)  # (B, Nq, Cv)


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_heads: int,
    rw: Rewrites,
    key_bias: torch.Tensor | None,
    keys_transposed: bool = False,
    query_chunk: int = 0,
) -> torch.Tensor:
    """``attention`` on one batch slice: (B, Nq, C), (B, Nk, C) or (B, C, Nk), (B, Nk, Cv) -> (B, Nq, Cv);
    the queries in slices of ``query_chunk`` rows (0: all at once)."""
    if rw.attention_impl == "ort_mha" and key_bias is None and not keys_transposed and not query_chunk:
        from sam2edge.model.fused_attention import ort_multi_head_attention

        return ort_multi_head_attention(q, k, v, num_heads)  # (B, Nq, Cv)
    B, Nq, C = q.shape
    Nk, Cv = v.shape[1], v.shape[2]
    d, dv = C // num_heads, Cv // num_heads
    q = _heads(q, num_heads)  # (B, nh, Nq, d)
    if keys_transposed:
        kt = k.reshape(B, num_heads, d, Nk)  # (B, nh, d, Nk): channels are head-major
    elif rw.score_keys == "rows":
        kt = _heads(k, num_heads).transpose(-2, -1)  # (B, nh, d, Nk) as a view of (B, nh, Nk, d)
    else:
        kt = k.reshape(B, Nk, num_heads, d).permute(0, 2, 3, 1)  # (B, nh, d, Nk): one transpose, not two
    v = _heads(v, num_heads)  # (B, nh, Nk, dv)
    if rw.attention_rank == 3:
        q = q.reshape(B * num_heads, Nq, d)  # (B*nh, Nq, d)
        kt = kt.reshape(B * num_heads, d, Nk)  # (B*nh, d, Nk)
        v = v.reshape(B * num_heads, Nk, dv)  # (B*nh, Nk, dv)
    bias = None
    if key_bias is not None:
        bias = key_bias.reshape(B, 1, 1, Nk)  # (B, 1, 1, Nk)
        if rw.attention_rank == 3:
            bias = bias.expand(B, num_heads, 1, Nk).reshape(B * num_heads, 1, Nk)  # (B*nh, 1, Nk)
    if rw.attention_impl == "sdpa":
        k = kt.transpose(-2, -1)  # (.., Nk, d)
        out = _query_slices(q, query_chunk, lambda qs: F.scaled_dot_product_attention(qs, k, v, attn_mask=bias))
    else:
        q = q * (1.0 / math.sqrt(d))
        if bias is not None and keys_transposed and rw.key_bias == "folded":
            q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)  # (.., Nq, d + 1)
            kt = torch.cat([kt, bias.expand(*kt.shape[:-2], 1, Nk)], dim=-2)  # (.., d + 1, Nk): bias row last
            bias = None

        def rows(qs: torch.Tensor) -> torch.Tensor:
            scores = qs @ kt  # (.., n, Nk)
            if bias is not None:
                scores = scores + bias
            return softmax_keys(scores, rw) @ v  # (.., n, dv)

        out = _query_slices(q, query_chunk, rows)
    out = out.reshape(B, num_heads, Nq, dv)  # (B, nh, Nq, dv)
    if num_heads == 1:
        return out.reshape(B, Nq, Cv)  # (B, Nq, Cv): one head needs no transpose
    return out.transpose(1, 2).reshape(B, Nq, Cv)  # (B, Nq, Cv)


SOFTMAX_SHIFT = 6.0  # the largest term is e^6 = 403, and e / mean(e) <= N stays finite in fp16 for N < 65504 keys


def softmax_keys(x: torch.Tensor, rw: Rewrites) -> torch.Tensor:
    """Softmax over the last dim (keys) of x, in the form ``rw.softmax`` names."""
    if rw.softmax == "native":
        return torch.softmax(x, dim=-1)
    last = x.dim() - 1  # XNNPACK's max.dim takes the dim as 2 or 3 of a 4-D tensor, not -1
    e = torch.exp(x - (torch.max(x, last, keepdim=True)[0] - SOFTMAX_SHIFT))  # (.., N) in (0, e^6]
    return (e / e.mean(last, keepdim=True)) * (1.0 / x.shape[-1])  # (.., N); e / mean(e) <= N


def _query_slices(q: torch.Tensor, chunk: int, fn) -> torch.Tensor:
    """fn over static slices of ``chunk`` query rows (axis -2) of q (.., Nq, d), concatenated; fn(q) if 0."""
    Nq = q.shape[-2]
    if not chunk or chunk >= Nq:
        return fn(q)
    return torch.cat([fn(q[..., i : i + chunk, :]) for i in range(0, Nq, chunk)], dim=-2)  # (.., Nq, dv)


def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, C) -> (B, nh, N, C/nh), head-major; a reshape alone for one head (no transpose to run)."""
    B, N, C = x.shape
    if num_heads == 1:
        return x.reshape(B, 1, N, C)  # (B, 1, N, C)
    return x.reshape(B, N, num_heads, C // num_heads).transpose(1, 2)  # (B, nh, N, d)


def _normalize(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over ``dim``, squaring only pre-scaled values ("safe").

    The centred values are multiplied by 1/sqrt(C) before squaring, so the sum of squares
    equals the mean of squares without ever materialising C-times larger partial values
    (the fp16 overflow guard of the reference encoder card). It still overflows fp16 once
    |x - mean| > 256 * sqrt(C) (1448 at C = 32, 4096 at C = 256), see ``_normalize_scaled``.
    """
    c = x.shape[dim]
    xc = x - x.mean(dim, keepdim=True)
    scaled = xc * (1.0 / math.sqrt(c))
    var = (scaled * scaled).sum(dim, keepdim=True)
    return xc * torch.rsqrt(var + eps)


def _normalize_scaled(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over ``dim`` with every intermediate independent of the scale of x.

    With s = mean|x - mean| + tiny (any s > 0 gives the same function):
        (x - mean) / sqrt(var + eps) = u * rsqrt(mean(u^2) + (sqrt(eps) / s)^2),  u = (x - mean) / s.
    |u| <= C and, by Cauchy-Schwarz, mean(u^2) lies in [1, C]; the squares are taken of u / sqrt(C)
    (each <= C, their sum = mean(u^2) <= C), so no intermediate can overflow fp16 (65504) for any
    scale of x. mean|x - mean| is summed from (1/C)-scaled terms, so it never exceeds max|x - mean|.
    fp32: equal to ``_normalize`` within rounding (~1e-7 relative).
    """
    c = x.shape[dim]
    xc = x - x.mean(dim, keepdim=True)
    s = (xc.abs() * (1.0 / c)).sum(dim, keepdim=True) + 1e-4  # mean |x - mean| (+ tiny: a constant row stays 0)
    u = xc / s
    r = u * (1.0 / math.sqrt(c))
    root = (s * 0.0 + math.sqrt(eps)) / s  # sqrt(eps) / s as a tensor division (no RECIPROCAL op: XNNPACK has none)
    floor = root * root  # eps / s^2 without squaring s first
    return u * torch.rsqrt((r * r).sum(dim, keepdim=True) + floor)


NORMALIZERS = {"safe": _normalize, "scaled": _normalize_scaled}


class LayerNorm(nn.Module):
    """LayerNorm over the last dim of (..., C)."""

    def __init__(self, dim: int, eps: float, rw: Rewrites) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps, self.normalize = eps, NORMALIZERS.get(rw.layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize is None:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        return self.normalize(x, -1, self.eps) * self.weight + self.bias


class LayerNorm2d(nn.Module):
    """LayerNorm over channels of (B, C, H, W), as upstream's LayerNorm2d (eps 1e-6)."""

    def __init__(self, dim: int, rw: Rewrites, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps, self.normalize = eps, NORMALIZERS.get(rw.layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight[:, None, None] * self._normalized(x, 1) + self.bias[:, None, None]

    def channels_last(self, x: torch.Tensor) -> torch.Tensor:
        """The same norm of (B, H, W, C): over the last dim."""
        return self._normalized(x, -1) * self.weight + self.bias

    def _normalized(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        if self.normalize is not None:
            return self.normalize(x, dim, self.eps)
        u = x.mean(dim, keepdim=True)
        s = (x - u).pow(2).mean(dim, keepdim=True)
        return (x - u) / torch.sqrt(s + self.eps)


class MLP(nn.Module):
    """``num_layers`` Linear layers with ``act`` between them (upstream ``sam2_utils.MLP``)."""

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_layers: int,
        act: type[nn.Module] = nn.ReLU,
        sigmoid_output: bool = False,
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = act()
        self.sigmoid_output = sigmoid_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return torch.sigmoid(x) if self.sigmoid_output else x
