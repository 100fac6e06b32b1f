"""Decoding untrusted bytes: formats, EXIF orientation, modes, and clear errors."""

import io
import warnings

import numpy as np
import pytest
from PIL import Image

from regis.errors import ImageDecodeError, ImageTooLargeError
from regis.images.decode import decode_image
from tests.conftest import png_header_only


def _png(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_real_photo_decodes_to_rgb(photos_dir):
    out = decode_image(photos_dir / "skimage-camera.png")  # a grayscale photo
    assert out.image.mode == "RGB" and (out.width, out.height) == (512, 512)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 10, 20))  # blue stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif, quality=95)
    out = decode_image(buf.getvalue())
    assert out.image.size == (20, 40) and (out.width, out.height) == (20, 40)
    top = np.asarray(out.image)[2, 10]
    assert top[2] > 150 and top[0] < 100  # the blue stripe is now at the top


def test_gif_first_frame_and_transparency():
    frames = [Image.new("P", (8, 8), i) for i in (1, 2)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert decode_image(buf.getvalue()).image.mode == "RGB"
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert np.asarray(decode_image(_png(rgba)).image).min() == 255  # transparent -> white


def test_sixteen_bit_image_is_rescaled():
    arr = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    out = decode_image(_png(Image.fromarray(arr)))
    px = np.asarray(out.image)
    assert px.min() == 0 and px.max() == 255


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "empty"),
        (b"this is not an image at all", "not an image"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "(corrupt|not an image)"),
    ],
)
def test_bad_bytes_raise_clear_errors(data, match):
    with pytest.raises(ImageDecodeError, match=match):
        decode_image(data)


def test_truncated_jpeg(photos_dir):
    data = (photos_dir / "skimage-rocket.jpg").read_bytes()
    with pytest.raises(ImageDecodeError, match="corrupt or truncated"):
        decode_image(data[: len(data) // 3])


def test_decompression_bomb_is_refused_before_decoding():
    big = Image.new("L", (5000, 5000))
    buf = io.BytesIO()
    big.save(buf, format="PNG")  # ~25 kB of bytes, 25 Mpx once decoded
    with pytest.raises(ImageTooLargeError, match="pixels"):
        decode_image(buf.getvalue(), max_pixels=10_000_000)


def test_decoding_leaves_the_process_warning_filters_alone(monkeypatch):
    """``warnings.catch_warnings`` swaps the process-wide filter list and is not thread-safe: a decode in a worker
    thread that entered one undid FastAPI's own suppression in the event-loop thread (an
    UnsupportedFieldAttributeWarning in ``make test``, tests/faults/test_collection_delete.py). The decode (fault
    point: Pillow's ``Image.open``) must run under the process's filters as they are."""
    inside = []
    real = Image.open

    def spy(*args, **kwargs):
        inside.append(list(warnings.filters))
        return real(*args, **kwargs)

    monkeypatch.setattr(Image, "open", spy)
    before = list(warnings.filters)
    decode_image(_png(Image.new("RGB", (8, 8))))
    assert inside == [before] and list(warnings.filters) == before


@pytest.mark.parametrize("action", ["ignore", "error"])
def test_an_image_past_pillows_bomb_limit_is_refused_whatever_the_warning_filters(action):
    """With ``max_pixels`` above Pillow's ``MAX_IMAGE_PIXELS``, an image between that and twice it (where Pillow
    only warns) is refused as a possible decompression bomb, whether the process ignores that warning or not."""
    width = 10_000
    data = png_header_only(width, Image.MAX_IMAGE_PIXELS // width + 1)
    with warnings.catch_warnings():
        warnings.simplefilter(action, Image.DecompressionBombWarning)
        with pytest.raises(ImageTooLargeError, match="decompression bomb"):
            decode_image(data, max_pixels=4 * Image.MAX_IMAGE_PIXELS)
