"""The thumbnail cache of an index: where thumbnails are kept, how many, and how they go.

``INDEX_DIR/thumbnails/ab/<sha256>-<size>.<ext>``: by content (the same bytes give the same thumbnail in every
index version), in one of ``SIZES`` (a request's size is rounded up to the next: 5 sizes x 2 formats per image at
most, where any size from 16 to 1024 used to be a file of its own: 402 files, 17 MB, for one image), within a
byte budget kept least-recently-used first (``ThumbnailCache``), and removed with their image
(``remove_thumbnails``, called by deletes; ``stale_thumbnails`` finds those of images no longer indexed). Making a
thumbnail (decoding, resizing) is the service's part (``service.thumbnails``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from regis.indexes.layout import write_bytes_atomic

CACHE_DIR = "thumbnails"
SIZES = (64, 128, 256, 512, 1024)  # longest side, pixels
EXTENSIONS = {"jpeg": "jpg", "webp": "webp"}
_NAME = re.compile(r"^([0-9a-f]{64})-([0-9]{2,4})\.(jpg|webp)$")
log = logging.getLogger("regis.thumbnails")


def cache_size(requested: int) -> int:
    """The cached size serving a request for ``requested`` px: the smallest of ``SIZES`` at least that big (the
    largest for anything bigger)."""
    return next((s for s in SIZES if s >= requested), SIZES[-1])


def cache_path(folder: Path, sha256: str, size: int, fmt: str) -> Path:
    """Where the thumbnail of content ``sha256`` at ``size`` px in format ``fmt`` ("jpeg", "webp") is cached."""
    return Path(folder) / sha256[:2] / f"{sha256}-{size}.{EXTENSIONS[fmt]}"


def cached_files(folder: Path) -> Iterable[tuple[Path, str]]:
    """(file, sha256) of every cached thumbnail in ``folder`` (temporary files left out)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for sub in folder.iterdir():
        if len(sub.name) != 2 or not sub.is_dir():
            continue
        for p in sub.iterdir():
            m = _NAME.match(p.name)
            if m is not None:
                yield p, m.group(1)


def remove_thumbnails(index_dir: Path | str, sha256s: Iterable[str]) -> int:
    """Remove the cached thumbnails of these contents (their images were deleted); returns how many files went.
    Best effort: a thumbnail that stays is only disk space, and is made again if asked for."""
    folder = Path(index_dir) / CACHE_DIR
    removed = 0
    for sha in set(sha256s):
        for size in SIZES:
            for ext in EXTENSIONS.values():
                try:
                    (folder / sha[:2] / f"{sha}-{size}.{ext}").unlink()
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("could not remove a thumbnail of %s: %s", sha[:12], exc)
    return removed


def stale_thumbnails(index_dir: Path | str, live_sha256s: set[str]) -> list[Path]:
    """The cached thumbnails of contents no live image has (deleted while nobody cleaned up)."""
    return [p for p, sha in cached_files(Path(index_dir) / CACHE_DIR) if sha not in live_sha256s]


class ThumbnailCache:
    """Thumbnails on disk within ``max_bytes``, least recently used evicted first. Thread-safe; the recency of a
    file is its mtime (touched on every hit), so a restarted service (or another replica) keeps the order.

    Args:
        folder: the cache folder (``INDEX_DIR/thumbnails``).
        max_bytes: the budget, bytes (0: nothing is cached).
    """

    def __init__(self, folder: Path, max_bytes: int):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._files: OrderedDict[Path, int] | None = None  # oldest first
        self._total = 0
        self._lock = threading.Lock()

    @property
    def total_bytes(self) -> int:
        """Bytes of the cached files this cache knows of."""
        with self._lock:
            self._scan()
            return self._total

    def _scan(self) -> None:
        if self._files is not None:
            return
        found = []
        for p, _ in cached_files(self.folder):
            try:
                st = p.stat()
            except OSError:
                continue
            found.append((st.st_mtime, p, st.st_size))
        found.sort()
        self._files = OrderedDict((p, size) for _, p, size in found)
        self._total = sum(self._files.values())

    def get(self, path: Path) -> bytes | None:
        """A cached thumbnail's bytes (marked just used), None when it is not cached."""
        try:
            data = path.read_bytes()
        except OSError:
            with self._lock:
                if self._files is not None and path in self._files:
                    self._total -= self._files.pop(path)
            return None
        with self._lock:
            self._scan()
            if path in self._files:
                self._files.move_to_end(path)
            else:  # written by another process
                self._files[path] = len(data)
                self._total += len(data)
        try:
            os.utime(path)
        except OSError:
            pass
        return data

    def put(self, path: Path, data: bytes) -> None:
        """Cache a thumbnail, then evict the least recently used ones past the budget. A folder that cannot be
        written (read-only, or its index deleted) caches nothing."""
        if self.max_bytes <= 0 or len(data) > self.max_bytes:
            return
        try:
            if not self.folder.parent.is_dir():  # the index (a deleted collection?) is gone: never recreate it
                return
            self.folder.mkdir(exist_ok=True)
            path.parent.mkdir(exist_ok=True)
            write_bytes_atomic(path, data)
        except OSError:
            return
        with self._lock:
            self._scan()
            self._total += len(data) - self._files.pop(path, 0)
            self._files[path] = len(data)
            while self._total > self.max_bytes and len(self._files) > 1:
                oldest, size = self._files.popitem(last=False)
                self._total -= size
                try:
                    oldest.unlink()
                except OSError:
                    pass
