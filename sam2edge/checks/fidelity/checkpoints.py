"""Random checkpoints for precision robustness: other seeds, and a range stress that keeps the function.

``variant_state_dict("synthetic:SEED[:rangeF]", cfg)``:
* ``synthetic:SEED``: ``synthetic_state_dict(cfg, SEED)`` (seeded default init + 0.02 * randn);
* ``synthetic:SEED:rangeF``: the same weights reparametrised so that the encoder's residual stream
  carries F times larger values while every output stays the same function in exact arithmetic
  (``range_stress``). This stresses value ranges (LayerNorm statistics, residual adds) without making
  the model chaotic: multiplying *every* weight by 4 instead makes the fp32 model itself ill-conditioned
  (fp32 with the export rewrites vs fp32 with upstream's operations: worst mask IoU 0.0006 at
  test-small, seed 0), so no reduced-precision export could be judged on it;
* ``synthetic:SEED:xF``: every tensor times F (that ill-conditioned checkpoint; it overflowed the decoder's
  LayerNorm in fp16 before ``Rewrites.layer_norm="scaled"``: a localization demo, not a fidelity test).
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from sam2edge.config import HIERA_TINY, TEST_SMALL, Sam2Config
from sam2edge.errors import UserError
from sam2edge.weights import synthetic_state_dict

# test-small's encoder with the decoder of every SAM 2.1 size (d_model 256, 8 heads, MLP 2048): the cheapest
# config where the fp16 decoder's gradual precision loss shows (measured: median mask IoU 0.9985 < 0.999 for
# synthetic:3 with an fp16 decoder; test-small's 32-wide decoder loses less and passed on every seed tried)
TEST_SMALL_WIDE_DECODER = replace(
    TEST_SMALL,
    d_model=HIERA_TINY.d_model,
    decoder_heads=HIERA_TINY.decoder_heads,
    decoder_mlp_dim=HIERA_TINY.decoder_mlp_dim,
    iou_head_hidden_dim=HIERA_TINY.iou_head_hidden_dim,
    mask_in_chans=HIERA_TINY.mask_in_chans,
)
# configs only the precision checks use (``sam2edge diagnose --config``), not in ``config.CONFIGS``
PRECISION_CONFIGS: dict[str, Sam2Config] = {"test-small-wide-decoder": TEST_SMALL_WIDE_DECODER}

SPEC = re.compile(r"^synthetic:(\d+)(?::(range|x)(\d+(?:\.\d+)?))?$")
TRUNK = "image_encoder.trunk."
# parameters that write into the Hiera residual stream (scaled by F) ...
RESIDUAL_WRITERS = re.compile(
    r"^image_encoder\.trunk\.(patch_embed\.proj\.(weight|bias)|pos_embed|pos_embed_window"
    r"|blocks\.\d+\.(attn\.proj|mlp\.layers\.1|proj)\.(weight|bias))$"
)
# ... and the neck's lateral convs, which read it (weights scaled by 1/F, biases kept)
RESIDUAL_READERS = re.compile(r"^image_encoder\.neck\.convs\.\d+\.conv\.weight$")


def range_stress(sd: dict[str, torch.Tensor], factor: float) -> dict[str, torch.Tensor]:
    """Encoder residual stream x ``factor``, same function.

    Hiera is pre-LayerNorm: each block adds attn(LN(x)) and mlp(LN(x)) to x, and a stage change
    replaces the shortcut by proj(LN(x)). Scaling the patch embedding, the position embeddings and
    every layer that writes into the stream by F multiplies the stream by F and leaves every LN output
    unchanged (up to eps, 1e-6 against the variance); the FPN's 1x1 lateral convs read the stream, so
    their weights get 1/F and the encoder's outputs are unchanged.
    """
    out = {}
    for k, v in sd.items():
        if RESIDUAL_WRITERS.match(k):
            v = v * factor
        elif RESIDUAL_READERS.match(k):
            v = v / factor
        out[k] = v
    return out


def variant_state_dict(spec: str, cfg: Sam2Config) -> dict[str, torch.Tensor]:
    """State dict for ``synthetic:SEED``, ``synthetic:SEED:rangeF`` or ``synthetic:SEED:xF`` (see module doc)."""
    m = SPEC.match(spec)
    if not m:
        raise UserError(f"checkpoint spec {spec!r} is not synthetic:SEED[:rangeF|:xF]; e.g. synthetic:3:range4")
    sd = synthetic_state_dict(cfg, int(m.group(1)))
    if m.group(2) == "range":
        return range_stress(sd, float(m.group(3)))
    if m.group(2) == "x":
        return {k: v * float(m.group(3)) for k, v in sd.items()}
    return sd
