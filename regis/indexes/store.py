"""The token store: every image's T x D tokens as float16, read from immutable segment files.

``locations[image_id] = (segment index, row)`` says where an image's tokens are; (-1, -1) marks an id
that is not live (deleted, or never assigned).

Rows are read with ``pread`` (one call per run of consecutive rows), not through a memory map: the pages a
re-scoring touches then stay in the kernel's page cache without counting in the process's resident memory, and
the kernel's fault-around does not map 64 KB around each 5 KB row (BENCHMARKS.md section 9: RSS grew 6.4-9.3 KB
per image in file pages with memory maps).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from regis.errors import IndexFormatError
from regis.indexes.manifest import SegmentInfo

TOKEN_DTYPE = np.float16


def empty_locations(n: int = 0) -> np.ndarray:
    """(n, 2) int64 locations, all -1."""
    return np.full((n, 2), -1, dtype=np.int64)


class TokenStore:
    """Read access to the stored tokens of one index version.

    Args:
        segments_dir: the index's ``segments/`` folder.
        segments: the manifest's segment list; ``locations`` refers to it by position.
        locations: (next_id, 2) int64.
        tokens_per_image, dim: T and D.

    Raises:
        IndexFormatError: a segment file is missing or its size does not match rows x T x D float16.
    """

    def __init__(
        self, segments_dir: Path, segments: list[SegmentInfo], locations: np.ndarray, tokens_per_image: int, dim: int
    ):
        self.tokens_per_image = tokens_per_image
        self.dim = dim
        self.locations = locations
        self._row_bytes = tokens_per_image * dim * np.dtype(TOKEN_DTYPE).itemsize
        self._fds: list[int] = []  # one read-only descriptor per segment (-1: an empty segment)
        # closed when the store is collected, never earlier: a search still holding it keeps reading
        weakref.finalize(self, _close_all, self._fds)
        for seg in segments:
            path = Path(segments_dir) / seg.file
            expected = seg.rows * tokens_per_image * dim * np.dtype(TOKEN_DTYPE).itemsize
            try:
                size = path.stat().st_size
            except FileNotFoundError as exc:
                raise IndexFormatError(f"token segment {path} is missing") from exc
            if size != expected:
                raise IndexFormatError(f"token segment {path} has {size} bytes, expected {expected}")
            self._fds.append(os.open(path, os.O_RDONLY) if seg.rows else -1)
        self._live = np.flatnonzero(locations[:, 0] >= 0) if len(locations) else np.zeros(0, np.int64)

    @property
    def live_ids(self) -> np.ndarray:
        """(N,) int64 ids of the live images, ascending."""
        return self._live

    def __len__(self) -> int:
        return len(self._live)

    def is_live(self, ids: np.ndarray) -> np.ndarray:
        """(n,) bool: which of ``ids`` (int64, may hold -1 or ids past the end) are live images."""
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < len(self.locations))
        out = np.zeros(ids.shape, dtype=bool)
        out[ok] = self.locations[ids[ok], 0] >= 0
        return out

    def get(self, ids: np.ndarray, tokens: int | None = None) -> np.ndarray:
        """Tokens of live images.

        Args:
            ids: (n,) int64 live image ids.
            tokens: read only each image's first ``tokens`` tokens (None: all T). An image's row holds its
                framings one after the other (``EncoderConfig.framings``; "center-crop+aspect": the centre crop's
                T / 2 tokens first), so T / 2 reads one framing's: half the bytes, one ``pread`` per image.

        Returns:
            (n, T, D) float16 (``tokens``: (n, tokens, D)), in the order of ``ids``.

        Raises:
            KeyError: an id is not live.
            ValueError: ``tokens`` outside 1 .. T.
        """
        ids = np.asarray(ids, dtype=np.int64)
        width = self.tokens_per_image if tokens is None else int(tokens)
        if not 1 <= width <= self.tokens_per_image:
            raise ValueError(f"tokens must be 1 .. {self.tokens_per_image} per image, got {tokens}")
        if not self.is_live(ids).all():
            bad = ids[~self.is_live(ids)][:5].tolist()
            raise KeyError(f"image ids not in the index: {bad}")
        out = np.empty((len(ids), width, self.dim), dtype=TOKEN_DTYPE)
        locs = self.locations[ids]
        for seg_index in np.unique(locs[:, 0]):
            sel = np.flatnonzero(locs[:, 0] == seg_index)
            rows = locs[sel, 1]
            order = np.argsort(rows, kind="stable")  # ascending rows: runs of consecutive ones, one read each
            out[sel[order]] = self._read_rows(int(seg_index), rows[order], width)
        return out

    def _read_rows(self, seg_index: int, rows: np.ndarray, width: int | None = None) -> np.ndarray:
        """(n, width, D) float16: the first ``width`` tokens (None: all T) of ``rows`` (ascending, may repeat) of
        segment ``seg_index``: one read per run of consecutive rows, or per row when ``width`` < T.

        Raises:
            IndexFormatError: the segment file ended early (it was truncated after the store opened it).
        """
        fd = self._fds[seg_index]
        width = self.tokens_per_image if width is None else width
        if not len(rows):
            return np.empty((0, width, self.dim), dtype=TOKEN_DTYPE)
        unique, inverse = np.unique(rows, return_inverse=True)
        buf = np.empty((len(unique), width, self.dim), dtype=TOKEN_DTYPE)
        flat, size = memoryview(buf).cast("B"), width * self.dim * np.dtype(TOKEN_DTYPE).itemsize  # bytes per row
        if width < self.tokens_per_image:  # a part of each row: one read each
            starts, ends = np.arange(len(unique)), np.arange(1, len(unique) + 1)
        else:
            breaks = np.flatnonzero(np.diff(unique) != 1) + 1
            starts, ends = np.r_[0, breaks], np.r_[breaks, len(unique)]
        first = (unique[starts] * self._row_bytes).tolist()  # file offsets
        for start, end, offset in zip(starts.tolist(), ends.tolist(), first, strict=True):
            if not _pread_into(fd, flat[start * size:end * size], offset):
                raise IndexFormatError(f"token segment {seg_index} ended before row {int(unique[end - 1])}")
        return buf if len(unique) == len(rows) else buf[inverse.reshape(-1)]

    def iter_chunks(
        self, chunk_size: int = 8192, ids: np.ndarray | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (ids (c,), tokens (c, T, D) float16) over ``ids`` (default: every live image)."""
        ids = self._live if ids is None else np.asarray(ids, dtype=np.int64)
        for start in range(0, len(ids), chunk_size):
            part = ids[start : start + chunk_size]
            yield part, self.get(part)


def _pread_into(fd: int, view: memoryview, offset: int) -> bool:
    """Fill ``view`` (bytes) from ``fd`` at ``offset`` (bytes); False when the file ends first. One ``preadv``
    for the whole run (more only where the kernel returns less: past 2 GiB, or a signal), ``pread`` + copy where
    the platform has no ``preadv``."""
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:
            data = os.pread(fd, len(view) - done, offset + done)
            n = len(data)
            view[done : done + n] = data
        if n == 0:
            return False
        done += n
    return True


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)
