"""Thumbnails: a small JPEG / WebP of an indexed image, made once and cached on disk by content (SHA-256, size,
format): ``INDEX_DIR/thumbnails/ab/<sha256>-<size>.<ext>``. The same bytes give the same thumbnail in every index
version, so the cache needs no invalidation; a changed file has another SHA-256."""

from __future__ import annotations

import io
from pathlib import Path

from regis.images.decode import decode_image
from regis.indexes.layout import write_bytes_atomic

CACHE_DIR = "thumbnails"
CACHE_CONTROL = "private, max-age=86400"
_EXT = {"jpeg": "jpg", "webp": "webp"}


def etag(sha256: str, size: int, fmt: str) -> str:
    """The strong ETag of a thumbnail (its content is a function of these three)."""
    return f'"{sha256[:32]}-{size}-{fmt}"'


def thumbnail(source: Path, sha256: str, size: int, fmt: str, cache_dir: Path, max_pixels: int) -> bytes:
    """The thumbnail's bytes (longest side ``size`` px, never enlarged), from the cache or made and cached.

    Raises:
        ImageDecodeError: the source no longer decodes.
    """
    cached = cache_dir / sha256[:2] / f"{sha256}-{size}.{_EXT[fmt]}"
    try:
        return cached.read_bytes()
    except FileNotFoundError:
        pass
    image = decode_image(source, max_pixels=max_pixels, draft_size=size).image
    image.thumbnail((size, size))
    buf = io.BytesIO()
    image.save(buf, format="JPEG" if fmt == "jpeg" else "WEBP", quality=82)
    data = buf.getvalue()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(cached, data)
    except OSError:  # a read-only index folder: serve it uncached
        pass
    return data


__all__ = ["CACHE_CONTROL", "CACHE_DIR", "etag", "thumbnail"]
