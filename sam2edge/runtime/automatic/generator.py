"""``Sam2AutomaticMaskGenerator``: upstream's "segment everything" over any ``Sam2Predictor``.

A grid of single-point prompts (``points_per_side``^2 per crop) is decoded ``points_per_batch`` at a
time (one batched decoder call where the backend has one), then filtered exactly as upstream's
``SAM2AutomaticMaskGenerator``: predicted IoU, stability score, masks touching a crop edge, box NMS
per crop, then NMS between crops. Records have upstream's keys and frames: ``segmentation`` (HxW bool,
or an RLE), ``area`` (pixels), ``bbox`` XYWH, ``predicted_iou``, ``point_coords`` [[X, Y]] image
pixels, ``stability_score``, ``crop_box`` XYWH.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sam2edge.errors import UserError
from sam2edge.runtime.automatic import amg_utils as amg
from sam2edge.runtime.backends import Features
from sam2edge.runtime.predictor import Sam2Predictor
from sam2edge.runtime.preprocess import to_rgb_array
from sam2edge.validate import check_amg_options

UPSCALE_CHUNK = 16  # candidates upscaled to image size at once (bounds memory on large photos)

# output_mode -> uncompressed RLE to the record's "segmentation"
OUTPUT_MODES: dict[str, Callable[[dict], object]] = {
    "binary_mask": amg.rle_to_mask,
    "uncompressed_rle": lambda rle: rle,
    "coco_rle": amg.coco_encode_rle,
}


class MaskData:
    """Columns of per-mask data (torch tensors or lists) filtered and concatenated together."""

    def __init__(self, **cols) -> None:
        self.cols: dict[str, torch.Tensor | list] = dict(cols)

    def __getitem__(self, key: str):
        return self.cols[key]

    def __setitem__(self, key: str, value) -> None:
        self.cols[key] = value

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def filter(self, keep: torch.Tensor) -> None:
        """Keep rows by a bool mask or an index tensor (in that index order)."""
        idx = keep.nonzero().flatten() if keep.dtype == torch.bool else keep
        for k, v in self.cols.items():
            self.cols[k] = [v[i] for i in idx.tolist()] if isinstance(v, list) else v[idx]

    def cat(self, other: MaskData) -> None:
        for k, v in other.cols.items():
            if k not in self.cols:
                self.cols[k] = v
            else:
                self.cols[k] = self.cols[k] + v if isinstance(v, list) else torch.cat([self.cols[k], v])


class Sam2AutomaticMaskGenerator:
    """Upstream ``SAM2AutomaticMaskGenerator``'s parameters and results, over a ``Sam2Predictor``.

    ``points_per_side`` n puts an n x n grid of single-click prompts on the image (or each crop), decoded
    ``points_per_batch`` at a time; ``point_grids``: explicit (M, 2) grids in [0, 1] x [0, 1] crop coordinates.

    ``min_mask_region_area`` > 0 fills background holes and removes foreground islands of at most that
    many low-res pixels before upscaling, as upstream's predictor does with ``max_hole_area`` and
    ``max_sprinkle_area`` (connected components by scipy instead of upstream's CUDA kernel).
    """

    def __init__(
        self,
        predictor: Sam2Predictor,
        points_per_side: int | None = 32,
        points_per_batch: int = 64,
        pred_iou_thresh: float = 0.8,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        mask_threshold: float = 0.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
        use_m2m: bool = False,
        multimask_output: bool = True,
        progress: bool = False,
    ) -> None:
        if (points_per_side is None) == (point_grids is None):
            raise UserError("give exactly one of points_per_side or point_grids")
        if output_mode not in OUTPUT_MODES:
            raise UserError(f"output_mode {output_mode!r} is unknown; use one of {sorted(OUTPUT_MODES)}")
        check_amg_options(
            dict(
                points_per_side=points_per_side,
                points_per_batch=points_per_batch,
                pred_iou_thresh=pred_iou_thresh,
                stability_score_thresh=stability_score_thresh,
                stability_score_offset=stability_score_offset,
                mask_threshold=mask_threshold,
                box_nms_thresh=box_nms_thresh,
                crop_n_layers=crop_n_layers,
                crop_nms_thresh=crop_nms_thresh,
                crop_overlap_ratio=crop_overlap_ratio,
                crop_n_points_downscale_factor=crop_n_points_downscale_factor,
                min_mask_region_area=min_mask_region_area,
            )
        )
        if point_grids is not None and len(point_grids) < crop_n_layers + 1:
            raise UserError(f"point_grids needs one grid per crop layer ({crop_n_layers + 1}), got {len(point_grids)}")
        self.point_grids = (
            amg.build_all_layer_point_grids(points_per_side, crop_n_layers, crop_n_points_downscale_factor)
            if points_per_side is not None
            else [np.asarray(g, np.float64) for g in point_grids]
        )
        self.predictor = predictor
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh, self.stability_score_thresh = pred_iou_thresh, stability_score_thresh
        self.stability_score_offset, self.mask_threshold = stability_score_offset, mask_threshold
        self.box_nms_thresh, self.crop_nms_thresh = box_nms_thresh, crop_nms_thresh
        self.crop_n_layers, self.crop_overlap_ratio = crop_n_layers, crop_overlap_ratio
        self.min_mask_region_area, self.output_mode = min_mask_region_area, output_mode
        self.use_m2m, self.multimask_output, self.progress = use_m2m, multimask_output, progress

    # ---- public ------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, image, features: Features | None = None) -> list[dict]:
        """(H, W, 3) uint8 RGB array (or a PIL image) -> one dict per mask with upstream's keys: ``segmentation``
        ((H, W) bool, or an RLE dict per ``output_mode``), ``area`` (pixels), ``bbox`` [x, y, w, h] pixels from the
        top-left corner, ``predicted_iou``, ``point_coords`` [[x, y]] pixels, ``stability_score``, ``crop_box``
        [x, y, w, h]. See the module docstring.
        ``features``: the whole image's decoder-ready features, if already encoded (the uncropped layer then
        skips the encoder; crops are encoded as always)."""
        image = to_rgb_array(image)
        data = self._generate_masks(image, features)
        encode = OUTPUT_MODES[self.output_mode]
        return [
            {
                "segmentation": encode(rle),
                "area": amg.area_from_rle(rle),
                "bbox": amg.box_xyxy_to_xywh(data["boxes"][i]),
                "predicted_iou": float(data["iou_preds"][i]),
                "point_coords": [[float(v) for v in data["points"][i]]],
                "stability_score": float(data["stability_score"][i]),
                "crop_box": amg.box_xyxy_to_xywh(data["crop_boxes"][i]),
            }
            for i, rle in enumerate(data.cols.get("rles", []))
        ]

    def num_batches(self, image_hw: tuple[int, int]) -> int:
        """Decoder batches ``generate`` runs on an image of this size (for a progress display)."""
        _, layers = amg.generate_crop_boxes(image_hw, self.crop_n_layers, self.crop_overlap_ratio)
        return sum(-(-len(self.point_grids[i]) // self.points_per_batch) for i in layers)

    # ---- stages ------------------------------------------------------------------------------------
    def _generate_masks(self, image: np.ndarray, features: Features | None = None) -> MaskData:
        orig_size = image.shape[:2]
        crop_boxes, layer_idxs = amg.generate_crop_boxes(orig_size, self.crop_n_layers, self.crop_overlap_ratio)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.num_batches(orig_size), desc="decoder batches", unit="batch")
        data = MaskData()
        try:
            for crop_box, layer_idx in zip(crop_boxes, layer_idxs):
                whole = features if layer_idx == 0 else None  # layer 0 is the whole image
                data.cat(self._process_crop(image, crop_box, layer_idx, orig_size, bar, whole))
        finally:
            if bar is not None:
                bar.close()
        if len(crop_boxes) > 1 and len(data):
            scores = 1 / amg.box_area(data["crop_boxes"])  # prefer masks from smaller crops
            keep = amg.batched_nms(
                data["boxes"].float(), scores, torch.zeros(len(data)), iou_threshold=self.crop_nms_thresh
            )
            data.filter(keep)
        return data

    def _process_crop(self, image, crop_box, layer_idx, orig_size, bar, features=None) -> MaskData:
        x0, y0, x1, y1 = crop_box
        cropped = np.ascontiguousarray(image[y0:y1, x0:x1, :])
        crop_hw = cropped.shape[:2]
        if features is None:
            self.predictor.set_image(cropped)
        else:
            self.predictor.set_image_embedding(features, crop_hw)
        points = self.point_grids[layer_idx] * np.array(crop_hw)[None, ::-1]  # (P, 2) crop pixels
        data = MaskData()
        for (batch,) in amg.batch_iterator(self.points_per_batch, points):
            data.cat(self._process_batch(batch, crop_hw, crop_box, orig_size))
            if bar is not None:
                bar.update(1)
        self.predictor.reset_predictor()
        if len(data):
            keep = amg.batched_nms(
                data["boxes"].float(), data["iou_preds"], torch.zeros(len(data)), iou_threshold=self.box_nms_thresh
            )
            data.filter(keep)
            data["boxes"] = amg.uncrop_boxes_xyxy(data["boxes"], crop_box)
            data["points"] = amg.uncrop_points(data["points"], crop_box)
        data["crop_boxes"] = torch.tensor([crop_box] * len(data), dtype=torch.long).reshape(-1, 4)
        return data

    def _process_batch(self, points: np.ndarray, crop_hw, crop_box, orig_size) -> MaskData:
        """One decoder batch of grid points (crop pixels) -> the masks it keeps, as RLEs in the image frame."""
        pts = torch.as_tensor(points, dtype=torch.float32)  # (B, 2) crop pixels
        ones = np.ones((len(pts), 1), np.float32)
        low, iou = self.predictor.decode_batch_low_res(pts.numpy()[:, None, :], ones, self.multimask_output)
        data = MaskData(
            iou_preds=iou.flatten(0, 1),  # (B*C,)
            points=pts.repeat_interleave(low.shape[1], dim=0),  # (B*C, 2)
            low_res_masks=low.flatten(0, 1),  # (B*C, 4e, 4e)
        )
        if self.use_m2m:
            data["masks"], data["iou_preds"] = self._refine_with_m2m(data["points"], data["low_res_masks"])
        if self.pred_iou_thresh > 0.0:
            data.filter(data["iou_preds"] > self.pred_iou_thresh)
        # upscale only what the IoU filter kept (upstream upscales all: same result), a chunk at a time so
        # that image-size logits of a whole batch never sit in memory at once (per-mask steps: same result)
        out = MaskData()
        for start in range(0, len(data), UPSCALE_CHUNK):
            chunk = MaskData(**{k: v[start : start + UPSCALE_CHUNK] for k, v in data.cols.items()})
            out.cat(self._filter_and_encode(chunk, crop_box, orig_size))
        return out

    def _filter_and_encode(self, data: MaskData, crop_box, orig_size) -> MaskData:
        """Stability filter, boxes, crop-edge filter and RLE of candidates (low-res logits, or masks after m2m)."""
        orig_h, orig_w = orig_size
        if "masks" not in data.cols:
            area = self.min_mask_region_area
            data["masks"] = self.predictor.upscale_logits(data["low_res_masks"][:, None], area, area)[:, 0]
        data["stability_score"] = amg.calculate_stability_score(
            data["masks"], self.mask_threshold, self.stability_score_offset
        )
        if self.stability_score_thresh > 0.0:
            data.filter(data["stability_score"] >= self.stability_score_thresh)
        binary = data["masks"] > self.mask_threshold
        data["boxes"] = amg.batched_mask_to_box(binary)
        keep = ~amg.is_box_near_crop_edge(data["boxes"], crop_box, [0, 0, orig_w, orig_h])
        if not torch.all(keep):
            data.filter(keep)
            binary = binary[keep]
        data["rles"] = amg.mask_to_rle(amg.uncrop_masks(binary, crop_box, orig_h, orig_w))
        del data.cols["masks"], data.cols["low_res_masks"]
        return data

    def _refine_with_m2m(self, points: torch.Tensor, low_res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One more decode per candidate with its own low-res mask as the mask prompt (single-mask answer)."""
        masks, ious = [], []
        for p, low in zip(points.numpy(), torch.clamp(low_res, -32.0, 32.0).numpy()):
            m, s, _ = self.predictor.predict(
                p[None], np.ones(1), mask_input=low[None], multimask_output=False, return_logits=True
            )
            masks.append(torch.from_numpy(m))
            ious.append(torch.from_numpy(s))
        return torch.cat(masks), torch.cat(ious)
