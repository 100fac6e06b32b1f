"""Decoding untrusted image bytes into RGB PIL images, with clear errors.

Handles JPEG, PNG, WebP, BMP, TIFF and GIF (first frame); applies the EXIF orientation; converts every mode
to RGB (transparent pixels composited on white, 16-bit and float images rescaled to 8 bits). Rejects empty,
truncated, unrecognised and over-sized inputs (decompression bombs) with ``ImageDecodeError``.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from regis.errors import ImageDecodeError, ImageTooLargeError

SUPPORTED_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"})
DEFAULT_MAX_PIXELS = 64_000_000  # a 8000 x 8000 photo; beyond this we call it a decompression bomb
_EXIF_ORIENTATION = 0x0112
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # rotations by 90 degrees: width and height swap


@dataclass(frozen=True)
class DecodedImage:
    """A decoded image.

    Attributes:
        image: RGB PIL image, EXIF orientation applied (possibly draft-reduced, see ``decode_image``).
        width, height: the full-resolution size after EXIF orientation, pixels.
        format: the detected file format ("JPEG", "PNG", ...).
    """

    image: Image.Image
    width: int
    height: int
    format: str


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        lo, hi = float(arr.min()), float(arr.max())
        arr = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
        return Image.fromarray(arr.astype(np.uint8)).convert("RGB")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def decode_image(
    source: bytes | str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, draft_size: int | None = None
) -> DecodedImage:
    """Decode bytes or a file into an RGB image.

    Args:
        source: the encoded bytes, or a path to read them from.
        max_pixels: refuse images with more pixels than this (width * height).
        draft_size: if given, let the JPEG decoder reduce the image by a power of two while both sides
            stay >= this many pixels (much faster for large photos; ANCHORS.md, indexing limits).

    Returns:
        The decoded image and its full-resolution size.

    Raises:
        ImageDecodeError: empty, unreadable, unrecognised, truncated or over-sized input. The message says
            which, and never includes the bytes.
    """
    if isinstance(source, (str, Path)):
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise ImageDecodeError(f"cannot read file: {exc.strerror or type(exc).__name__}") from exc
    else:
        data = source
    if len(data) == 0:
        raise ImageDecodeError("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise ImageTooLargeError(
                    f"image is {width} x {height} = {width * height:,} pixels, over the limit of {max_pixels:,}"
                )
            fmt = img.format or "unknown"
            if draft_size and fmt == "JPEG":
                img.draft("RGB", (draft_size, draft_size))
            if img.getexif().get(_EXIF_ORIENTATION, 1) in _TRANSPOSING_ORIENTATIONS:
                width, height = height, width
            img.load()
            img = ImageOps.exif_transpose(img)
            rgb = _to_rgb(img)
    except ImageDecodeError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageDecodeError("not an image in a supported format (JPEG, PNG, WebP, BMP, TIFF, GIF)") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLargeError("image too large: refused as a possible decompression bomb") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(f"corrupt or truncated image data ({type(exc).__name__})") from exc
    return DecodedImage(image=rgb, width=width, height=height, format=fmt)
