"""``Sam2Predictor``: upstream ``SAM2ImagePredictor``'s API on every backend.

Coordinate frames: ``point_coords`` Nx2 and ``box`` (4,) XYXY are in original-image pixels
(``normalize_coords=True``, the default) or already in [0, 1] x image_size model-input
pixels (``normalize_coords=False``), exactly as upstream. Returned masks are in
original-image pixels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sam2edge.bundle import load_card
from sam2edge.config import Sam2Config, get_config
from sam2edge.extras import RUNTIME_MODULES, require_all
from sam2edge.runtime.backends import Backend, EagerBackend, Features, backend_for
from sam2edge.runtime.preprocess import preprocess, to_rgb_array
from sam2edge.runtime.prompts import prompt_layout
from sam2edge.validate import InputError, check_image_array, check_prompt

MASK_THRESHOLD = 0.0


class PredictorError(InputError):
    """Bad prompt or bundle; the message names the problem and the fix."""


class Sam2Predictor:
    """Upstream ``SAM2ImagePredictor``'s API over the eager model or an exported bundle.

    Build it with ``from_checkpoint`` or ``from_export``; ``set_image`` encodes a photo once, then every
    ``predict`` decodes one prompt. Coordinates are (x, y) pixels of the original image, origin at the top-left
    corner, unless ``normalize_coords=False`` (then in the model's ``image_size`` x ``image_size`` input frame).
    ``e`` below is ``cfg.image_embedding_size`` (64 at 1024 px), so low-res masks are 4e x 4e (256 x 256).
    """

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
            why = f"{prov['note']}; " if prov.get("note") else "no checkpoint given; "
            print(
                f"WARNING: {why}using the deterministic SYNTHETIC checkpoint. "
                "Masks are meaningless until real weights are given (--checkpoint sam2.1_hiera_tiny.pt).",
                file=sys.stderr,
            )
        return cls(EagerBackend.from_state_dict(sd, cfg), prov)

    @classmethod
    def from_export(cls, bundle: str | Path) -> Sam2Predictor:
        """Predictor over an exported bundle (its card.json names the target runtime)."""
        meta = load_card(Path(bundle))  # validated: a malformed card is one line
        require_all(RUNTIME_MODULES.get(meta["target"], ()), f"a {meta['target']} bundle")
        return cls(backend_for(meta["target"]).from_bundle(Path(bundle)), meta)

    # ---- upstream API -------------------------------------------------------------------
    def reset_predictor(self) -> None:
        """Forget the set image (``predict`` then refuses until ``set_image``)."""
        self._features: Features | None = None
        self._orig_hw: tuple[int, int] | None = None
        self._is_image_set = False

    @torch.no_grad()
    def set_image(self, image: np.ndarray | Image.Image) -> None:
        """Encode ``image``: an (H, W, 3) uint8 RGB array or any PIL image (EXIF orientation applied); H and W
        define the pixel frame of every later prompt and mask."""
        rgb = check_image_array(to_rgb_array(image))  # a refused image leaves the current one set
        self.reset_predictor()
        self._orig_hw = rgb.shape[:2]
        x = preprocess(rgb, self.cfg.image_size).numpy()
        self._features = self.backend.encode(x)
        self._is_image_set = True

    def get_image_embedding(self) -> torch.Tensor:
        """The set image's embedding: float32 tensor (1, 256, e, e)."""
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
        """Decode one prompt on the set image.

        Args:
            point_coords: (N, 2) float (x, y) clicks in original-image pixels (see the class docstring).
            point_labels: (N,) int: 1 object, 0 background (upstream's -1 pad and 2 / 3 box corners accepted).
            box: (4,) or (1, 4) float X0, Y0, X1, Y1 in the same pixel frame.
            mask_input: (1, 4e, 4e) float32 low-res logits, e.g. a previous call's ``low_res_masks[i:i+1]``.
            multimask_output: True -> C = 3 candidates; False -> C = 1.
            return_logits: masks as float logits instead of 0/1.
            normalize_coords: False when coordinates are already in the model's input frame.

        Returns:
            (masks (C, H, W) float32 0/1 (as upstream) or logits at the original image size,
            iou_predictions (C,) float32, low_res_masks (C, 4e, 4e) float32 logits clamped to +-32).
        """
        self._require_image()
        side = 4 * self.cfg.image_embedding_size
        point_coords, point_labels, box, mask = check_prompt(point_coords, point_labels, box, mask_input, side)
        coords, labels = self._prompt_points(point_coords, point_labels, box, normalize_coords)
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
        """Upstream's prompt order: box corners (labels 2, 3), then points, then one pad point (-1); the
        arguments already passed ``validate.check_prompt``."""
        h, w = self._orig_hw
        size = np.float32(self.cfg.image_size)
        wh = np.array([w, h], np.float32) if normalize_coords else np.ones(2, np.float32)
        return prompt_layout(box, point_coords, point_labels, wh, size)

    # ---- stored embeddings (``sam2edge embed``) ----------------------------------------------
    def set_image_embedding(self, features: Features, orig_hw: tuple[int, int]) -> None:
        """Set decoder-ready features (as ``backend.encode`` returns them) for an image of ``orig_hw``
        (H, W) pixels, skipping the encoder; ``predict`` then works as after ``set_image``."""
        from sam2edge.runtime.embeddings import check_shapes

        check_shapes(features, self.cfg, "set_image_embedding")
        self.reset_predictor()
        self._orig_hw = (int(orig_hw[0]), int(orig_hw[1]))
        self._features = features
        self._is_image_set = True

    def model_identity(self) -> dict:
        """The identity stored with embeddings of this model (see ``runtime.embeddings.model_identity``)."""
        from sam2edge.runtime.embeddings import model_identity

        return model_identity(self.provenance, self.cfg, self.backend.name)

    def load_embedding(self, store: str | Path, name: str, image_sha256: str | None = None) -> dict:
        """Set the stored embedding ``STORE/<name>.safetensors`` (no encoder run) -> its metadata.

        Refuses (EmbeddingError, one line) an embedding of another model, or of other image bytes when
        ``image_sha256`` (SHA-256 of the image file) is given."""
        from sam2edge.runtime.embeddings import EmbeddingError, describe_model, embedding_path, read_stored

        path = embedding_path(store, name)
        stored = read_stored(store, name)  # size and SHA-256 against the index, shapes, finiteness
        mine, theirs = self.model_identity(), stored.meta.get("model", {})
        if theirs != mine:
            raise EmbeddingError(
                f"{path} was embedded by {describe_model(theirs)}, not this model {describe_model(mine)}; "
                "pass the same --model/--checkpoint/--config as `sam2edge embed`"
            )
        if image_sha256 is not None and stored.meta.get("image_sha256") != image_sha256:
            raise EmbeddingError(
                f"{path} was embedded from other image bytes (SHA-256 differs); re-run `sam2edge embed` on this photo"
            )
        self.set_image_embedding(stored.features, stored.original_size)
        return stored.meta

    # ---- batched prompts (automatic mask generation) --------------------------------------------
    @torch.no_grad()
    def predict_batch(
        self,
        point_coords: np.ndarray,
        point_labels: np.ndarray,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
        max_hole_area: int = 0,
        max_sprinkle_area: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """B independent point prompts on the set image, in one batched decode where the backend has one.

        point_coords BxNx2 (frame as in ``predict``), point_labels BxN. Returns torch tensors, as
        upstream's ``_predict``: masks BxCxHxW (original-image pixels; bool, or float logits with
        return_logits), iou BxC, low-res logits BxCx4ex4e clamped to +-32. ``max_hole_area`` /
        ``max_sprinkle_area`` > 0 fill small background / foreground components of the low-res logits
        before upscaling (upstream's ``SAM2ImagePredictor(max_hole_area=, max_sprinkle_area=)``).
        """
        low, iou = self.decode_batch_low_res(point_coords, point_labels, multimask_output, normalize_coords)
        masks = self.upscale_logits(low, max_hole_area, max_sprinkle_area)
        if not return_logits:
            masks = masks > self.mask_threshold
        return masks, iou, torch.clamp(low, -32.0, 32.0)

    @torch.no_grad()
    def decode_batch_low_res(
        self, point_coords: np.ndarray, point_labels: np.ndarray, multimask_output: bool = True, normalize_coords=True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder half of ``predict_batch``: -> (low-res logits BxCx4ex4e, unclamped; iou BxC)."""
        from sam2edge.runtime.backends import decode_batch

        self._require_image()
        pc, pl = np.asarray(point_coords, np.float32), np.asarray(point_labels, np.float32)
        if pc.ndim != 3 or pc.shape[-1] != 2 or pl.shape != pc.shape[:2]:
            raise PredictorError(f"point_coords must be BxNx2 and point_labels BxN, got {pc.shape} and {pl.shape}")
        rows = [self._prompt_points(pc[i], pl[i], None, normalize_coords) for i in range(len(pc))]
        coords = np.concatenate([r[0] for r in rows])  # (B, N+1, 2) with the pad point
        labels = np.concatenate([r[1] for r in rows])  # (B, N+1)
        out = decode_batch(self.backend, self._features, coords, labels)
        low, iou = (out.masks, out.iou) if multimask_output else (out.single_mask, out.single_iou)
        low_t = torch.from_numpy(np.ascontiguousarray(low, dtype=np.float32))  # (B, C, 4e, 4e)
        return low_t, torch.from_numpy(np.asarray(iou, np.float32))

    @torch.no_grad()
    def upscale_logits(self, low: torch.Tensor, max_hole_area: int = 0, max_sprinkle_area: int = 0) -> torch.Tensor:
        """The upscaling half of ``predict_batch``: BxCx4ex4e logits -> BxCxHxW logits at the set image's size."""
        from sam2edge.runtime.automatic.amg_utils import fill_holes_and_sprinkles

        if max_hole_area > 0 or max_sprinkle_area > 0:
            low = fill_holes_and_sprinkles(low, max_hole_area, max_sprinkle_area, self.mask_threshold)
        return F.interpolate(low, self._orig_hw, mode="bilinear", align_corners=False)
