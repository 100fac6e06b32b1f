"""The edits people make to a photo, as training augmentations and as evaluation queries (issue 22).

Every edit takes a PIL RGB image and a numpy Generator and returns ``(image, box)``: the edited copy (decoded
from the JPEG bytes it was saved as, as it would arrive) and the region of the input it shows, in the input's
pixels (x0, y0, x1, y1; rotation keeps the box of the crop it was cut from). Photometric steps use
torchvision.transforms.v2 (colour jitter, greyscale, Gaussian blur); JPEG through Pillow.

- ``train_edit``: SSCD-style strong edits: a crop keeping 10-90 % of the area (or the whole image, 20 %),
  rotation up to 15 degrees, horizontal flip (50 %), downscale to 30-100 %, colour jitter or greyscale, blur,
  overlaid text or a sticker (a filled shape; no emoji font ships with the packages we use), JPEG q20-90.
- the evaluation kinds (``training.photos.evalset``): ``easy_edit`` (60-90 % crop, half size, JPEG 40-80, as the
  issue's easy set) and ``hard_edit`` (25-50 % crop, flip, grey or strong colour, rotation up to 15 degrees,
  blur, JPEG 20-50, as its hard set), ``crop_edit`` (10-40 % crop, downscale, JPEG 50-90).
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

Box = tuple[float, float, float, float]
WORDS = ("SALE", "hello", "2024", "#regis", "wow", "Paris", "LOL", "copyright", "draft", "summer")


def random_box(w: int, h: int, rng: np.random.Generator, low: float, high: float) -> Box:
    """A box keeping a fraction in [low, high] of the w x h area, aspect ratio within 1/2..2 of the image's."""
    area = rng.uniform(low, high) * w * h
    aspect = (w / h) * math.exp(rng.uniform(math.log(1 / 2), math.log(2)))
    cw = int(min(w, max(8, round(math.sqrt(area * aspect)))))
    ch = int(min(h, max(8, round(math.sqrt(area / aspect)))))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return (x0, y0, x0 + cw, y0 + ch)


def jpeg(img: Image.Image, quality: int) -> Image.Image:
    """The image after a JPEG round trip at ``quality``."""
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=int(quality))
    buf.seek(0)
    out = Image.open(buf)
    out.load()
    return out.convert("RGB")


def rotated_crop(img: Image.Image, box: Box, angle: float) -> Image.Image:
    """The box's content after rotating the image by ``angle`` degrees about the box centre."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return img.rotate(angle, resample=Image.BICUBIC, center=(cx, cy)).crop(tuple(int(v) for v in box))


def scale(img: Image.Image, f: float, min_side: int = 16) -> Image.Image:
    """Resize by factor ``f`` (bicubic), each side at least ``min_side``."""
    w, h = img.size
    return img.resize((max(min_side, round(w * f)), max(min_side, round(h * f))), Image.BICUBIC)


def _tv(img: Image.Image, transform) -> Image.Image:
    import torch
    from torchvision.transforms.v2 import functional as TF

    return TF.to_pil_image(transform(TF.pil_to_tensor(img)).to(torch.uint8))


def color(img: Image.Image, rng: np.random.Generator, strength: float, grey_p: float) -> Image.Image:
    """Greyscale with probability ``grey_p``, else colour jitter (brightness, contrast, saturation +-strength,
    hue +-strength/2) with torchvision.transforms.v2, seeded from ``rng``."""
    import torch
    from torchvision.transforms import v2 as T

    torch.manual_seed(int(rng.integers(0, 2**31)))
    if rng.random() < grey_p:
        return _tv(img, T.Grayscale(num_output_channels=3))
    return _tv(img, T.ColorJitter(strength, strength, strength, min(0.5, strength / 2)))


def blur(img: Image.Image, rng: np.random.Generator, max_sigma: float) -> Image.Image:
    """Gaussian blur, sigma uniform in [0.1, max_sigma] px (torchvision.transforms.v2)."""
    from torchvision.transforms import v2 as T

    sigma = float(rng.uniform(0.1, max_sigma))
    k = 2 * math.ceil(3 * sigma) + 1
    return _tv(img, T.GaussianBlur(k, sigma))


def overlay(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Overlaid text (a random word, size 8-25 % of the height) or a sticker (a filled ellipse or rectangle,
    5-20 % of the side), at a random place and colour."""
    img = img.copy()
    d = ImageDraw.Draw(img)
    w, h = img.size
    fill = tuple(int(v) for v in rng.integers(0, 256, 3))
    if rng.random() < 0.5:
        size = max(8, int(h * rng.uniform(0.08, 0.25)))
        font = ImageFont.load_default(size=size)
        d.text((rng.uniform(0, 0.7) * w, rng.uniform(0, 0.8) * h), str(rng.choice(WORDS)), fill=fill, font=font)
    else:
        s = max(4, int(min(w, h) * rng.uniform(0.05, 0.2)))
        x, y = int(rng.uniform(0, w - s)), int(rng.uniform(0, h - s))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)((x, y, x + s, y + s), fill=fill)
    return img


def train_edit(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, Box]:
    """A strong SSCD-style edit for training (module docstring)."""
    w, h = img.size
    box = (0, 0, w, h) if rng.random() < 0.2 else random_box(w, h, rng, 0.1, 0.9)
    angle = float(rng.uniform(-15, 15)) if rng.random() < 0.3 else 0.0
    out = rotated_crop(img, box, angle) if angle else img.crop(tuple(int(v) for v in box))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    out = scale(out, rng.uniform(0.3, 1.0))
    if rng.random() < 0.8:
        out = color(out, rng, 0.4, grey_p=0.2)
    if rng.random() < 0.3:
        out = blur(out, rng, 2.0)
    if rng.random() < 0.3:
        out = overlay(out, rng)
    return jpeg(out, int(rng.integers(20, 91))), box


def easy_edit(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, Box]:
    """60-90 % crop, half size, JPEG q40-80."""
    w, h = img.size
    box = random_box(w, h, rng, 0.6, 0.9)
    return jpeg(scale(img.crop(box), 0.5), int(rng.integers(40, 81))), box


def hard_edit(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, Box]:
    """25-50 % crop, flip (50 %), grey (50 %) or strong colour, rotation up to 15 degrees, blur, JPEG q20-50."""
    w, h = img.size
    box = random_box(w, h, rng, 0.25, 0.5)
    out = rotated_crop(img, box, float(rng.uniform(-15, 15)))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    out = color(out, rng, 0.6, grey_p=0.5)
    out = blur(out, rng, 1.5)
    return jpeg(out, int(rng.integers(20, 51))), box


def crop_edit(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, Box]:
    """10-40 % crop, downscale to 50-100 %, JPEG q50-90."""
    w, h = img.size
    box = random_box(w, h, rng, 0.1, 0.4)
    return jpeg(scale(img.crop(box), rng.uniform(0.5, 1.0)), int(rng.integers(50, 91))), box
