"""The compute bound of a subject: model FLOPs over fp32 GEMM throughput measured here (``sam2edge bench --bound``)."""

from __future__ import annotations

import statistics
import time

import torch

from sam2edge.config import Sam2Config


def model_flops(cfg: Sam2Config) -> dict[str, float]:
    """FLOPs of one encode and of one single-click decode (prompt encoder + mask decoder), upstream's operations.

    Counted on the meta device: on the CPU, torch's FlopCounter does not count the fused attention kernel
    (Hiera-Tiny's encoder read 207 instead of 292 GFLOP, the attention matmuls left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    from sam2edge.model import UPSTREAM as UPSTREAM_OPS
    from sam2edge.model import build_sam2

    model = build_sam2(cfg, UPSTREAM_OPS).to("meta")
    x = torch.zeros(1, 3, cfg.image_size, cfg.image_size, device="meta")
    point = torch.tensor([[[100.0, 100.0], [0.0, 0.0]]], device="meta"), torch.tensor([[1.0, -1.0]], device="meta")
    with torch.no_grad():
        with FlopCounterMode(display=False) as enc:
            feats = model.encode_image(x)
        with FlopCounterMode(display=False) as dec:
            pe = model.sam_prompt_encoder
            model.decode(*feats, pe.embed_points(*point), pe.no_mask_dense)
    return {"encoder_gflop": enc.get_total_flops() / 1e9, "decoder_gflop": dec.get_total_flops() / 1e9}


def gemm_gflops(threads: int, n: int = 2048, runs: int = 5) -> float:
    """Median fp32 GEMM throughput (torch.mm n x n x n) at ``threads`` threads, GFLOP/s."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
        return 2 * n**3 / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(old)


def compute_bound(cfg: Sam2Config, gflops: float) -> dict[str, float]:
    f = model_flops(cfg)
    return f | {
        "gemm_gflops": gflops,
        "encoder_bound_ms": f["encoder_gflop"] / gflops * 1e3,
        "decoder_bound_ms": f["decoder_gflop"] / gflops * 1e3,
    }
