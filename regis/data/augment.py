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


def make_edits(crop_area: tuple[float, float] = (0.5, 0.8)) -> dict[str, Edit]:
    """The five edits, with crops keeping a fraction ``crop_area`` (low, high) of the area.

    - ``crop``: a crop, saved as PNG (lossless);
    - ``resize``: downscale to 40-80 %, PNG;
    - ``jpeg``: re-encode as JPEG at quality 10-30;
    - ``color``: brightness, contrast and saturation +-40 %, PNG;
    - ``mixed``: crop + downscale + colour jitter (+-20 %) + JPEG quality 30-60.
    """
    low, high = crop_area

    def png(img: Image.Image) -> bytes:
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    def crop(img: Image.Image, rng: np.random.Generator) -> bytes:
        return png(random_crop(img, rng, low, high))

    def resize(img: Image.Image, rng: np.random.Generator) -> bytes:
        return png(rescale(img, rng))

    def jpeg(img: Image.Image, rng: np.random.Generator) -> bytes:
        return encode_jpeg(img, quality=int(rng.integers(10, 31)))

    def color(img: Image.Image, rng: np.random.Generator) -> bytes:
        return png(color_jitter(img, rng))

    def mixed(img: Image.Image, rng: np.random.Generator) -> bytes:
        out = color_jitter(rescale(random_crop(img, rng, low, high), rng), rng, strength=0.2)
        return encode_jpeg(out, quality=int(rng.integers(30, 61)))

    return {"crop": crop, "resize": resize, "jpeg": jpeg, "color": color, "mixed": mixed}


EDITS: dict[str, Edit] = make_edits()
edit_mixed: Edit = EDITS["mixed"]
