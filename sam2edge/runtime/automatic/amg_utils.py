"""Building blocks of automatic mask generation, with upstream ``sam2.utils.amg``'s meanings.

Frames: point grids are normalised [0, 1] (X, Y); crop boxes and mask boxes are XYXY integer pixels of
the original image (a mask box's X1/Y1 is the last covered pixel, as upstream); RLEs are uncompressed
column-major (``{"size": [H, W], "counts": [...]}``, first count = leading zeros), as pycocotools reads.

``batched_nms`` is the one hand-written piece (torchvision cannot be installed beside the CPU torch):
greedy NMS per category in decreasing score order (stable for ties), suppressing a box whose IoU with a
kept one is strictly above the threshold, returning kept indices by decreasing score, as torchvision.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import product

import numpy as np
import torch
from scipy import ndimage

EIGHT_CONNECTED = np.ones((3, 3), bool)  # OpenCV's / upstream's connectivity 8


# ---- point grids and crops -----------------------------------------------------------------------
def build_point_grid(n_per_side: int) -> np.ndarray:
    """n^2 x 2 points (X, Y) evenly spaced in [0, 1], cell centres, row-major (X fastest)."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))  # (n, n)
    ys = np.tile(side[:, None], (1, n_per_side))  # (n, n)
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)  # (n*n, 2)


def build_all_layer_point_grids(n_per_side: int, n_layers: int, scale_per_layer: int) -> list[np.ndarray]:
    """One grid per crop layer; layer i has int(n_per_side / scale_per_layer**i) points per side."""
    return [build_point_grid(int(n_per_side / (scale_per_layer**i))) for i in range(n_layers + 1)]


def generate_crop_boxes(im_size: tuple[int, int], n_layers: int, overlap_ratio: float) -> tuple[list, list]:
    """(crop boxes XYXY, layer index of each): the whole image, then (2^(i+1))^2 overlapping crops per layer i."""
    im_h, im_w = im_size
    short_side = min(im_h, im_w)
    boxes, layers = [[0, 0, im_w, im_h]], [0]

    def crop_len(orig_len: int, n_crops: int, overlap: int) -> int:
        return int(math.ceil((overlap * (n_crops - 1) + orig_len) / n_crops))

    for i_layer in range(n_layers):
        n_side = 2 ** (i_layer + 1)
        overlap = int(overlap_ratio * short_side * (2 / n_side))
        crop_w, crop_h = crop_len(im_w, n_side, overlap), crop_len(im_h, n_side, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_side)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_side)]
        for x0, y0 in product(x0s, y0s):
            boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
            layers.append(i_layer + 1)
    return boxes, layers


def batch_iterator(batch_size: int, *arrays) -> Iterator[list]:
    """Slices of ``batch_size`` rows of each array (the last one shorter)."""
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("batched iteration needs arrays of one length")
    for b in range(0, n, batch_size):
        yield [a[b : b + batch_size] for a in arrays]


def uncrop_boxes_xyxy(boxes: torch.Tensor, crop_box: list[int]) -> torch.Tensor:
    x0, y0 = crop_box[:2]
    return boxes + torch.tensor([[x0, y0, x0, y0]], device=boxes.device)


def uncrop_points(points: torch.Tensor, crop_box: list[int]) -> torch.Tensor:
    x0, y0 = crop_box[:2]
    return points + torch.tensor([[x0, y0]], device=points.device)


def uncrop_masks(masks: torch.Tensor, crop_box: list[int], orig_h: int, orig_w: int) -> torch.Tensor:
    """NxhxW crop masks -> NxHxW image masks (zero outside the crop)."""
    x0, y0, x1, y1 = crop_box
    if (x0, y0, x1, y1) == (0, 0, orig_w, orig_h):
        return masks
    pad_x, pad_y = orig_w - (x1 - x0), orig_h - (y1 - y0)
    return torch.nn.functional.pad(masks, (x0, pad_x - x0, y0, pad_y - y0), value=0)


def is_box_near_crop_edge(boxes: torch.Tensor, crop_box: list[int], orig_box: list[int], atol: float = 20.0):
    """N bool: the box (crop frame) touches a crop edge that is not an image edge."""
    crop_t = torch.as_tensor(crop_box, dtype=torch.float)
    orig_t = torch.as_tensor(orig_box, dtype=torch.float)
    boxes = uncrop_boxes_xyxy(boxes, crop_box).float()
    near_crop = torch.isclose(boxes, crop_t[None, :], atol=atol, rtol=0)
    near_image = torch.isclose(boxes, orig_t[None, :], atol=atol, rtol=0)
    return torch.any(near_crop & ~near_image, dim=1)


def box_xyxy_to_xywh(box: np.ndarray | torch.Tensor) -> list[float]:
    x0, y0, x1, y1 = (float(v) for v in box)
    return [x0, y0, x1 - x0, y1 - y0]


# ---- mask statistics -----------------------------------------------------------------------------
def calculate_stability_score(masks: torch.Tensor, mask_threshold: float, offset: float) -> torch.Tensor:
    """...xHxW logits -> IoU of (logits > t + offset) and (logits > t - offset), as float32."""
    inter = (masks > (mask_threshold + offset)).sum((-1, -2), dtype=torch.int32)
    union = (masks > (mask_threshold - offset)).sum((-1, -2), dtype=torch.int32)
    return inter / union


def batched_mask_to_box(masks: torch.Tensor) -> torch.Tensor:
    """NxHxW bool -> Nx4 XYXY (inclusive last pixel), [0, 0, 0, 0] for an empty mask."""
    n, h, w = masks.shape
    if n == 0:
        return torch.zeros(0, 4, dtype=torch.long)
    rows, cols = masks.any(dim=-1), masks.any(dim=-2)  # (N, H), (N, W)
    ys, xs = torch.arange(h), torch.arange(w)
    bottom = torch.where(rows, ys, -1).amax(-1)
    top = torch.where(rows, ys, h).amin(-1)
    right = torch.where(cols, xs, -1).amax(-1)
    left = torch.where(cols, xs, w).amin(-1)
    out = torch.stack([left, top, right, bottom], dim=-1)  # (N, 4)
    empty = ~rows.any(-1)
    return torch.where(empty[:, None], torch.zeros_like(out), out)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Nx4, Mx4 XYXY -> NxM IoU (areas without +1, as torchvision)."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])  # (N, M, 2)
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])  # (N, M, 2)
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (box_area(a)[:, None] + box_area(b)[None, :] - inter)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS within each category ``idxs``; -> kept indices (int64) by decreasing score."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.sort(scores, descending=True, stable=True).indices
    # (N, N) in score order, float64: a float32 IoU compared with a Python threshold rounds the threshold to
    # float32 (0.9999999999999999 -> 1.0 kept two identical boxes; torchvision compares against a double)
    iou = box_iou(boxes[order].double(), boxes[order].double())
    same = idxs[order][:, None] == idxs[order][None, :]
    suppresses = (iou > iou_threshold) & same
    alive = torch.ones(len(order), dtype=torch.bool)
    for i in range(len(order)):
        if alive[i]:
            alive[i + 1 :] &= ~suppresses[i, i + 1 :]
    return order[alive]


# ---- run-length encoding -------------------------------------------------------------------------
def mask_to_rle(masks: torch.Tensor) -> list[dict]:
    """NxHxW bool -> uncompressed column-major RLEs (counts alternate 0-runs and 1-runs)."""
    n, h, w = masks.shape
    flat = masks.permute(0, 2, 1).flatten(1)  # (N, W*H) column-major
    change = (flat[:, 1:] ^ flat[:, :-1]).nonzero()  # (K, 2) [row, position]
    out = []
    for i in range(n):
        idx = change[change[:, 0] == i, 1] + 1
        bounds = torch.cat([torch.tensor([0]), idx, torch.tensor([h * w])])
        counts = [] if not bool(flat[i, 0]) else [0]
        counts.extend((bounds[1:] - bounds[:-1]).tolist())
        out.append({"size": [h, w], "counts": counts})
    return out


def rle_to_mask(rle: dict) -> np.ndarray:
    """Uncompressed RLE -> HxW bool."""
    h, w = rle["size"]
    counts = np.asarray(rle["counts"], np.int64)
    values = np.arange(len(counts)) % 2 == 1  # runs alternate 0, 1, 0, ...
    return np.repeat(values, counts).reshape(w, h).T


def area_from_rle(rle: dict) -> int:
    return int(sum(rle["counts"][1::2]))


def coco_encode_rle(rle: dict) -> dict:
    """Uncompressed RLE -> COCO compressed RLE with a JSON-ready str ``counts`` (pycocotools)."""
    from pycocotools import mask as mask_utils

    h, w = rle["size"]
    out = mask_utils.frPyObjects(rle, h, w)
    out["counts"] = out["counts"].decode("utf-8")
    return out


# ---- small regions -------------------------------------------------------------------------------
def component_areas(mask: np.ndarray) -> np.ndarray:
    """HxW bool -> HxW int64: the 8-connected component area at each True pixel, 0 elsewhere."""
    labels, n = ndimage.label(mask, structure=EIGHT_CONNECTED)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    sizes[0] = 0
    return sizes[labels]


def fill_holes_and_sprinkles(
    logits: torch.Tensor, max_hole_area: int, max_sprinkle_area: int, threshold: float = 0.0
) -> torch.Tensor:
    """...xHxW logits: background components of area <= max_hole_area set to threshold + 10, then
    foreground components of area <= max_sprinkle_area set to threshold - 10 (upstream's
    ``SAM2Transforms.postprocess_masks``, both passes labelling the input; its CUDA kernel is replaced by
    scipy's 8-connected labelling)."""
    out = logits.clone()
    flat = out.reshape(-1, *out.shape[-2:])  # (N, H, W) view
    for i in range(flat.shape[0]):
        m = flat[i].numpy()
        fg = m > threshold  # both passes label the input logits, as upstream
        if max_hole_area > 0:
            area = component_areas(~fg)
            m[(area > 0) & (area <= max_hole_area)] = threshold + 10.0
        if max_sprinkle_area > 0:
            area = component_areas(fg)
            m[(area > 0) & (area <= max_sprinkle_area)] = threshold - 10.0
    return out
