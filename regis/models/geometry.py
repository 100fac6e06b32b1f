"""Where the encoder's patch grid lies in the original image: grid cells -> original pixels.

The evaluation transform (``regis.models.transforms.eval_transform``) makes an ``image_size`` square input as
the encoder config's ``frame`` says (configs without the field: "center-crop"):

- "center-crop": the shorter side resized to ``resize_size`` pixels (the longer side to
  ``int(resize_size * long / short)``, as torchvision does), then the central ``image_size`` square (the crop
  starts at ``round((resized - image_size) / 2)``);
- "squash": the whole frame resized to the square;
- "pad": the whole frame scaled by ``image_size / max(w, h)`` to ``round(w * s) x round(h * s)`` and pasted at
  ``((image_size - nw) // 2, (image_size - nh) // 2)`` on a mean-colour square.

The backbone sees the square as an h x w grid of patches, each ``image_size / h`` x ``image_size / w`` input
pixels. These functions invert the chain, so a ROI token's N x N window (``regis.models.roi.window_bounds``)
can be drawn on the image a person uploaded. Tested against the transform itself (a painted cell lands on its
grid cell; a bright square's ROI box covers it: tests/test_explain.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from regis.errors import ConfigError

if TYPE_CHECKING:
    from regis.models.encoder import EncoderConfig

Box = tuple[float, float, float, float]


def input_region(config: EncoderConfig, width: int, height: int) -> Box:
    """The part of a ``width`` x ``height`` image that the encoder's square input shows.

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
             width: int, height: int) -> Box:
    """The pixels of a ``width`` x ``height`` image that a window of the patch grid covers.

    Args:
        config: the encoder config.
        grid: (h, w) patch grid of the encoder's input.
        window: (row0, row1, col0, col1) on the grid, ends exclusive (``regis.models.roi.window_bounds``).
        width, height: the image's size, pixels.

    Returns:
        (x0, y0, x1, y1) in the image's pixels, float, ends exclusive, clipped to the image.
    """
    h, w = grid
    r0, r1, c0, c1 = window
    x0, y0, x1, y1 = input_region(config, width, height)
    cw, ch = (x1 - x0) / w, (y1 - y0) / h
    box = (x0 + c0 * cw, y0 + r0 * ch, x0 + c1 * cw, y0 + r1 * ch)
    return max(box[0], 0.0), max(box[1], 0.0), min(box[2], float(width)), min(box[3], float(height))
