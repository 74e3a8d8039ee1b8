"""``Sam2Predictor``: upstream ``SAM2ImagePredictor``'s API on every backend.

Coordinate frames: ``point_coords`` Nx2 and ``box`` (4,) XYXY are in original-image pixels
(``normalize_coords=True``, the default) or already in [0, 1] x image_size model-input
pixels (``normalize_coords=False``), exactly as upstream. Returned masks are in
original-image pixels.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.runtime.backends import BACKENDS, Backend, EagerBackend, Features
from sam2edge.runtime.preprocess import preprocess, to_rgb_array

MASK_THRESHOLD = 0.0


class PredictorError(UserError):
    """Bad prompt or bundle; the message names the problem and the fix."""


class Sam2Predictor:
    def __init__(self, backend: Backend, provenance: dict | None = None) -> None:
        self.backend = backend
        self.cfg: Sam2Config = backend.cfg
        self.provenance = provenance or {}
        self.mask_threshold = MASK_THRESHOLD
        self.reset_predictor()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path_or_id: str | None = None, cfg: Sam2Config | None = None, quiet: bool = False):
        """Eager fp32 predictor from a Meta .pt / HF .safetensors path, a hub id, or None (synthetic).

        ``cfg`` None: the size (tiny, small, base-plus, large) is detected from the checkpoint's
        tensor shapes; the synthetic checkpoint is Hiera-Tiny.
        """
        from sam2edge.weights import SYNTHETIC, checkpoint_config, load_weights

        if cfg is None:
            cfg = get_config(checkpoint_config(path_or_id))
        sd, prov = load_weights(path_or_id, cfg)
        if prov["checkpoint"] == SYNTHETIC and not quiet:
            print(
                "WARNING: no checkpoint given; using the deterministic SYNTHETIC checkpoint. "
                "Masks are meaningless until real weights are given (--checkpoint sam2.1_hiera_tiny.pt).",
                file=sys.stderr,
            )
        return cls(EagerBackend.from_state_dict(sd, cfg), prov)

    @classmethod
    def from_export(cls, bundle: str | Path) -> Sam2Predictor:
        """Predictor over an exported bundle (its card.json names the target runtime)."""
        bundle = Path(bundle)
        card = bundle / "card.json"
        if not card.is_file():
            raise PredictorError(
                f"{bundle} is not an export bundle (no card.json); pass a folder written by `sam2edge export`"
            )
        try:
            meta = json.loads(card.read_text())
            target = meta["target"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise PredictorError(f"{card} is malformed (no 'target'); re-run `sam2edge export`") from None
        if target not in BACKENDS:
            raise PredictorError(f"bundle target {target!r} has no runtime here; known: {sorted(BACKENDS)}")
        return cls(BACKENDS[target].from_bundle(bundle), meta)

    # ---- upstream API -------------------------------------------------------------------
    def reset_predictor(self) -> None:
        self._features: Features | None = None
        self._orig_hw: tuple[int, int] | None = None
        self._is_image_set = False

    @torch.no_grad()
    def set_image(self, image: np.ndarray | Image.Image) -> None:
        """Embed an HxWx3 uint8 RGB array or any PIL image (EXIF orientation applied)."""
        self.reset_predictor()
        rgb = to_rgb_array(image)
        self._orig_hw = rgb.shape[:2]
        x = preprocess(rgb, self.cfg.image_size).numpy()
        self._features = self.backend.encode(x)
        self._is_image_set = True

    def get_image_embedding(self) -> torch.Tensor:
        self._require_image()
        return torch.from_numpy(self._features.image_embed)

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (masks CxHxW float32 0/1 (as upstream) or logits, iou_predictions C,
        low_res_masks Cx4ex4e logits clamped to +-32)."""
        self._require_image()
        coords, labels = self._prompt_points(point_coords, point_labels, box, normalize_coords)
        mask = self._mask_input(mask_input)
        out = self.backend.decode(self._features, coords, labels, mask)
        low, iou = (out.masks, out.iou) if multimask_output else (out.single_mask, out.single_iou)
        low_t = torch.from_numpy(np.ascontiguousarray(low, dtype=np.float32))
        masks = F.interpolate(low_t, self._orig_hw, mode="bilinear", align_corners=False)
        if not return_logits:
            masks = masks > self.mask_threshold
        low_t = torch.clamp(low_t, -32.0, 32.0)
        return masks[0].float().numpy(), np.asarray(iou, np.float32)[0], low_t[0].numpy()

    # ---- helpers ----------------------------------------------------------------------------
    def _require_image(self) -> None:
        if not self._is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")

    def _prompt_points(self, point_coords, point_labels, box, normalize_coords) -> tuple[np.ndarray, np.ndarray]:
        """Upstream's prompt order: box corners (labels 2, 3), then points, then one pad point (-1)."""
        h, w = self._orig_hw
        size = np.float32(self.cfg.image_size)
        wh = np.array([w, h], np.float32) if normalize_coords else np.ones(2, np.float32)

        def to_model(xy: np.ndarray) -> np.ndarray:  # as upstream: (x / w) * S, in float32
            return (xy / wh) * size

        coords, labels = [], []
        if box is not None:
            b = np.asarray(box, np.float32)
            if b.size != 4:
                raise PredictorError(f"box must have 4 numbers X0,Y0,X1,Y1, got shape {b.shape}")
            coords.append(to_model(b.reshape(2, 2)))
            labels.append(np.array([2, 3], np.float32))
        if point_coords is not None:
            if point_labels is None:
                raise PredictorError("point_labels must be supplied if point_coords is supplied")
            p = np.asarray(point_coords, np.float32).reshape(-1, 2)
            lab = np.asarray(point_labels, np.float32).reshape(-1)
            if len(p) != len(lab):
                raise PredictorError(f"{len(p)} points but {len(lab)} labels; give one label per point")
            coords.append(to_model(p))
            labels.append(lab)
            coords.append(np.zeros((1, 2), np.float32))
            labels.append(np.array([-1], np.float32))
        elif box is not None:
            coords.append(np.zeros((1, 2), np.float32))
            labels.append(np.array([-1], np.float32))
        if not coords:
            return np.zeros((1, 0, 2), np.float32), np.zeros((1, 0), np.float32)
        return np.concatenate(coords)[None], np.concatenate(labels)[None]

    def _mask_input(self, mask_input) -> np.ndarray | None:
        if mask_input is None:
            return None
        m = np.asarray(mask_input, np.float32)
        side = 4 * self.cfg.image_embedding_size
        if m.size != side * side:
            raise PredictorError(
                f"mask_input must be 1x{side}x{side} low-res logits (from a previous predict), got {m.shape}"
            )
        return m.reshape(1, 1, side, side)
