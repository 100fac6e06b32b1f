"""The token store: every image's T x D tokens as float16, memory-mapped from immutable segment files.

``locations[image_id] = (segment index, row)`` says where an image's tokens are; (-1, -1) marks an id
that is not live (deleted, or never assigned).
"""

from __future__ import annotations

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
        self.segments: list[np.ndarray] = []
        for seg in segments:
            path = Path(segments_dir) / seg.file
            expected = seg.rows * tokens_per_image * dim * np.dtype(TOKEN_DTYPE).itemsize
            try:
                size = path.stat().st_size
            except FileNotFoundError as exc:
                raise IndexFormatError(f"token segment {path} is missing") from exc
            if size != expected:
                raise IndexFormatError(f"token segment {path} has {size} bytes, expected {expected}")
            if seg.rows == 0:
                self.segments.append(np.zeros((0, tokens_per_image, dim), TOKEN_DTYPE))
            else:
                self.segments.append(
                    np.memmap(path, dtype=TOKEN_DTYPE, mode="r", shape=(seg.rows, tokens_per_image, dim))
                )
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

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Tokens of live images.

        Args:
            ids: (n,) int64 live image ids.

        Returns:
            (n, T, D) float16, in the order of ``ids``.

        Raises:
            KeyError: an id is not live.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if not self.is_live(ids).all():
            bad = ids[~self.is_live(ids)][:5].tolist()
            raise KeyError(f"image ids not in the index: {bad}")
        out = np.empty((len(ids), self.tokens_per_image, self.dim), dtype=TOKEN_DTYPE)
        locs = self.locations[ids]
        for seg_index in np.unique(locs[:, 0]):
            sel = np.flatnonzero(locs[:, 0] == seg_index)
            rows = locs[sel, 1]
            order = np.argsort(rows, kind="stable")  # sequential reads from the memory map
            out[sel[order]] = self.segments[seg_index][rows[order]]
        return out

    def iter_chunks(
        self, chunk_size: int = 8192, ids: np.ndarray | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (ids (c,), tokens (c, T, D) float16) over ``ids`` (default: every live image)."""
        ids = self._live if ids is None else np.asarray(ids, dtype=np.int64)
        for start in range(0, len(ids), chunk_size):
            part = ids[start : start + chunk_size]
            yield part, self.get(part)
