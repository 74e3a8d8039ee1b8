"""Two-way transformer + mask decoder (upstream ``sam/transformer.py`` and ``sam/mask_decoder.py``).

``MaskDecoder.forward`` returns all four mask tokens' outputs; the two ways upstream turns
them into answers are separate, graph-friendly functions:
``multimask`` (static slice of candidates 1..3) and ``single_mask`` (SAM 2.1's dynamic
multimask via stability, written with comparisons and arithmetic instead of argmax/gather,
selecting exactly what upstream selects, first index on ties).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.model.layers import MLP, LayerNorm, LayerNorm2d, Rewrites, attention
from sam2edge.model.upconv import UpConv2x2


class ImageProjections(NamedTuple):
    """The first two-way layer's projections of the image side (``MaskDecoder.image_projections``); they do
    not depend on the prompt's tokens, only on image_embed + dense (so, without a mask input, on the image)."""

    image_q: torch.Tensor  # BxHWxCi: image->token attention's q_proj(image + pe)
    image_k: torch.Tensor  # BxHWxCi: token->image attention's k_proj(image + pe)
    image_v: torch.Tensor  # BxHWxCi: token->image attention's v_proj(image)


def pe_rows(image_pe: torch.Tensor) -> torch.Tensor:
    """The image positional encoding as rows: (B, C, H, W) -> (B, HW, C); rows (B, HW, C) pass as they are."""
    if image_pe.dim() == 3:
        return image_pe
    B, C, H, W = image_pe.shape
    return image_pe.reshape(B, C, H * W).transpose(1, 2)  # (B, HW, C)


class Attention(nn.Module):
    """Projected multi-head attention; internal width = dim / downsample_rate."""

    def __init__(self, dim: int, num_heads: int, downsample_rate: int, rw: Rewrites) -> None:
        super().__init__()
        inner = dim // downsample_rate
        self.num_heads, self.rw = num_heads, rw
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.out_proj = nn.Linear(inner, dim)
        self.fold = rw.token_fold == "folded"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_bias: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> torch.Tensor:
        """q: BxNqxC, k/v: BxNkxC, key_bias: BxNk or None -> BxNqxC.

        ``rows`` (Bx1x1 ones): q, or k and v, may then be ONE row shared by all B (the image of a batched
        decode): it is projected once. Shared keys fold the B query rows into one (each query attends
        alone, so that is exact and no row is copied); a shared query is broadcast to B rows by ``rows``.
        ``given``: the image side's projections, computed before the prompt was known (``image_q`` when
        the image is q, ``image_k`` / ``image_v`` when it is k and v); the others are projected here.
        """
        if self._folds(q, k):
            return (
                self._fold_image_keys(q, k, v)
                if k.shape[1] > q.shape[1]
                else self._fold_image_queries(q, k, v, key_bias)
            )
        if given is not None and q.shape[1] > k.shape[1]:  # the image queries the tokens
            q, k, v = given.image_q, self.k_proj(k), self.v_proj(v)
        elif given is not None:  # the tokens query the image
            q, k, v = self.q_proj(q), given.image_k, given.image_v
        else:
            q, k, v = self.q_proj(q), self.k_proj(k), self.v_proj(v)
        if rows is not None and k.shape[0] == 1 and q.shape[0] > 1:
            B, Nq, Ci = q.shape
            out = attention(q.reshape(1, B * Nq, Ci), k, v, self.num_heads, self.rw, key_bias)  # (1, B*Nq, Cv)
            return self.out_proj(out.reshape(B, Nq, -1))  # (B, Nq, C)
        if rows is not None and q.shape[0] == 1:
            q = q * rows  # (B, Nq, Ci): the shared query projection broadcast to every row
        return self.out_proj(attention(q, k, v, self.num_heads, self.rw, key_bias))

    def _folds(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """``Rewrites.token_fold`` on the cross-attentions (image and tokens differ in length), except where the
        image is the keys of B prompt rows sharing it (its projections are then computed once for all rows,
        cheaper than B folded products)."""
        return self.fold and (q.shape[1] > k.shape[1] or (k.shape[1] > q.shape[1] and k.shape[0] == q.shape[0]))

    def _fold_image_keys(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Tokens q BxTxC attend to the image k, v BxHWxC without projecting the image: per head h,
        (q_h)(k W_kh^T + b_kh)^T = (q_h W_kh) k^T + a constant per row (dropped by softmax), and
        P (v W_vh^T + b_vh) = (P v) W_vh^T + b_vh (rows of P sum to 1). -> BxTxC."""
        h, C = self.num_heads, k.shape[2]
        Q = self.q_proj(q)  # (B, T, Ci)
        B, T, Ci = Q.shape
        d = Ci // h
        Qh = Q.reshape(B, T, h, d).transpose(1, 2) * (1.0 / math.sqrt(d))  # (B, h, T, d), scaled
        A = (Qh @ self.k_proj.weight.reshape(h, d, C)).reshape(B, h * T, C)  # (B, hT, C): q_h W_kh
        P = torch.softmax(A @ k.transpose(1, 2), dim=-1)  # (B, hT, HW)
        Wv = self.v_proj.weight.reshape(h, d, C).transpose(1, 2)  # (h, C, d)
        O = (P @ v).reshape(B, h, T, C) @ Wv + self.v_proj.bias.reshape(h, 1, d)  # (B, h, T, d)
        return self.out_proj(O.transpose(1, 2).reshape(B, T, Ci))  # (B, T, C)

    def _fold_image_queries(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor | None
    ) -> torch.Tensor:
        """The image q (1|B)xHWxC attends to tokens k, v BxTxC without projecting the image: per head h,
        (q W_qh^T + b_qh) k_h^T = q (W_qh^T k_h^T) + b_qh k_h^T, and out_proj(sum_h P_h v_h) =
        sum_h P_h (v_h W_oh^T) + b_o. One image row for B prompt rows is one 2-D product. -> BxHWxC."""
        h, C = self.num_heads, q.shape[2]
        K, V = self.k_proj(k), self.v_proj(v)  # (B, T, Ci)
        B, T, Ci = K.shape
        d, HW = Ci // h, q.shape[1]
        Kh = K.reshape(B, T, h, d).transpose(1, 2) * (1.0 / math.sqrt(d))  # (B, h, T, d), scaled
        M = (Kh @ self.q_proj.weight.reshape(h, d, C)).reshape(B, h * T, C)  # (B, hT, C): W_qh^T k_t per row
        bias = (Kh @ self.q_proj.bias.reshape(h, d, 1)).reshape(B, 1, h * T)  # (B, 1, hT): b_qh . k_t
        if key_bias is not None:
            bias = bias + torch.cat([key_bias] * h, dim=1).reshape(B, 1, h * T)  # (B, 1, hT), per head
        if q.shape[0] == 1:  # one image for B rows: one (HW, C) x (C, B*hT) product
            S = (q[0] @ M.reshape(B * h * T, C).transpose(0, 1)).reshape(HW, B, h * T).transpose(0, 1)  # (B, HW, hT)
        else:
            S = q @ M.transpose(1, 2)  # (B, HW, hT)
        P = torch.softmax((S + bias).reshape(B, HW, h, T), dim=-1).reshape(B, HW, h * T)  # per head over tokens
        Wo = self.out_proj.weight.reshape(C, h, d).permute(1, 2, 0)  # (h, d, C)
        U = (V.reshape(B, T, h, d).transpose(1, 2) @ Wo).reshape(B, h * T, C)  # (B, hT, C): v_h W_oh^T
        return P @ U + self.out_proj.bias  # (B, HW, C)


class TwoWayAttentionBlock(nn.Module):
    def __init__(self, cfg: Sam2Config, skip_first_layer_pe: bool, rw: Rewrites) -> None:
        super().__init__()
        d, h, r = cfg.d_model, cfg.decoder_heads, cfg.attention_downsample_rate
        self.self_attn = Attention(d, h, 1, rw)
        self.norm1 = LayerNorm(d, 1e-5, rw)
        self.cross_attn_token_to_image = Attention(d, h, r, rw)
        self.norm2 = LayerNorm(d, 1e-5, rw)
        self.mlp = MLP(d, cfg.decoder_mlp_dim, d, 2, act=nn.ReLU)
        self.norm3 = LayerNorm(d, 1e-5, rw)
        self.norm4 = LayerNorm(d, 1e-5, rw)
        self.cross_attn_image_to_token = Attention(d, h, r, rw)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        query_pe: torch.Tensor,
        key_pe: torch.Tensor,
        token_bias: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """queries BxTxC (tokens), keys BxHWxC (image); token_bias BxT removes ignored tokens as keys.

        ``rows`` (Bx1x1 ones) with keys 1xHWxC: one image shared by B prompt rows; its projections are
        computed once (``Attention``) and the returned keys have B rows. ``given``: this layer's image
        projections, computed beforehand (the first layer only: later keys depend on the prompt)."""
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries, token_bias)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries, token_bias)
        queries = self.norm1(queries)
        q, k = queries + query_pe, keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q, k, keys, rows=rows, given=given))
        queries = self.norm3(queries + self.mlp(queries))
        q = queries + query_pe  # keys (and so k) are unchanged since the line above
        keys = self.norm4(keys + self.cross_attn_image_to_token(k, q, queries, token_bias, rows, given))  # (B, HW, C)
        return queries, keys


class TwoWayTransformer(nn.Module):
    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        d = cfg.d_model
        self.layers = nn.ModuleList(TwoWayAttentionBlock(cfg, i == 0, rw) for i in range(cfg.decoder_depth))
        self.final_attn_token_to_image = Attention(d, cfg.decoder_heads, cfg.attention_downsample_rate, rw)
        self.norm_final_attn = LayerNorm(d, 1e-5, rw)

    def forward(
        self,
        image: torch.Tensor,
        image_pe: torch.Tensor,
        tokens: torch.Tensor,
        token_bias: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """image BxCxHxW, image_pe (1|B)xCxHxW or its rows (1|B)xHWxC; tokens: BxTxC; token_bias: BxT or None ->
        (tokens BxTxC, image BxHWxC).

        ``rows`` (Bx1x1 ones) with a 1xCxHxW image: one image for B prompt rows (batched decoding); the
        first layer works on it once where the prompt does not enter and returns B rows. ``given``: the
        first layer's image projections (``MaskDecoder.image_projections``), not computed again."""
        B, C, H, W = image.shape
        keys = image.reshape(B, C, H * W).transpose(1, 2)  # (1|B, HW, C)
        key_pe = pe_rows(image_pe)  # (1|B, HW, C)
        queries = tokens
        for i, layer in enumerate(self.layers):
            queries, keys = layer(queries, keys, tokens, key_pe, token_bias, rows, given if i == 0 else None)
        q, k = queries + tokens, keys + key_pe
        queries = self.norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))
        return queries, keys


class MaskDecoder(nn.Module):
    """Tokens + image features -> 4 mask logits (B,4,4e,4e), 4 IoU scores (B,4), object score logit (B,1)."""

    def __init__(self, cfg: Sam2Config, rw: Rewrites) -> None:
        super().__init__()
        d, n = cfg.d_model, cfg.num_mask_tokens
        self.num_mask_tokens = n
        self.delta, self.thresh = cfg.stability_delta, cfg.stability_thresh
        self.channel_sum_head = rw.mask_head == "channel_sum"
        self.channels_last = rw.upscale_layout == "nhwc"
        self.transformer = TwoWayTransformer(cfg, rw)
        self.iou_token = nn.Embedding(1, d)
        self.mask_tokens = nn.Embedding(n, d)
        self.obj_score_token = nn.Embedding(1, d)
        self.output_upscaling = nn.Sequential(
            UpConv2x2(d, d // 4, rw),
            LayerNorm2d(d // 4, rw),
            nn.GELU(),
            UpConv2x2(d // 4, d // 8, rw),
            nn.GELU(),
        )
        self.conv_s0 = nn.Conv2d(d, d // 8, kernel_size=1)  # folded into the encoder's decoder-ready output
        self.conv_s1 = nn.Conv2d(d, d // 4, kernel_size=1)
        self.output_hypernetworks_mlps = nn.ModuleList(MLP(d, d, d // 8, 3) for _ in range(n))
        self.iou_prediction_head = MLP(d, cfg.iou_head_hidden_dim, n, cfg.iou_head_depth, sigmoid_output=True)
        self.pred_obj_score_head = MLP(d, d, 1, 3)

    def forward(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        sparse: torch.Tensor,
        dense: torch.Tensor,
        feat_s0: torch.Tensor,
        feat_s1: torch.Tensor,
        sparse_valid: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward_tokens`` without the mask tokens: (masks Bx4x4ex4e, iou Bx4, object_score Bx1)."""
        return self.forward_tokens(image_embed, image_pe, sparse, dense, feat_s0, feat_s1, sparse_valid, given)[:3]

    def image_projections(self, image_embed: torch.Tensor, image_pe: torch.Tensor, dense: torch.Tensor):
        """The prompt-independent part of a decode: the first layer's projections of the image side, from
        image_embed BxCxexe + dense BxCxexe (the no-mask table or a mask encoding) and image_pe 1xCxexe (or rows) ->
        ``ImageProjections`` (BxHWxCi each). The same operations as inside ``forward_tokens``, so a decode
        ``given`` them equals one without (bit for bit in eager); computed once per image (and mask input),
        they take 3 of the decoder's projections (0.8 of 3.6 GFLOP at 1024 px) out of every click."""
        B, C, H, W = image_embed.shape
        src = (image_embed + dense).reshape(B, C, H * W).transpose(1, 2)  # (B, HW, C): the keys
        k = src + pe_rows(image_pe)  # (B, HW, C): keys + key_pe
        first = self.transformer.layers[0]
        t2i = first.cross_attn_token_to_image
        return ImageProjections(first.cross_attn_image_to_token.q_proj(k), t2i.k_proj(k), t2i.v_proj(src))

    def forward_tokens(
        self,
        image_embed: torch.Tensor,
        image_pe: torch.Tensor,
        sparse: torch.Tensor,
        dense: torch.Tensor,
        feat_s0: torch.Tensor,
        feat_s1: torch.Tensor,
        sparse_valid: torch.Tensor | None = None,
        given: ImageProjections | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """image_embed Bx C x e x e (no_mem added); image_pe 1xCxexe (or its rows 1x(e*e)xC, as a graph that
        computes it per pixel makes it: no layout round trip); sparse BxNxC; dense BxCxexe;
        feat_s0 Bx(C/8)x4ex4e; feat_s1 Bx(C/4)x2ex2e -> (masks Bx4x4ex4e, iou Bx4, object_score Bx1,
        mask tokens Bx4xC: the decoder's output tokens, from which the video model makes object pointers).
        image_embed and dense may have 1 row for B prompts (batched decoding: the image-side work that
        does not depend on the prompt is then done once, see ``TwoWayAttentionBlock``); feat_s0 / feat_s1
        then have 1 or B rows (added by broadcasting).

        sparse_valid: optional BxN of 1.0 (token used) / 0.0 (ignored slot). An ignored token is
        removed as an attention key everywhere, so a fixed-size prompt input with ignored slots
        gives exactly the answer of the shorter prompt (None: every token is used, as upstream).
        given: ``image_projections(image_embed, image_pe, dense)``, computed beforehand (one image row).
        """
        B = sparse.shape[0]
        out_tokens = torch.cat([self.obj_score_token.weight, self.iou_token.weight, self.mask_tokens.weight], dim=0)
        # B copies by concatenation, not expand: a converter folds it into a constant, never BROADCAST_TO
        tokens = torch.cat([torch.cat([out_tokens.unsqueeze(0)] * B), sparse], dim=1)  # (B, 2+n+N, C)
        src = image_embed + dense  # (B|1, C, e, e)
        token_bias = None
        if sparse_valid is not None:
            out_valid = torch.ones_like(sparse_valid[:, :1]).expand(B, out_tokens.shape[0])  # (B, 2+n)
            token_bias = (torch.cat([out_valid, sparse_valid], dim=1) - 1.0) * 1e4  # (B, T): 0 or -1e4
        # one image for B prompts (batched decoding): the transformer's first layer uses it once
        rows = torch.ones_like(sparse[:, :1, :1]) if src.shape[0] < B else None  # (B, 1, 1) or None
        hs, src = self.transformer(src, image_pe, tokens, token_bias, rows, given)  # (B, T, C), (B, e*e, C)
        mask_tokens = hs[:, 2 : 2 + self.num_mask_tokens, :]  # (B, n, C)
        hyper_in = torch.stack(
            [mlp(mask_tokens[:, i, :]) for i, mlp in enumerate(self.output_hypernetworks_mlps)], dim=1
        )  # (B, n, C/8)
        _, c, h, w = image_embed.shape
        up1, ln1, act1, up2, act2 = self.output_upscaling
        if self.channels_last:
            x = src.reshape(B, h, w, c)  # (B, e, e, C): the transformer's rows are raster order
            x = act1(ln1.channels_last(up1.channels_last(x) + feat_s1.permute(0, 2, 3, 1)))  # (B, 2e, 2e, C/4)
            x = act2(up2.channels_last(x) + feat_s0.permute(0, 2, 3, 1))  # (B, 4e, 4e, C/8)
            return self._masks_nhwc(x, hyper_in), *self._scores(hs), mask_tokens
        src = src.transpose(1, 2).reshape(B, c, h, w)  # (B, C, e, e)
        x = act1(ln1(up1(src) + feat_s1))  # (B, C/4, 2e, 2e)
        x = act2(up2(x) + feat_s0)  # (B, C/8, 4e, 4e)
        return self._masks_nchw(x, hyper_in), *self._scores(hs), mask_tokens

    def _scores(self, hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output tokens hs BxTxC -> (iou Bxn, object score logit Bx1)."""
        return self.iou_prediction_head(hs[:, 1, :]), self.pred_obj_score_head(hs[:, 0, :])

    def _masks_nchw(self, x: torch.Tensor, hyper_in: torch.Tensor) -> torch.Tensor:
        """Features x (B, C/8, H, W) and hyper_in (B, n, C/8) -> masks (B, n, H, W)."""
        B, c8, H, W = x.shape
        n = self.num_mask_tokens
        if self.channel_sum_head:
            # hyper_in @ x as per-token weighted channel sums: no (C/8, 16e^2) axis (65536 at 1024 px)
            # that a GPU delegate would have to hold in one texture row (WebGPU's limit is 8192).
            sums = [(x * hyper_in[:, i].reshape(B, c8, 1, 1)).sum(dim=1, keepdim=True) for i in range(n)]
            return torch.cat(sums, dim=1)  # (B, n, H, W)
        return (hyper_in @ x.reshape(B, c8, H * W)).reshape(B, n, H, W)  # (B, n, H, W)

    def _masks_nhwc(self, x: torch.Tensor, hyper_in: torch.Tensor) -> torch.Tensor:
        """Channels-last features x (B, H, W, C/8) and hyper_in (B, n, C/8) -> masks (B, n, H, W)."""
        B, H, W, c8 = x.shape
        n = self.num_mask_tokens
        if self.channel_sum_head:
            sums = [(x * hyper_in[:, i].reshape(B, 1, 1, c8)).sum(dim=-1).reshape(B, 1, H, W) for i in range(n)]
            return torch.cat(sums, dim=1)  # (B, n, H, W)
        masks = x.reshape(B, H * W, c8) @ hyper_in.transpose(1, 2)  # (B, HW, n): the features as the big operand
        return masks.transpose(1, 2).reshape(B, n, H, W)  # (B, n, H, W)

    @staticmethod
    def multimask(masks: torch.Tensor, iou: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The multimask answer: candidates 1..n-1 (B, n-1, H, W), (B, n-1)."""
        return masks[:, 1:], iou[:, 1:]

    def single_mask(self, masks: torch.Tensor, iou: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SAM 2.1 single-mask answer: token 0 if its logits are stable, else the best multimask candidate.

        Stability = area(logits > delta) / area(logits > -delta) (1 where the union is empty).
        Returns (B, 1, H, W), (B, 1). Graph-friendly: no argmax, gather or Python branching.
        """
        multi, multi_iou = masks[:, 1:], iou[:, 1:]  # (B, k, H, W), (B, k)
        is_max = multi_iou == multi_iou.max(dim=-1, keepdim=True).values  # (B, k)
        taken = torch.zeros_like(is_max[:, :1])
        first = []
        for i in range(multi_iou.shape[1]):  # static loop over candidates: first max wins ties
            pick = is_max[:, i : i + 1] & ~taken
            first.append(pick)
            taken = taken | pick
        onehot = torch.cat(first, dim=1).to(masks.dtype)  # (B, k)
        best_mask = (onehot[:, :, None, None] * multi).sum(dim=1, keepdim=True)  # (B, 1, H, W)
        best_iou = (onehot * multi_iou).sum(dim=1, keepdim=True)  # (B, 1)
        single, single_iou = masks[:, :1], iou[:, :1]
        flat = single.flatten(2)  # (B, 1, HW)
        area_i = (flat > self.delta).float().sum(-1)  # (B, 1), fp32: counts must be exact
        area_u = (flat > -self.delta).float().sum(-1)  # (B, 1)
        stability = torch.where(area_u > 0, area_i / area_u, torch.ones_like(area_u))
        stable = stability >= self.thresh  # (B, 1)
        return torch.where(stable[:, :, None, None], single, best_mask), torch.where(stable, single_iou, best_iou)
