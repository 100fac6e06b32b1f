"""Decoding untrusted image bytes into RGB PIL images, with clear errors.

Handles JPEG, PNG, WebP, BMP, TIFF and GIF (first frame); applies the EXIF orientation; converts every mode
to RGB (transparent pixels composited on white, 16-bit and float images rescaled to 8 bits). Rejects empty,
truncated, unrecognised and over-sized inputs (decompression bombs) with ``ImageDecodeError``.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from regis.errors import ImageDecodeError, ImageTooLargeError

SUPPORTED_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"})
DEFAULT_MAX_PIXELS = 64_000_000  # a 8000 x 8000 photo; beyond this we call it a decompression bomb
DEFAULT_MAX_CONCURRENT_DECODES = 2  # decodes at once per process; each may take hundreds of MB at the limit
_EXIF_ORIENTATION = 0x0112
# PIL ``info`` key of a draft-reduced image: ((full width, full height), (its own width, height)); the "aspect"
# frame sizes its input from the full size, so that an image's patch grid follows from the size the index records
FULL_SIZE_INFO = "regis_full_size"
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # rotations by 90 degrees: width and height swap


_decode_slots = threading.BoundedSemaphore(DEFAULT_MAX_CONCURRENT_DECODES)


def set_max_concurrent_decodes(n: int) -> None:
    """Bound how many ``decode_image`` calls of this process decode at once (the others wait their turn):
    the memory of concurrent decodes of images at the pixel limit stays at ``n`` times one.

    Raises:
        ValueError: n < 1.
    """
    global _decode_slots
    if n < 1:
        raise ValueError(f"max concurrent decodes must be >= 1, got {n}")
    _decode_slots = threading.BoundedSemaphore(n)


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


_HIGH_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I", "F")
_ROWS_PER_STEP = 256  # rows rescaled at a time: a float32 work buffer of width x 256 x 4 bytes


def _high_depth_to_l(img: Image.Image) -> Image.Image:
    """16-bit, 32-bit integer or float image -> 8-bit "L", its [min, max] stretched to [0, 255].

    Rescales a band of rows at a time in float32, so the extra memory is one uint8 copy of the image plus a
    small work buffer (an 8000 x 8000 16-bit PNG no longer goes through 512 MB float64 arrays).
    """
    arr = np.asarray(img)  # uint16 / int32 / float32, as stored (no float64 copy)
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        lo = float(arr[finite].min()) if finite.any() else 0.0
        hi = float(arr[finite].max()) if finite.any() else 0.0
    else:
        lo, hi = float(arr.min()), float(arr.max())
    out = np.zeros(arr.shape, dtype=np.uint8)
    if hi > lo:
        scale = np.float32(255.0 / (hi - lo))
        for r0 in range(0, arr.shape[0], _ROWS_PER_STEP):
            band = (arr[r0 : r0 + _ROWS_PER_STEP].astype(np.float32) - np.float32(lo)) * scale
            out[r0 : r0 + _ROWS_PER_STEP] = np.nan_to_num(np.rint(np.clip(band, 0, 255)), nan=0.0)
    return Image.fromarray(out, mode="L")


def _reduce_for(img: Image.Image, draft_size: int | None) -> Image.Image:
    """Box-reduce by the largest integer factor that keeps both sides >= ``draft_size`` (as JPEG draft does)."""
    if not draft_size:
        return img
    factor = min(img.size) // draft_size
    return img.reduce(factor) if factor >= 2 else img


def _to_rgb(img: Image.Image, draft_size: int | None = None) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in _HIGH_DEPTH_MODES:
        return _reduce_for(_high_depth_to_l(img), draft_size).convert("RGB")
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
            stay >= this many pixels (much faster for large photos; ANCHORS.md, indexing limits); 16-bit and
            float images are box-reduced the same way after their conversion to 8 bits.

    Returns:
        The decoded image and its full-resolution size.

    Raises:
        ImageDecodeError: empty, unreadable, unrecognised, truncated or over-sized input. The message says
            which, and never includes the bytes.

    At most ``set_max_concurrent_decodes(n)`` calls decode at once in a process (default 2).
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
    with _decode_slots:
        return _decode(data, max_pixels, draft_size)


def _decode(data: bytes, max_pixels: int, draft_size: int | None) -> DecodedImage:
    try:
        # no warnings.catch_warnings here: it swaps the process-wide filter list and is not thread-safe (decodes
        # run in worker threads; it dropped other threads' filters). Pillow raises past twice its
        # MAX_IMAGE_PIXELS and only warns past it: that band is refused below.
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        if Image.MAX_IMAGE_PIXELS and width * height > Image.MAX_IMAGE_PIXELS:
            raise Image.DecompressionBombError(f"{width} x {height} pixels")
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
        rgb = _to_rgb(img, draft_size)
        if rgb.size != (width, height):  # draft-reduced: the full size, for transforms that need it exactly
            rgb.info[FULL_SIZE_INFO] = ((width, height), rgb.size)
    except ImageDecodeError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageDecodeError("not an image in a supported format (JPEG, PNG, WebP, BMP, TIFF, GIF)") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLargeError("image too large: refused as a possible decompression bomb") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(f"corrupt or truncated image data ({type(exc).__name__})") from exc
    return DecodedImage(image=rgb, width=width, height=height, format=fmt)
