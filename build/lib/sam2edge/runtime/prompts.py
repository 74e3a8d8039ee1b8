"""Host-side prompt encoding in numpy alone: the code an app ports next to a token-input decoder.

Tables (all float32, written by ``prompt_tables`` and exported as raw little-endian .bin files):
  gaussian      (2, C/2)  positional_encoding_gaussian_matrix
  point_embed   (4, C)    label 0 (bg), 1 (fg), 2 (box top-left), 3 (box bottom-right)
  not_a_point   (C,)      the padding token (label -1)
  no_mask       (C,)      dense embedding when there is no mask input (broadcast over e x e)

Token of a point (X, Y) in model-input pixels with label l:
  c = 2 * ((X, Y) + 0.5) / image_size - 1;  t = [sin(2 pi c G), cos(2 pi c G)] + point_embed[l]
A label -1 token is not_a_point alone. Label -2 marks an ignored slot (valid = 0).
"""

from __future__ import annotations

import numpy as np

IGNORED = -2  # label of an unused slot in a fixed-size prompt input


def prompt_tables(model) -> dict[str, np.ndarray]:
    """Extract the host tables from a sam2edge model (float32 numpy)."""
    pe = model.sam_prompt_encoder
    return {
        "gaussian": pe.pe_layer.positional_encoding_gaussian_matrix.detach().float().numpy().copy(),
        "point_embed": pe.label_embed.detach().float().numpy().copy(),
        "not_a_point": pe.not_a_point_embed.weight.detach().float().numpy()[0].copy(),
        "no_mask": pe.no_mask_embed.weight.detach().float().numpy()[0].copy(),
    }


def encode_points(
    coords: np.ndarray,
    labels: np.ndarray,
    tables: dict[str, np.ndarray],
    image_size: int,
    num_tokens: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """coords Nx2 (X, Y) model-input pixels, labels N in {-1,0,1,2,3} -> (tokens 1xKxC, valid 1xK).

    With num_tokens K >= N, slots N..K-1 are ignored slots (zero tokens, valid 0).
    """
    coords = np.asarray(coords, np.float32).reshape(-1, 2)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    n = len(labels)
    k = n if num_tokens is None else num_tokens
    if n > k:
        raise ValueError(f"{n} prompt tokens do not fit the decoder's {k} slots; use at most {k - 1} points with a box")
    c = 2.0 * ((coords + np.float32(0.5)) / np.float32(image_size)) - 1.0
    proj = (2.0 * np.pi * (c @ tables["gaussian"])).astype(np.float32)  # (N, C/2)
    pe = np.concatenate([np.sin(proj), np.cos(proj)], axis=-1).astype(np.float32)  # (N, C)
    tokens = np.zeros((k, pe.shape[1]), np.float32)
    for i, lab in enumerate(labels):
        tokens[i] = tables["not_a_point"] if lab == -1 else pe[i] + tables["point_embed"][lab]
    valid = np.zeros((k,), np.float32)
    valid[:n] = 1.0
    return tokens[None], valid[None]


def no_mask_dense(tables: dict[str, np.ndarray], embed_size: int) -> np.ndarray:
    """The dense prompt for 'no mask input': 1xCxexe."""
    c = tables["no_mask"].shape[0]
    return np.broadcast_to(tables["no_mask"].reshape(1, c, 1, 1), (1, c, embed_size, embed_size)).astype(np.float32)


def prompt_layout(
    box: np.ndarray | None,
    points: np.ndarray | None,
    labels: np.ndarray | None,
    wh: np.ndarray,
    size: float,
) -> tuple[np.ndarray, np.ndarray]:
    """THE prompt layout of every backend, exporter and check (upstream's): box corners (labels 2, 3), then
    points (1 object, 0 background), then ONE pad point (label -1 at 0, 0).

    box (4,) X0,Y0,X1,Y1 and points Nx2 (X, Y) in original pixels, labels N; ``wh`` = (W, H) of the
    original image (ones when already normalised); ``size`` = model input side S. Coordinates go to model
    input pixels as upstream does, in float32: (xy / wh) * S. -> coords 1xMx2 float32, labels 1xM float32
    (M = 0 when there is neither box nor point).
    """
    wh, size = np.asarray(wh, np.float32), np.float32(size)
    coords, labs = [], []
    if box is not None:
        coords.append((np.asarray(box, np.float32).reshape(2, 2) / wh) * size)
        labs.append(np.array([2, 3], np.float32))
    if points is not None:
        coords.append((np.asarray(points, np.float32).reshape(-1, 2) / wh) * size)
        labs.append(np.asarray(labels, np.float32).reshape(-1))
    if not coords:
        return np.zeros((1, 0, 2), np.float32), np.zeros((1, 0), np.float32)
    coords.append(np.zeros((1, 2), np.float32))
    labs.append(np.array([-1], np.float32))
    return np.concatenate(coords)[None], np.concatenate(labs)[None]
