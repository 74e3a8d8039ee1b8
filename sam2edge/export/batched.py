"""Batched decoder graph: B prompts per call on one image ("segment everything" in B-sized steps).

Token-input contract (as ``TokenDecoderGraph``, with B prompt rows sharing one image; B and K fixed
at export; e = S/16, C = d_model):

  in : image_embeddings [1,C,e,e], feat_s0 [1,C/8,4e,4e], feat_s1 [1,C/4,2e,2e] (the encoder's outputs,
       once), sparse_prompt [B,K,C] (host-encoded tokens, ``runtime.prompts.encode_points`` per row),
       sparse_valid [B,K] (1 used slot, 0 ignored), dense_prompt [1,C,e,e] (the no-mask table, shared)
  out: masks [B,3,4e,4e] multimask logits, iou_scores [B,3], single_mask [B,1,4e,4e], single_iou [B,1],
       object_score [B,1]

Row b of every output equals ``TokenDecoderGraph`` on row b's prompt. A grid prompt is one point and
upstream's pad point, so K = 2 by default. Every tensor stays rank <= 4.

The LiteRT graph (``BatchedTokenDecoderGraph``) concatenates the image to rows up front (GPU delegates
reject BROADCAST_TO) and decodes the B prompts in static slices of ``rows_per_slice`` rows, so that no
tensor outgrows a GPU allocation (``GPU_TENSOR_BYTES``; at 1024 px one prompt's zero-stuffed up-convolution
input alone is 17 MB: 64 rows in one tensor, 1.1 GB, exceed what the GPU delegate may allocate).

The ONNX graph (``BatchedPointDecoderGraph``) and ExecuTorch's hand the decoder the one image row: the
first two-way layer then projects the image once instead of B times (``MaskDecoder.forward_tokens``),
about a fifth of a prompt's FLOPs, and broadcasts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sam2edge.config import Sam2Config
from sam2edge.model import Sam2ImageModel
from sam2edge.runtime.backends.litert import BATCHED_DECODER_FILE  # noqa: F401 - the bundle file name

BATCH = 64  # prompts per call: a 32x32 grid is 16 calls (``options={"batch": B}`` / ``job.state["batch"]``)
GRID_TOKENS = 2  # one point + upstream's pad point
BATCHED_OUTPUTS = ("masks", "iou_scores", "single_mask", "single_iou", "object_score")
# Largest tensor of the LiteRT batched graph: WebGPU's default maxBufferSize (256 MiB); SwiftShader's
# Vulkan device, which the GPU check runs, refuses allocations above 1 GiB ("RESOURCE_EXHAUSTED").
GPU_TENSOR_BYTES = 256 * 2**20


def rows_per_slice(cfg: Sam2Config, budget: int = GPU_TENSOR_BYTES) -> int:
    """Prompt rows per decoder slice so that the largest fp32 tensor fits ``budget`` bytes: the zero-stuffed,
    padded inputs of the two up-convolutions, C x (2e+1)^2 and C/4 x (4e+1)^2 floats per row (15 rows at
    1024 px, 1925 at test-small's 256 px)."""
    e, c = cfg.image_embedding_size, cfg.d_model
    per_row = 4 * max(c * (2 * e + 1) ** 2, c // 4 * (4 * e + 1) ** 2)  # bytes
    return max(1, budget // per_row)


class BatchedTokenDecoderGraph(nn.Module):
    """B token-input prompts against one image embedding (module docstring for the contract), decoded in
    static slices of ``rows_per_slice(cfg, budget)`` rows (each slice exactly the decoder on its rows)."""

    def __init__(self, model: Sam2ImageModel, batch: int = BATCH, budget: int = GPU_TENSOR_BYTES) -> None:
        super().__init__()
        self.model, self.batch = model, batch
        self.step = min(batch, rows_per_slice(model.cfg, budget))

    def forward(self, image_embeddings, feat_s0, feat_s1, sparse_prompt, sparse_valid, dense_prompt):
        emb = torch.cat([image_embeddings] * self.step)  # (step, C, e, e)
        s0 = torch.cat([feat_s0] * self.step)  # (step, C/8, 4e, 4e)
        s1 = torch.cat([feat_s1] * self.step)  # (step, C/4, 2e, 2e)
        dec, parts = self.model.sam_mask_decoder, []
        for i in range(0, self.batch, self.step):  # static slices of prompt rows
            n = min(self.step, self.batch - i)
            rows = slice(i, i + n)
            masks, iou, obj = self.model.decode(
                emb[:n], s0[:n], s1[:n], sparse_prompt[rows], dense_prompt, sparse_valid[rows]
            )
            parts.append((*dec.multimask(masks, iou), *dec.single_mask(masks, iou), obj))
        if len(parts) == 1:
            return parts[0]
        return tuple(torch.cat(outs) for outs in zip(*parts))  # m3, i3, m1, i1, obj with B rows


def sample_inputs(model: Sam2ImageModel, batch: int = BATCH, tokens: int = GRID_TOKENS) -> dict[str, torch.Tensor]:
    """Named sample inputs of the batched graph's shapes (for conversion)."""
    cfg = model.cfg
    e, c = cfg.image_embedding_size, cfg.d_model
    g = torch.Generator().manual_seed(0)
    return {
        "image_embeddings": torch.randn(1, c, e, e, generator=g),
        "feat_s0": torch.randn(1, c // 8, 4 * e, 4 * e, generator=g),
        "feat_s1": torch.randn(1, c // 4, 2 * e, 2 * e, generator=g),
        "sparse_prompt": torch.randn(batch, tokens, c, generator=g),
        "sparse_valid": torch.ones(batch, tokens),
        "dense_prompt": torch.randn(1, c, e, e, generator=g),
    }


class BatchedPointDecoderGraph(nn.Module):
    """B point prompts per call with the prompt encoder inside (ONNX / ExecuTorch-style contract).

    in : image_embeddings [1,C,e,e], feat_s0, feat_s1 (as above), point_coords [B,N,2] (X, Y) model-input
         pixels, point_labels [B,N] float (1 fg, 0 bg, -1 pad, -2 ignored slot); no mask input.
    out: as ``BatchedTokenDecoderGraph``. Row b equals ``PointDecoderGraph`` on row b's prompt. B and N are
    those of the sample inputs it is traced with (``point_sample_args``).
    """

    def __init__(self, model: Sam2ImageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeddings, feat_s0, feat_s1, point_coords, point_labels):
        pe = self.model.sam_prompt_encoder
        valid = (point_labels != -2).to(point_coords.dtype)  # (B, N)
        sparse = pe.embed_points(point_coords, point_labels)  # (B, N, C)
        # one image row for B prompts: the decoder does the prompt-independent image work once and
        # broadcasts (``MaskDecoder.forward_tokens``); ONNX Add / MatMul broadcast natively
        masks, iou, obj = self.model.decode(image_embeddings, feat_s0, feat_s1, sparse, pe.no_mask_dense, valid)
        dec = self.model.sam_mask_decoder
        m3, i3 = dec.multimask(masks, iou)
        m1, i1 = dec.single_mask(masks, iou)
        return m3, i3, m1, i1, obj


def point_sample_args(model: Sam2ImageModel, batch: int = BATCH, points: int = GRID_TOKENS) -> tuple:
    """Positional sample inputs of ``BatchedPointDecoderGraph`` (for tracing)."""
    s = sample_inputs(model, batch, points)
    coords = torch.rand(batch, points, 2, generator=torch.Generator().manual_seed(1)) * model.cfg.image_size
    labels = torch.tensor([[1.0] + [-1.0] * (points - 1)] * batch)  # (B, N)
    return (s["image_embeddings"], s["feat_s0"], s["feat_s1"], coords, labels)


def export_onnx(model: Sam2ImageModel, path, batch: int = BATCH, points: int = GRID_TOKENS, opset: int = 17) -> None:
    """Trace ``BatchedPointDecoderGraph`` to a self-contained .onnx (fixed B and N; legacy exporter, as
    ``export.onnx``). Inputs / outputs by name: image_embeddings, feat_s0, feat_s1, point_coords, point_labels
    -> BATCHED_OUTPUTS."""
    import warnings

    args = point_sample_args(model, batch, points)
    names = ["image_embeddings", "feat_s0", "feat_s1", "point_coords", "point_labels"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            BatchedPointDecoderGraph(model).eval(),
            args,
            str(path),
            dynamo=False,
            opset_version=opset,
            do_constant_folding=True,
            input_names=names,
            output_names=list(BATCHED_OUTPUTS),
        )


def batch_size(job) -> int:
    """B of the exported batched graph: ``job.state["batch"]`` (run_export ``options``), else ``BATCH``;
    0: the export writes no batched graph (tests whose bundles never segment everything)."""
    return int(job.state.get("batch", BATCH))


def check_batched(job, backend) -> dict:
    """The batched graph on B + 3 grid prompts (two calls, the last one padded) vs the same prompts as
    single decodes of ``backend``, on a real photo: per output ``compare`` over all rows, and the worst
    row's single-mask IoU. Bars: ``checks.fidelity.bars.BARS`` of the precision (cosine where it has one,
    the worst end-to-end IoU bar for the masks); a miss is a failure of the bundle."""
    from sam2edge.checks.fidelity.bars import bars_for
    from sam2edge.checks.fidelity.metrics import compare, mask_iou
    from sam2edge.checks.photos import photo
    from sam2edge.runtime.backends import decode_loop
    from sam2edge.runtime.preprocess import preprocess

    if not any(role == "decoder-batched" for role in job.files.values()):
        return {"skipped": "no batched decoder in this bundle (run_export options batch=0)", "failures": []}
    s, n = job.cfg.image_size, batch_size(job) + 3
    feats = backend.encode(preprocess(photo("astronaut.png"), s).numpy())
    g = np.random.default_rng(0)
    coords = np.concatenate([g.uniform(0, s, (n, 1, 2)), np.zeros((n, 1, 2))], 1).astype(np.float32)  # (n, 2, 2)
    labels = np.tile(np.array([[1, -1]], np.float32), (n, 1))  # (n, 2): one point + upstream's pad
    got, ref = backend.decode_batch(feats, coords, labels), decode_loop(backend, feats, coords, labels)
    outputs = {f: compare(getattr(got, f), getattr(ref, f)) for f in got.__dataclass_fields__}
    worst = min(mask_iou(a > 0, b > 0) for a, b in zip(got.single_mask, ref.single_mask))
    bars = bars_for(job.precision)
    fails = [
        f"{k}: cosine {m['cosine']:.7f} < {bars['min_cosine']}"
        for k, m in outputs.items()
        if "min_cosine" in bars and not m["cosine"] >= bars["min_cosine"]
    ]
    if not worst >= bars["min_iou_worst"]:
        fails.append(f"single_mask: worst row IoU {worst:.5f} < {bars['min_iou_worst']}")
    fails = [f"batched decoder vs single decodes: {f}" for f in fails]
    return {"prompts": n, "batch": batch_size(job), "outputs": outputs, "mask_iou_worst": worst, "failures": fails}
