"""Thumbnails: a small JPEG / WebP of an indexed image, made on demand and cached on disk by content, in a few
fixed sizes and within a byte budget (``regis.indexes.thumbnails``: layout, sizes, LRU eviction, clean-up on
delete). The same bytes give the same thumbnail in every index version, so the cache needs no invalidation; a
changed file has another SHA-256."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from regis.errors import ImageDecodeError
from regis.images.decode import decode_image
from regis.indexes.thumbnails import CACHE_DIR, SIZES, ThumbnailCache, cache_path, cache_size

CACHE_CONTROL = "private, max-age=86400"
_caches: dict[tuple[Path, int], ThumbnailCache] = {}
_caches_lock = threading.Lock()


def etag(sha256: str, size: int, fmt: str) -> str:
    """The strong ETag of a thumbnail (its content is a function of these three)."""
    return f'"{sha256[:32]}-{size}-{fmt}"'


def cache_for(index_dir: Path, max_bytes: int) -> ThumbnailCache:
    """The process's thumbnail cache of an index directory (one per folder and budget, made on first use)."""
    key = (Path(index_dir) / CACHE_DIR, max_bytes)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = ThumbnailCache(key[0], max_bytes)
        return cache


def thumbnail(source: Path, sha256: str, size: int, fmt: str, cache: ThumbnailCache, max_pixels: int) -> bytes:
    """The thumbnail's bytes (longest side ``size`` px, one of ``SIZES``, never enlarged), from the cache or made
    and cached.

    Raises:
        FileNotFoundError: the source is gone (its image deleted since it was looked up: the route answers 404).
        ImageDecodeError: the source no longer decodes, or cannot be read.
    """
    cached = cache_path(cache.folder, sha256, size, fmt)
    data = cache.get(cached)
    if data is not None:
        return data
    try:  # read here, not in decode_image: a file deleted under the request is not a bad image (400)
        raw = Path(source).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ImageDecodeError(f"cannot read file: {exc.strerror or type(exc).__name__}") from exc
    image = decode_image(raw, max_pixels=max_pixels, draft_size=size).image
    image.thumbnail((size, size))
    buf = io.BytesIO()
    image.save(buf, format="JPEG" if fmt == "jpeg" else "WEBP", quality=82)
    data = buf.getvalue()
    cache.put(cached, data)
    return data


__all__ = ["CACHE_CONTROL", "CACHE_DIR", "SIZES", "cache_for", "cache_size", "etag", "thumbnail"]
