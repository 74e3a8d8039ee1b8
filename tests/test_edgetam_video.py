"""EdgeTAM's video path against the original EdgeTAM code (``edgetam-dimos``, run in a subprocess under its own
``sys.path``: it installs a top-level ``sam2`` that clashes with Meta's).

Module level (identical perturbed weights, two seeds): the spatial perceiver (EdgeTAM's 256 + 256 latents on a
64x64 memory, and the reduced 16 + 16 on 16x16) and the 2-layer memory attention with ``RoPEAttentionv2``
cross-attention, several objects at once (the original perceiver needs its one-word ``.view`` -> ``.reshape``
fix for that; unpatched it raises, which the test records).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sam2edge.config import TEST_SMALL, VIDEO_EDGETAM, VIDEO_EDGETAM_TEST, Sam2VideoConfig
from sam2edge.model import UPSTREAM, Rewrites
from sam2edge.model.memory_attention import MemoryAttention
from sam2edge.model.perceiver import PerceiverResampler

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL = Path(os.environ.get("SAM2EDGE_EDGETAM_ORIGINAL", ROOT / ".venv" / "edgetam-original"))
MAX_ABS = 2e-5  # fp32 vs fp32, same operations in another order


def run_original(script: str, inputs: dict, tmp_path: Path) -> dict:
    """Run ``script`` with the original EdgeTAM first on sys.path; it reads ``inputs`` (a dict of tensors and
    numbers) as ``IN`` and leaves its results in the dict ``OUT``."""
    if not (ORIGINAL / "sam2" / "modeling" / "perceiver.py").is_file():
        pytest.fail(f"the original EdgeTAM code is not at {ORIGINAL}; run scripts/setup.sh")
    src, dst = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(inputs, src)
    body = textwrap.dedent(script)
    code = (
        f"import sys; sys.path.insert(0, {str(ORIGINAL)!r})\n"
        f"import torch\ntorch.set_num_threads(1)\nIN = torch.load({str(src)!r})\nOUT = {{}}\n"
        f"{body}\ntorch.save(OUT, {str(dst)!r})\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(dst)


PERTURB = """
def perturb(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return module.eval()
"""

PERCEIVER = (
    PERTURB
    + """
from sam2.modeling.perceiver import PerceiverResampler
from sam2.modeling.position_encoding import PositionEmbeddingSine
import sam2.modeling.perceiver as perceiver_module
torch.manual_seed(IN["seed"])
m = perturb(PerceiverResampler(
    dim=IN["dim"], depth=IN["depth"], dim_head=IN["dim_head"], heads=1, num_latents=IN["latents"],
    num_latents_2d=IN["latents_2d"], ff_mult=4, hidden_dropout_p=0.0, attention_dropout_p=0.0,
    pos_enc_at_key_value=True, concat_kv_latents=False, use_self_attn=True,
    position_encoding=PositionEmbeddingSine(num_pos_feats=IN["dim"], normalize=True, temperature=10000),
), IN["seed"] + 1)
pe = PositionEmbeddingSine(num_pos_feats=IN["dim"], normalize=True, temperature=10000)
x = IN["x"]
pos = pe(x)
OUT["state"] = m.state_dict()
with torch.no_grad():
    try:
        m(x, pos)
        OUT["unpatched"] = "ran"
    except RuntimeError as e:
        OUT["unpatched"] = str(e).splitlines()[0]
    # the one-word fix of forward_2d (``.view`` -> ``.reshape`` on the expanded latents)
    import inspect, textwrap as tw
    src = tw.dedent(inspect.getsource(perceiver_module.PerceiverResampler.forward_2d))
    fixed = src.replace("expand(B, -1, -1).view(-1, 1, C)", "expand(B, -1, -1).reshape(-1, 1, C)")
    assert fixed != src
    ns = {}
    exec(fixed, perceiver_module.__dict__, ns)
    perceiver_module.PerceiverResampler.forward_2d = ns["forward_2d"]
    OUT["latents"], OUT["pos"] = m(x, pos)
"""
)


def _perturbed_inputs(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 100))


@pytest.mark.parametrize(
    ("vcfg", "side", "seed"),
    [(VIDEO_EDGETAM_TEST, 16, 0), (VIDEO_EDGETAM_TEST, 16, 1), (VIDEO_EDGETAM, 64, 2)],
    ids=["reduced-seed0", "reduced-seed1", "edgetam-64x64"],
)
@pytest.mark.parametrize("rw", [UPSTREAM, Rewrites()], ids=["upstream-ops", "export-forms"])
def test_perceiver_matches_original(vcfg: Sam2VideoConfig, side: int, seed: int, rw: Rewrites, tmp_path):
    """Three objects' memories at once: latents and their position encoding == the original (fixed) perceiver;
    the unpatched original refuses a batch of three."""
    m = vcfg.mem_dim
    x = _perturbed_inputs((3, m, side, side), seed)
    args = dict(
        seed=seed,
        dim=m,
        depth=vcfg.perceiver_layers,
        dim_head=vcfg.perceiver_dim_head,
        latents=vcfg.perceiver_latents,
        latents_2d=vcfg.perceiver_latents_2d,
        x=x,
    )
    ref = run_original(PERCEIVER, args, tmp_path)
    assert "view size is not compatible" in ref["unpatched"], ref["unpatched"]
    ours = PerceiverResampler(
        m,
        side,
        vcfg.perceiver_layers,
        vcfg.perceiver_latents,
        vcfg.perceiver_latents_2d,
        vcfg.perceiver_dim_head,
        vcfg.perceiver_heads,
        vcfg.perceiver_ff_mult,
        vcfg.perceiver_self_attn,
        rw,
    ).eval()
    ours.load_state_dict(ref["state"], strict=True)
    with torch.no_grad():
        got = ours(x)
        one = ours(x[1:2])  # one object alone == its row of the batch
    assert got.shape == ref["latents"].shape == (3, vcfg.memory_tokens, m)
    assert (got - ref["latents"]).abs().max().item() < MAX_ABS
    assert torch.allclose(one, got[1:2], atol=1e-6, rtol=0)
    assert torch.allclose(ours.out_pos.expand(3, -1, -1), ref["pos"], atol=1e-6, rtol=0)
    assert ref["latents"].std().item() > 0.1  # not a degenerate output


MEMORY_ATTENTION = (
    PERTURB
    + """
from sam2.modeling.memory_attention import MemoryAttention, MemoryAttentionLayer
from sam2.modeling.sam.transformer import RoPEAttention, RoPEAttentionv2
torch.manual_seed(IN["seed"])
d, e, g = IN["d"], IN["e"], IN["g"]
layer = MemoryAttentionLayer(
    activation="relu",
    cross_attention=RoPEAttentionv2(rope_theta=10000.0, q_sizes=[e, e], k_sizes=[g, g], embedding_dim=d,
                                    num_heads=1, downsample_rate=1, dropout=0.1, kv_in_dim=IN["m"]),
    d_model=d, dim_feedforward=IN["mlp"], dropout=0.1, pos_enc_at_attn=False,
    self_attention=RoPEAttention(rope_theta=10000.0, feat_sizes=[32, 32], embedding_dim=d, num_heads=1,
                                 downsample_rate=1, dropout=0.1),
    pos_enc_at_cross_attn_keys=True, pos_enc_at_cross_attn_queries=False,
)
m = perturb(MemoryAttention(d_model=d, pos_enc_at_input=True, layer=layer, num_layers=IN["layers"]), IN["seed"] + 1)
OUT["state"] = m.state_dict()
with torch.no_grad():
    OUT["out"] = m(curr=IN["curr"].transpose(0, 1), memory=IN["memory"].transpose(0, 1),
                   curr_pos=IN["curr_pos"].transpose(0, 1), memory_pos=IN["memory_pos"].transpose(0, 1),
                   num_obj_ptr_tokens=IN["ptr_tokens"], num_spatial_mem=IN["slots"]).transpose(0, 1)
"""
)


@pytest.mark.parametrize(
    ("vcfg", "d", "e", "slots", "seed"),
    [(VIDEO_EDGETAM_TEST, 32, 16, 3, 0), (VIDEO_EDGETAM_TEST, 32, 16, 7, 1), (VIDEO_EDGETAM, 256, 64, 2, 2)],
    ids=["reduced-3slots", "reduced-7slots", "edgetam-2slots"],
)
@pytest.mark.parametrize("rw", [UPSTREAM, Rewrites()], ids=["upstream-ops", "export-forms"])
def test_memory_attention_matches_original(vcfg, d, e, slots, seed, rw, tmp_path):
    """2 layers, self RoPE over the e x e frame, cross RoPEAttentionv2 over ``slots`` perceiver frames (global
    latents unrotated, 2-D latents on the G x G grid) + pointer tokens (unrotated); two objects at once."""
    cfg = dataclasses.replace(TEST_SMALL, d_model=d, image_size=16 * e)
    g = torch.Generator().manual_seed(seed + 200)
    n_tok, ptr_tokens, m = vcfg.memory_tokens, 3 * (d // vcfg.mem_dim), vcfg.mem_dim
    nk = slots * n_tok + ptr_tokens
    inputs = dict(
        seed=seed,
        d=d,
        e=e,
        g=vcfg.cross_rope_k_grid,
        m=m,
        mlp=vcfg.attn_mlp_dim,
        layers=vcfg.attn_layers,
        slots=slots,
        ptr_tokens=ptr_tokens,
        curr=torch.randn(2, e * e, d, generator=g),
        curr_pos=torch.randn(2, e * e, d, generator=g),
        memory=torch.randn(2, nk, m, generator=g),
        memory_pos=torch.randn(2, nk, m, generator=g),
    )
    ref = run_original(MEMORY_ATTENTION, inputs, tmp_path)
    ours = MemoryAttention(cfg, vcfg, rw).eval()
    ours.load_state_dict(ref["state"], strict=True)
    with torch.no_grad():
        args = (inputs["curr"], inputs["curr_pos"], inputs["memory"], inputs["memory_pos"])
        got = ours(*args, slots, torch.zeros(2, nk))
    assert got.shape == ref["out"].shape == (2, e * e, d)
    assert (got - ref["out"]).abs().max().item() < MAX_ABS * 5
