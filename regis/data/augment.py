"""Deterministic photometric and geometric edits that make "augmented copies" of a photo: the queries of
the instance-retrieval demo, tests and ``scripts/eval_instance_retrieval.py``.

Each edit maps (PIL RGB image, numpy Generator) -> encoded bytes (JPEG or PNG), as a user's re-saved,
cropped or recoloured copy of a photo would arrive.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageEnhance

Edit = Callable[[Image.Image, np.random.Generator], bytes]


def encode_jpeg(img: Image.Image, quality: int = 90) -> bytes:
    """JPEG bytes of an RGB image."""
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=int(quality))
    return buf.getvalue()


def random_crop(
    img: Image.Image, rng: np.random.Generator, min_area: float = 0.5, max_area: float = 0.8
) -> Image.Image:
    """A crop keeping a random fraction in [min_area, max_area] of the area, aspect ratio within 3/4..4/3."""
    w, h = img.size
    area = rng.uniform(min_area, max_area) * w * h
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw = int(min(w, max(16, round(np.sqrt(area * aspect)))))
    ch = int(min(h, max(16, round(np.sqrt(area / aspect)))))
    x0 = int(rng.integers(0, w - cw + 1))
    y0 = int(rng.integers(0, h - ch + 1))
    return img.crop((x0, y0, x0 + cw, y0 + ch))


def rescale(img: Image.Image, rng: np.random.Generator, low: float = 0.4, high: float = 0.8) -> Image.Image:
    """Downscale by a random factor in [low, high] (bicubic)."""
    f = rng.uniform(low, high)
    w, h = img.size
    return img.resize((max(16, round(w * f)), max(16, round(h * f))), Image.BICUBIC)


def color_jitter(img: Image.Image, rng: np.random.Generator, strength: float = 0.4) -> Image.Image:
    """Random brightness, contrast and saturation factors in [1 - strength, 1 + strength]."""
    for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhancer(img).enhance(rng.uniform(1 - strength, 1 + strength))
    return img


def edit_crop(img: Image.Image, rng: np.random.Generator) -> bytes:
    """Crop to 50-80 % of the area; saved as PNG (lossless)."""
    buf = io.BytesIO()
    random_crop(img, rng).save(buf, format="PNG")
    return buf.getvalue()


def edit_resize(img: Image.Image, rng: np.random.Generator) -> bytes:
    """Downscale to 40-80 %; saved as PNG."""
    buf = io.BytesIO()
    rescale(img, rng).save(buf, format="PNG")
    return buf.getvalue()


def edit_jpeg(img: Image.Image, rng: np.random.Generator) -> bytes:
    """Re-encode as JPEG at quality 10-30."""
    return encode_jpeg(img, quality=int(rng.integers(10, 31)))


def edit_color(img: Image.Image, rng: np.random.Generator) -> bytes:
    """Colour jitter (brightness, contrast, saturation +-40 %); saved as PNG."""
    buf = io.BytesIO()
    color_jitter(img, rng).save(buf, format="PNG")
    return buf.getvalue()


def edit_mixed(img: Image.Image, rng: np.random.Generator) -> bytes:
    """Crop (50-80 %) + downscale (40-80 %) + colour jitter + JPEG quality 30-60: the demo's query."""
    out = color_jitter(rescale(random_crop(img, rng), rng), rng, strength=0.2)
    return encode_jpeg(out, quality=int(rng.integers(30, 61)))


EDITS: dict[str, Edit] = {
    "crop": edit_crop,
    "resize": edit_resize,
    "jpeg": edit_jpeg,
    "color": edit_color,
    "mixed": edit_mixed,
}
