"""Where the encoder's patch grid lies in the original image: grid cells -> original pixels.

The evaluation transform (``regis.models.transforms.eval_transform``) makes an ``image_size`` square input as
the encoder config's ``frame`` says (configs without the field: "center-crop"):

- "center-crop": the shorter side resized to ``resize_size`` pixels (the longer side to
  ``int(resize_size * long / short)``, as torchvision does), then the central ``image_size`` square (the crop
  starts at ``round((resized - image_size) / 2)``);
- "squash": the whole frame resized to the square;
- "pad": the whole frame scaled by ``image_size / max(w, h)`` to ``round(w * s) x round(h * s)`` and pasted at
  ``((image_size - nw) // 2, (image_size - nh) // 2)`` on a mean-colour square;
- "aspect" (CNNs): the whole frame, aspect ratio kept, no square: scaled by
  ``s = min(image_size / short, ASPECT_MAX_RATIO * image_size / long)`` (the short side at ``image_size``, the
  long side at most ``ASPECT_MAX_RATIO`` times that; a longer panorama gets a smaller short side, down to
  ``ASPECT_MIN_SHORT`` times ``image_size``: a strip past 4:1 is squeezed along its length), each side then
  rounded to a multiple of the CNN's stride (32 px, at least 32) so that the feature map tiles the input exactly
  (``aspect_input_size``). The ROI pass scales that input by ``roi_image_size / image_size``, again rounded to
  the stride (``roi_input_size``). The input is the whole image, so a grid cell is ``width / w`` x
  ``height / h`` original pixels and the patch grid of an image follows from its size alone (``image_grids``).
  For ViTs "aspect" is "pad" (a fixed square of patches).
- "center-crop+aspect" (CNNs): two framings per image from the one "aspect" input: the central square of that
  input (side ``min(W, H)``, resized to ``image_size`` when the short side is not that: panoramas past 2:1), read
  like a centre crop, and the whole input, as "aspect". Its first tokens (and buddies) are the square's, on the
  square grid (``nominal_grid``), in ``crop_region``; the rest the whole input's, on the image's own grid.

The backbone sees the square as an h x w grid of patches, each ``image_size / h`` x ``image_size / w`` input
pixels. These functions invert the chain, so a ROI token's N x N window (``window_bounds``)
can be drawn on the image a person uploaded. Tested against the transform itself (a painted cell lands on its
grid cell; a bright square's ROI box covers it: tests/test_explain.py).
"""

from __future__ import annotations

import math
from typing import Protocol

from regis.errors import ConfigError
from regis.models.config import BORDER_MODES, TWO_FRAMINGS, check_roi_size


class EncoderConfig(Protocol):
    """The fields of ``regis.models.encoder.EncoderConfig`` these functions read (not imported: the encoder
    imports this module)."""

    kind: str
    image_size: int
    resize_size: int
    roi_image_size: int | None
    token_set: str
    frame: str

Box = tuple[float, float, float, float]
CNN_STRIDE = 32  # a CNN backbone's output stride: one feature-map cell per 32 x 32 input pixels
ASPECT_MAX_RATIO = 2.0  # "aspect" frame: the long side at most this times ``image_size``
ASPECT_MIN_SHORT = 0.5  # ... and the short side at least this times (rounded to the stride)


def is_aspect(config: EncoderConfig) -> bool:
    """Whether ``config`` feeds the whole, non-square image ("aspect" frame on a CNN, alone or with the centre
    crop of ``TWO_FRAMINGS``)."""
    return getattr(config, "frame", "center-crop") in ("aspect", TWO_FRAMINGS) and config.kind == "cnn"


def is_two_framings(config: EncoderConfig) -> bool:
    """Whether ``config`` encodes each image twice: its central square and the whole image (``TWO_FRAMINGS``)."""
    return getattr(config, "frame", "center-crop") == TWO_FRAMINGS and config.kind == "cnn"


def central_square(in_width: int, in_height: int) -> tuple[int, int, int]:
    """The central square of an ``in_width`` x ``in_height`` input: (left, top, side) in input pixels."""
    side = min(in_width, in_height)
    return (in_width - side) // 2, (in_height - side) // 2, side


def crop_region(config: EncoderConfig, width: int, height: int) -> Box:
    """The part of a ``width`` x ``height`` image that the centre-crop framing of ``TWO_FRAMINGS`` shows: the
    central square of its "aspect" input (``aspect_input_size``), in the image's pixels (x0, y0, x1, y1), float,
    ends exclusive.

    Raises:
        ConfigError: a non-positive size.
    """
    iw, ih = aspect_input_size(config, width, height)
    left, top, side = central_square(iw, ih)
    sx, sy = width / iw, height / ih
    return left * sx, top * sy, (left + side) * sx, (top + side) * sy


def _to_stride(x: float) -> int:
    """``x`` pixels to the nearest multiple of ``CNN_STRIDE`` (halves up; float noise ignored), at least one."""
    return max(CNN_STRIDE, CNN_STRIDE * math.floor(round(x / CNN_STRIDE, 6) + 0.5))


def aspect_input_size(config: EncoderConfig, width: int, height: int) -> tuple[int, int]:
    """The "aspect" frame's input size for a ``width`` x ``height`` image (module docstring).

    Returns:
        (input width, input height), pixels, multiples of ``CNN_STRIDE``; e.g. 224 px, 2:3 portrait 400 x 600 ->
        (224, 352); a 16:9 panorama 1920 x 1080 -> (384, 224); a 4:1 strip 2000 x 500 -> (448, 128); a 30:1 strip
        3000 x 100 -> (448, 128) as well.

    Raises:
        ConfigError: a non-positive size.
    """
    if width < 1 or height < 1:
        raise ConfigError(f"image size must be positive, got {width} x {height}")
    size = config.image_size
    scale = min(size / min(width, height), ASPECT_MAX_RATIO * size / max(width, height))
    w, h = _to_stride(width * scale), _to_stride(height * scale)
    floor = _to_stride(ASPECT_MIN_SHORT * size)  # a strip past 4:1 is squeezed along its length instead
    return (max(w, floor), h) if width < height else (w, max(h, floor))


def roi_input_size(config: EncoderConfig, in_width: int, in_height: int) -> tuple[int, int]:
    """The "aspect" frame's ROI-pass input (``EncoderConfig.roi_image_size``) for an input of ``in_width`` x
    ``in_height`` pixels: scaled by ``roi_image_size / image_size``, sides rounded to multiples of ``CNN_STRIDE``
    (224 x 352 -> 160 x 256)."""
    ratio = config.roi_image_size / config.image_size
    return _to_stride(in_width * ratio), _to_stride(in_height * ratio)


def image_grids(config: EncoderConfig, width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """An "aspect" CNN's patch grids for a ``width`` x ``height`` image: ((h, w) of the main pass, (h, w) of the
    pass the ROI tokens and buddy patches come from; the main pass's when there is no ROI pass).

    Raises:
        ConfigError: the config is not an "aspect" CNN, or a non-positive size.
    """
    if not is_aspect(config):
        raise ConfigError("patch grids follow from the image size only for the aspect frame of a CNN")
    iw, ih = aspect_input_size(config, width, height)
    main = (ih // CNN_STRIDE, iw // CNN_STRIDE)
    if config.roi_image_size is None or config.token_set != "cls+reg+roi":
        return main, main
    rw, rh = roi_input_size(config, iw, ih)
    return main, (rh // CNN_STRIDE, rw // CNN_STRIDE)


def nominal_grid(config: EncoderConfig) -> tuple[int, int]:
    """The buddy grid an "aspect" CNN's index records in its manifest: the ROI grid of a square image. Its
    images' buddy patches index each image's own ROI grid (``image_grids``), which ``buddy_grid`` recovers."""
    return image_grids(config, 1, 1)[1]


def buddy_grid(config: EncoderConfig, grid: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """The grid a ``width`` x ``height`` image's buddy patches index: ``grid`` (the encoder's or the index's),
    except for an "aspect" CNN, where each image has its own (``image_grids``)."""
    return image_grids(config, width, height)[1] if is_aspect(config) else (int(grid[0]), int(grid[1]))


def input_region(config: EncoderConfig, width: int, height: int) -> Box:
    """The part of a ``width`` x ``height`` image that the encoder's square input shows (``TWO_FRAMINGS``: its
    whole-image framing's, the whole image).

    Args:
        config: the encoder config (``frame``, ``resize_size``, ``image_size``).
        width, height: the image's size, pixels (after EXIF orientation).

    Returns:
        (x0, y0, x1, y1) in the image's pixels, float, ends exclusive; padding ("pad" frame, or a crop larger
        than the resized image) falls outside [0, width] x [0, height].

    Raises:
        ConfigError: a non-positive size or an unknown frame.
    """
    if width < 1 or height < 1:
        raise ConfigError(f"image size must be positive, got {width} x {height}")
    frame = getattr(config, "frame", "center-crop")
    size = config.image_size
    if frame == TWO_FRAMINGS:  # its second framing spans the whole image (the first: ``crop_region``)
        frame = "aspect"
    if frame == "aspect":
        if config.kind == "cnn":
            return 0.0, 0.0, float(width), float(height)
        frame = "pad"
    if frame == "squash":
        return 0.0, 0.0, float(width), float(height)
    if frame == "pad":
        scale = size / max(width, height)
        nw, nh = max(1, round(width * scale)), max(1, round(height * scale))
        ox, oy = (size - nw) // 2, (size - nh) // 2
        sx, sy = width / nw, height / nh
        return -ox * sx, -oy * sy, (size - ox) * sx, (size - oy) * sy
    if frame != "center-crop":
        raise ConfigError(f"unknown frame {frame!r}")
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = config.resize_size, int(config.resize_size * long / short)
    rw, rh = (new_short, new_long) if width <= height else (new_long, new_short)
    crop = config.image_size
    left, top = int(round((rw - crop) / 2.0)), int(round((rh - crop) / 2.0))
    sx, sy = width / rw, height / rh
    return left * sx, top * sy, (left + crop) * sx, (top + crop) * sy


def grid_box(config: EncoderConfig, grid: tuple[int, int], window: tuple[int, int, int, int],
             width: int, height: int, region: Box | None = None) -> Box:
    """The pixels of a ``width`` x ``height`` image that a window of the patch grid covers.

    Args:
        config: the encoder config.
        grid: (h, w) patch grid of the encoder's input.
        window: (row0, row1, col0, col1) on the grid, ends exclusive (``window_bounds``).
        width, height: the image's size, pixels.
        region: the image pixels the grid spans (default ``input_region``; ``crop_region`` for the centre-crop
            framing of ``TWO_FRAMINGS``).

    Returns:
        (x0, y0, x1, y1) in the image's pixels, float, ends exclusive, clipped to the image.
    """
    h, w = grid
    r0, r1, c0, c1 = window
    x0, y0, x1, y1 = region or input_region(config, width, height)
    cw, ch = (x1 - x0) / w, (y1 - y0) / h
    box = (x0 + c0 * cw, y0 + r0 * ch, x0 + c1 * cw, y0 + r1 * ch)
    return max(box[0], 0.0), max(box[1], 0.0), min(box[2], float(width)), min(box[3], float(height))


def window_span(centre: int, n: int, size: int, border: str) -> tuple[int, int]:
    """[lo, hi) of the N-wide window centred on ``centre`` along an axis of ``size`` cells ("clip": cut at the
    ends; "shift": slid inside while the axis is at least N long)."""
    half = n // 2
    lo, hi = centre - half, centre + half + 1
    if border == "shift":
        if lo < 0:
            lo, hi = 0, min(n, size)
        elif hi > size:
            lo, hi = max(0, size - n), size
    return max(lo, 0), min(hi, size)


def window_bounds(buddy: int, grid: tuple[int, int], n: int, border: str = "clip") -> tuple[int, int, int, int]:
    """The patch window a ROI token averages, as grid bounds.

    Args:
        buddy: the buddy patch, row-major index in [0, h * w).
        grid: (h, w) patch grid.
        n: window size N (odd, >= 1).
        border: "clip" or "shift", as in ``roi_tokens``.

    Returns:
        (row0, row1, col0, col1): rows row0..row1 - 1 and columns col0..col1 - 1 of the grid (ends exclusive),
        exactly the patches ``window_matrix`` gives weight to.

    Raises:
        ConfigError: bad N / border, or ``buddy`` outside the grid.
    """
    check_roi_size(n)
    if border not in BORDER_MODES:
        raise ConfigError(f"border must be one of {BORDER_MODES}, got {border!r}")
    h, w = int(grid[0]), int(grid[1])
    if not 0 <= buddy < h * w:
        raise ConfigError(f"buddy patch {buddy} lies outside a {h} x {w} grid")
    r, c = divmod(int(buddy), w)
    r0, r1 = window_span(r, n, h, border)
    c0, c1 = window_span(c, n, w, border)
    return r0, r1, c0, c1
