"""Image loading and the SAM 2 preprocessing contract.

Contract: RGB, resize to S x S bilinear (aspect not kept; antialiased as upstream's
torchvision ``Resize`` on tensors), x/255, ImageNet mean/std, NCHW float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError

from sam2edge.validate import InputError, check_image_array

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
MAX_PIXELS = 100_000_000  # refuse decompression bombs above this many pixels


class ImageError(InputError):
    """An image that cannot be read or used."""


def to_rgb_array(image: np.ndarray | Image.Image) -> np.ndarray:
    """Any PIL image (RGB, RGBA, L, I;16, P, CMYK, ...; EXIF orientation applied) or HxWx3 uint8 -> HxWx3 uint8."""
    if isinstance(image, np.ndarray):
        return check_image_array(image)
    if not isinstance(image, Image.Image):
        raise ImageError(f"image must be a numpy HxWx3 uint8 array or a PIL image, got {type(image).__name__}")
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(image, dtype=np.float64)
        hi = a.max() if a.max() > 255 else 255.0
        image = Image.fromarray(np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "F":
        a = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.clip(a * (255.0 if a.max() <= 1.0 else 1.0) + 0.5, 0, 255).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(bg, rgba)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def load_image(path: str | Path) -> np.ndarray:
    """Read an image file as HxWx3 uint8 RGB, or raise ImageError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise ImageError(f"image {path} does not exist; pass the path of a PNG/JPEG/... file")
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with Image.open(path) as im:
            im.load()
            return to_rgb_array(im)
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError, ValueError) as e:
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise ImageError(f"cannot read image {path}: {reason}; pass a valid PNG/JPEG/... file") from None


def preprocess(rgb: np.ndarray, size: int) -> torch.Tensor:
    """HxWx3 uint8 -> 1x3xSxS float32, resized (bilinear, antialiased) and ImageNet-normalised."""
    x = torch.from_numpy(np.array(rgb, dtype=np.uint8, copy=True)).permute(2, 0, 1).float().div(255.0)  # (3, H, W)
    if x.shape[1:] != (size, size):
        x = F.interpolate(x[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return ((x - mean) / std)[None].contiguous()
