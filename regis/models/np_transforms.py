"""The evaluation transform of ``regis.models.transforms.eval_transform`` in PIL + numpy, without torch or
torchvision (the torch-free query path, ``regis.models.query_bundle``), and the antialiased bicubic resize of the
CNN's ROI pass (``RegisEncoder.forward_roi_parts``: ``torch.nn.functional.interpolate(..., "bicubic",
antialias=True)``) as two matrix products.

Same arithmetic as torchvision on PIL images: the geometry is PIL's own ``Image.resize`` / ``crop`` / ``paste``
with the sizes torchvision computes, ``ToTensor`` is uint8 / 255 in float32 and ``Normalize`` is
(x - mean) / std in float32, so the pixels are equal bit for bit (tests/test_query_bundle.py). The resize
matrices follow the separable antialiased filter of torch's CPU kernel (Keys' cubic, a = -0.5, support widened
by the downscale factor, weights normalised per output pixel); equal to float32 rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from regis.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

    from regis.models.config import EncoderConfig

CUBIC_A = -0.5  # torch's antialiased bicubic (and PIL's) coefficient


def frame_of(config: EncoderConfig) -> str:
    """The frame the evaluation transform applies ("aspect" of a ViT is "pad", as in ``eval_transform``)."""
    from regis.models.geometry import is_aspect

    frame = getattr(config, "frame", "center-crop")
    return "pad" if frame == "aspect" and not is_aspect(config) else frame


def _pil_mode(name: str) -> int:
    from PIL import Image

    modes = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "box": Image.BOX,
             "hamming": Image.HAMMING, "lanczos": Image.LANCZOS}
    if name not in modes:
        raise ConfigError(f"interpolation {name!r} has no PIL equivalent; choose one of {sorted(modes)}")
    return modes[name]


def _short_side_size(w: int, h: int, short: int) -> tuple[int, int]:
    """(w, h) with the shorter side at ``short`` and the longer at ``int(short * long / shorter)`` (torchvision's
    ``Resize(int)``)."""
    if w <= h:
        return short, int(short * h / w)
    return int(short * w / h), short


def _center_crop(img: Image.Image, size: int) -> Image.Image:
    """The central ``size`` square (torchvision's ``CenterCrop``; a smaller image is padded with 0 around)."""
    from PIL import Image

    w, h = img.size
    if size > w or size > h:
        left, top = (size - w) // 2 if size > w else 0, (size - h) // 2 if size > h else 0
        canvas = Image.new(img.mode, (w + left + ((size - w + 1) // 2 if size > w else 0),
                                      h + top + ((size - h + 1) // 2 if size > h else 0)), 0)
        canvas.paste(img, (left, top))
        img, (w, h) = canvas, canvas.size
        if (w, h) == (size, size):
            return img
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def _pad_to_square(img: Image.Image, config: EncoderConfig, mode: int) -> Image.Image:
    from PIL import Image

    size = config.image_size
    w, h = img.size
    scale = size / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    resized = img if (nw, nh) == (w, h) else img.resize((nw, nh), mode)
    canvas = Image.new("RGB", (size, size), tuple(round(255 * m) for m in config.mean))
    canvas.paste(resized, ((size - nw) // 2, (size - nh) // 2))
    return canvas


def _aspect_resize(img: Image.Image, config: EncoderConfig, mode: int) -> Image.Image:
    from regis.images.decode import FULL_SIZE_INFO
    from regis.models.geometry import aspect_input_size

    full, seen = img.info.get(FULL_SIZE_INFO, (img.size, img.size))
    w, h = aspect_input_size(config, *(full if tuple(seen) == img.size else img.size))
    return img if (w, h) == img.size else img.resize((w, h), mode)


def frame_image(img: Image.Image, config: EncoderConfig) -> Image.Image:
    """The geometry step of the evaluation transform: an RGB PIL image -> the PIL image the backbone sees."""
    from regis.models.geometry import is_aspect

    mode = _pil_mode(config.interpolation)
    frame = frame_of(config)
    if is_aspect(config):  # "aspect", or "center-crop+aspect" (the encoder takes the central square itself)
        return _aspect_resize(img, config, mode)
    if frame == "squash":
        size = (config.image_size, config.image_size)
        return img if img.size == size else img.resize(size, mode)
    if frame == "pad":
        return _pad_to_square(img, config, mode)
    w, h = _short_side_size(*img.size, config.resize_size)
    resized = img if (w, h) == img.size else img.resize((w, h), mode)
    return _center_crop(resized, config.image_size)


def eval_pixels(img: Image.Image, config: EncoderConfig) -> np.ndarray:
    """``eval_transform(config)(img)`` without torch.

    Args:
        img: an RGB PIL image (``regis.images.decode.decode_image``'s).
        config: the encoder's config.

    Returns:
        (3, H, W) float32 normalised pixels: (image_size, image_size), or for the "aspect" and
        "center-crop+aspect" frames of a CNN the size ``aspect_input_size`` gives.

    Raises:
        ConfigError: an interpolation PIL does not have.
    """
    framed = frame_image(img, config)
    arr = np.asarray(framed.convert("RGB"), dtype=np.uint8).astype(np.float32) / np.float32(255)
    mean = np.asarray(config.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(config.std, dtype=np.float32)[:, None, None]
    return (arr.transpose(2, 0, 1) - mean) / std


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic kernel (a = ``CUBIC_A``) at float32 ``x``, in float32."""
    x = np.abs(x)
    a = np.float32(CUBIC_A)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(np.float32)


def aa_bicubic_matrix(in_size: int, out_size: int) -> np.ndarray:
    """The (out_size, in_size) float32 matrix of a 1-D antialiased bicubic resize (align_corners=False): row i
    holds the normalised weights of output sample i, computed in float32 as torch's CPU kernel computes them for
    float32 images (in float64 they differ from torch's by up to 6e-6; in float32 by 2e-7 or less).

    Raises:
        ConfigError: a size < 1.
    """
    if in_size < 1 or out_size < 1:
        raise ConfigError(f"resize sizes must be >= 1, got {in_size} -> {out_size}")
    f = np.float32
    scale = f(in_size) / f(out_size)
    support = f(2) * scale if scale >= 1 else f(2)
    invscale = f(1) / scale if scale >= 1 else f(1)
    mat = np.zeros((out_size, in_size), dtype=np.float32)
    for i in range(out_size):
        centre = scale * (f(i) + f(0.5))
        lo = max(int(centre - support + f(0.5)), 0)
        hi = min(int(centre + support + f(0.5)), in_size)
        weights = _cubic((np.arange(lo, hi, dtype=np.float32) - centre + f(0.5)) * invscale)
        total = f(0)
        for w in weights:  # summed in order, in float32
            total = f(total + w)
        mat[i, lo:hi] = weights / total if total != 0 else weights
    return mat


def resize_aa_bicubic(images: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Antialiased bicubic resize of a batch, as ``F.interpolate(x, size=out_hw, mode="bicubic",
    align_corners=False, antialias=True)`` computes it.

    Args:
        images: (B, C, H, W) float32.
        out_hw: (height, width) of the output, pixels.

    Returns:
        (B, C, out_h, out_w) float32.
    """
    h, w = images.shape[-2:]
    rows, cols = aa_bicubic_matrix(h, out_hw[0]), aa_bicubic_matrix(w, out_hw[1])
    across = images @ cols.T  # width first, as torch's separable kernel does
    return np.ascontiguousarray(np.einsum("oh,bchw->bcow", rows, across, optimize=True), dtype=np.float32)
