"""Uploaded photos -> HxWx3 uint8 RGB, with limits checked *before* pixels are decoded; a posted prompt -> arrays.

Refusals (``HttpError``, one line each): a body that is not a PNG/JPEG/WebP/BMP/GIF/TIFF (415), a
header announcing more than ``max_pixels`` pixels (413: a decompression bomb is refused from its
header, never decoded), a truncated or corrupt file (400).
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from sam2edge.runtime.preprocess import to_rgb_array
from sam2edge.serve.web import HttpError
from sam2edge.validate import InputError, check_points

FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")
GUARD = "(decompression bomb guard); downscale it or strip its metadata first"
MAX_PROMPT_POINTS = 64
MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF", b"GIF8", b"BM", b"II*\x00", b"MM\x00*")


def decode_upload(data: bytes, max_pixels: int) -> np.ndarray:
    """Image file bytes -> HxWx3 uint8 RGB (EXIF orientation applied), or HttpError."""
    if not data:
        raise HttpError(400, "the upload is empty; send a PNG or JPEG photo as the request body")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise HttpError(413, f"the image has more pixels than the limit of {max_pixels / 1e6:.0f} MP {GUARD}") from None
    except UnidentifiedImageError:
        if _looks_like_image(data):  # PIL refuses a header it cannot use (zero width, say): a bad file
            raise HttpError(400, "the image header is invalid (zero width or height?); open a valid photo") from None
        raise HttpError(
            415, "the upload is not an image PNG/JPEG/WebP/BMP/GIF/TIFF can read; open a photo file"
        ) from None
    except ValueError as e:  # PIL's limit on compressed metadata chunks (a text-chunk bomb)
        if "too large" in str(e).lower():
            raise HttpError(413, f"the image's metadata inflates past the size limit {GUARD}") from None
        raise HttpError(400, f"cannot read the image ({_first_line(e)}); the file may be corrupt") from None
    except (OSError, SyntaxError, RecursionError) as e:
        raise HttpError(
            400, f"cannot read the image ({_first_line(e)}); the file may be truncated or corrupt"
        ) from None
    with im:
        w, h = im.size
        if w * h > max_pixels:
            raise HttpError(
                413, f"the image is {w}x{h} = {w * h / 1e6:.0f} MP; the limit is {max_pixels / 1e6:.0f} MP {GUARD}"
            )
        if w < 1 or h < 1:
            raise HttpError(400, f"the image is {w}x{h}; open a photo with at least one pixel")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                im.load()
            return to_rgb_array(im)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise HttpError(
                413, f"the image has more pixels than the limit of {max_pixels / 1e6:.0f} MP {GUARD}"
            ) from None
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise HttpError(
                400, f"cannot decode the image ({_first_line(e)}); the file may be truncated or corrupt"
            ) from None


def _looks_like_image(data: bytes) -> bool:
    return data.startswith(MAGIC)


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:100]


def encode_png(rgb: np.ndarray) -> bytes:
    """HxWx3 uint8 -> PNG bytes (the photo exactly as the server encoded it, orientation applied)."""
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def parse_prompt(body: bytes, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """JSON {"coords": [[x, y], ...], "labels": [...]} -> (coords 1xNx2 float32, labels 1xN float32)."""
    try:
        obj = json.loads(body)
        raw_coords, raw_labels = obj["coords"], obj["labels"]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: deeply nested JSON
        raise HttpError(400, 'the prompt must be JSON {"coords": [[x, y], ...], "labels": [...]}') from None
    try:
        coords, labels = check_points(raw_coords, raw_labels)
    except InputError as e:
        raise HttpError(400, str(e)) from None
    if not 1 <= len(labels) <= MAX_PROMPT_POINTS:
        raise HttpError(400, f"give 1..{MAX_PROMPT_POINTS} coords with one label each")
    if (coords < 0).any() or (coords > image_size).any():
        raise HttpError(400, f"coords are model-input pixels and must lie in [0, {image_size}]")
    return coords[None], labels[None]
