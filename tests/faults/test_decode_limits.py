"""Decoding at the pixel limit: peak memory of a 16-bit PNG (measured, not timed), and how many decodes run at
once (issue 14, fault 3)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

_MAKE = """
import sys, numpy as np
from PIL import Image
side = int(sys.argv[2])
a = np.zeros((side, side), np.uint16)
a[: side // 2, : side // 2] = 65535  # two levels: the rescale has work to do
Image.fromarray(a).save(sys.argv[1], format="PNG", optimize=False)
"""

_DECODE = """
import resource, sys
from regis.images.decode import decode_image
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
decoded = decode_image(data, max_pixels=64_000_000, draft_size=int(sys.argv[2]))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert decoded.image.mode == "RGB" and decoded.width == decoded.height
print((after - before) // 1024, decoded.image.size[0])
"""


@pytest.mark.slow
def test_a_16_bit_png_at_the_pixel_limit_decodes_within_a_memory_ceiling(tmp_path):
    """8000 x 8000 16-bit grey (64 Mpx, the default limit; 128 MB as stored): the decode's peak RSS growth is
    measured in a fresh process. Through float64 it was about +1.2 GB; the ceiling is 600 MB (the 16-bit
    pixels, one uint8 copy, the reduced RGB image and the interpreter's slack)."""
    png = tmp_path / "deep.png"
    subprocess.run([sys.executable, "-c", _MAKE, str(png), "8000"], check=True, timeout=120)
    assert png.stat().st_size < 2_000_000  # a small file: the cost is all in the decode
    out = subprocess.run([sys.executable, "-c", _DECODE, str(png), "224"], check=True, timeout=120,
                         capture_output=True, text=True).stdout.split()
    grew_mb, side = int(out[0]), int(out[1])
    assert side >= 224  # reduced like a JPEG draft, never below the encoder's input size
    assert grew_mb < 600, f"decoding grew the peak RSS by {grew_mb} MB"


def test_16_bit_and_float_images_keep_their_contrast():
    import numpy as np
    from PIL import Image

    from regis.images.decode import _to_rgb

    a = np.zeros((64, 64), np.uint16)
    a[:, 32:] = 1000  # a dim 16-bit image: stretched to the full 8-bit range
    rgb = np.asarray(_to_rgb(Image.fromarray(a)))
    assert rgb.dtype == np.uint8 and rgb[0, 0, 0] == 0 and rgb[0, 63, 0] == 255
    f = np.full((8, 8), np.nan, np.float32)
    f[:, 4:] = 2.5
    f[:, :2] = -1.0
    rgb = np.asarray(_to_rgb(Image.fromarray(f, mode="F")))
    assert rgb[0, 0, 0] == 0 and rgb[0, 7, 0] == 255 and rgb[0, 2, 0] == 0  # NaN -> 0, no warning, no error


def test_concurrent_decodes_are_bounded(monkeypatch):
    """Eight threads decode at once with a bound of 2: never more than 2 inside the decoder."""
    from regis.images import decode as decode_mod

    inside, peak, lock = 0, 0, threading.Lock()
    real = decode_mod._decode

    def slow_decode(*args):
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        time.sleep(0.05)
        try:
            return real(*args)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(decode_mod, "_decode", slow_decode)
    decode_mod.set_max_concurrent_decodes(2)
    try:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (32, 32), "red").save(buf, format="PNG")
        threads = [threading.Thread(target=decode_mod.decode_image, args=(buf.getvalue(),)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert peak == 2
        with pytest.raises(ValueError):
            decode_mod.set_max_concurrent_decodes(0)
    finally:
        decode_mod.set_max_concurrent_decodes(decode_mod.DEFAULT_MAX_CONCURRENT_DECODES)
