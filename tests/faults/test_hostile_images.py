"""A hostile-image corpus through both search and upload (issue 14): decompression bombs at and past the pixel
limit, 16-bit, CMYK, RGBA, palette with transparency, multi-frame, EXIF-rotated, truncated, SVG, and formats
Pillow opens that regis does not claim. Every answer is a 2xx or a 4xx with a JSON error, never a 5xx, and
the server keeps serving."""

from __future__ import annotations

import io

import numpy as np
import pytest
from deploy.support import TINY
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.settings import Settings
from tests.conftest import png_header_only

MAX_PIXELS = 1_000_000


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _corpus() -> dict[str, tuple[bytes, int, int]]:
    """name -> (bytes, status of POST /v1/search, status of POST /v1/images)."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    frames = [Image.new("P", (40, 30), i) for i in range(3)]
    deep = np.zeros((40, 50), np.uint16)
    deep[:, 25:] = 40000
    jpeg = _save(rgb, "JPEG")
    return {
        "at-limit-grey.png": (_save(Image.new("L", (1000, 1000), 128), "PNG"), 200, 201),
        "past-limit-header.png": (png_header_only(1001, 1000), 413, 413),
        "huge-header.png": (png_header_only(100_000, 100_000), 413, 413),
        "16-bit.png": (_save(Image.fromarray(deep), "PNG"), 200, 201),
        "cmyk.jpg": (_save(rgb.convert("CMYK"), "JPEG"), 200, 201),
        "rgba.png": (_save(rgb.convert("RGBA"), "PNG"), 200, 201),
        "palette-transparent.png": (_save(rgb.convert("P"), "PNG", transparency=0), 200, 201),
        "multi-frame.gif": (_save(frames[0], "GIF", save_all=True, append_images=frames[1:]), 200, 201),
        "exif-rotated.jpg": (_save(rgb, "JPEG", exif=exif), 200, 201),
        "float.tif": (_save(Image.fromarray(rng.random((30, 40), dtype=np.float32), mode="F"), "TIFF"), 200, 201),
        "truncated.jpg": (jpeg[: len(jpeg) // 2], 400, 400),
        "truncated-header.png": (_save(rgb, "PNG")[:30], 400, 400),
        "svg.svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10"/></svg>',
                    400, 400),
        # formats Pillow opens but regis does not store: a query may use them, an upload is refused (415)
        "pcx.pcx": (_save(rgb, "PCX"), 200, 415),
        "ico.ico": (_save(rgb, "ICO"), 200, 415),
        "tga.tga": (_save(rgb, "TGA"), 200, 415),
        "ppm.ppm": (_save(rgb, "PPM"), 200, 415),
        "empty": (b"", 400, 400),
        "text": (b"hello, not an image", 400, 400),
    }


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "images").mkdir()
    settings = Settings(index_dir=tmp / "index", images_root=tmp / "images", enable_jobs=True, max_pixels=MAX_PIXELS,
                        max_upload_bytes=5_000_000, **TINY)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/images", files={"files": ("seed.png", _save(Image.new("RGB", (32, 32), "red"), "PNG"))})
        assert r.status_code == 201, r.text
        yield c


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_hostile_images_through_search_and_upload(client, name):
    data, *expected = _corpus()[name]
    for (route, field), status in zip((("/v1/search", "file"), ("/v1/images", "files")), expected, strict=True):
        r = client.post(route, files={field: (name, data, "application/octet-stream")})
        assert r.status_code == status, (route, r.status_code, r.text)
        if r.status_code >= 400:
            assert set(r.json()["error"]) >= {"code", "message"}
            assert "Traceback" not in r.text
    assert client.get("/healthz").status_code == 200
