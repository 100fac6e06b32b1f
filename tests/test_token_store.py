"""regis.indexes.store.TokenStore reads the rows asked for, in the order asked (repeats, gaps, several segments),
with ``pread``: the segment files are never memory-mapped, so re-scored rows do not count in the process's RSS
(issue 24). A truncated segment is an IndexFormatError, not a crash."""

from __future__ import annotations

import numpy as np
import pytest

from regis.errors import IndexFormatError
from regis.indexes.manifest import SegmentInfo
from regis.indexes.store import TOKEN_DTYPE, TokenStore, empty_locations

T, D = 3, 8


def _segments(tmp_path, sizes=(5, 0, 7)):
    """Segment files of ``sizes`` rows with distinct values, and locations of the images 0.. in order."""
    rng = np.random.default_rng(0)
    infos, arrays, locs = [], [], []
    for s, rows in enumerate(sizes):
        a = rng.standard_normal((rows, T, D)).astype(TOKEN_DTYPE)
        a.tofile(tmp_path / f"seg{s}.f16")
        infos.append(SegmentInfo(file=f"seg{s}.f16", rows=rows))
        arrays.append(a)
        locs += [(s, r) for r in range(rows)]
    locations = empty_locations(len(locs) + 2)  # two ids past the images: not live
    locations[: len(locs)] = locs
    return infos, np.concatenate(arrays), locations


def test_get_returns_rows_in_the_order_asked_across_segments(tmp_path):
    infos, expected, locations = _segments(tmp_path)
    store = TokenStore(tmp_path, infos, locations, T, D)
    ids = np.array([11, 0, 4, 4, 5, 2, 3, 10, 6, 0], dtype=np.int64)  # gaps, repeats, both segments, descending
    np.testing.assert_array_equal(store.get(ids), expected[ids])
    np.testing.assert_array_equal(store.get(np.zeros(0, np.int64)), np.zeros((0, T, D), TOKEN_DTYPE))
    chunks = list(store.iter_chunks(chunk_size=5))
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), expected)
    with pytest.raises(KeyError):
        store.get(np.array([12]))


def test_segments_are_read_not_memory_mapped(tmp_path):
    infos, expected, locations = _segments(tmp_path)
    store = TokenStore(tmp_path, infos, locations, T, D)
    store.get(np.arange(12))
    maps = open("/proc/self/maps").read()
    assert str(tmp_path) not in maps


def test_a_segment_truncated_after_opening_is_an_index_format_error(tmp_path):
    infos, _, locations = _segments(tmp_path)
    store = TokenStore(tmp_path, infos, locations, T, D)
    with open(tmp_path / "seg2.f16", "r+b") as f:
        f.truncate(2 * T * D * 2)  # rows 0 and 1 of 7 remain
    np.testing.assert_array_equal(store.get(np.array([5, 6])).shape, (2, T, D))
    with pytest.raises(IndexFormatError, match="ended before row"):
        store.get(np.array([11]))


def test_the_first_tokens_of_each_row_are_read_alone(tmp_path):
    """``get(ids, tokens=k)``: the first k tokens of each image (a two-framing index's centre crop), in the order
    asked, and only their bytes: a row cut short after its first token still reads with k = 1."""
    infos, expected, locations = _segments(tmp_path)
    store = TokenStore(tmp_path, infos, locations, T, D)
    ids = np.array([11, 0, 4, 4, 5, 2, 3, 10, 6, 0], dtype=np.int64)
    for k in (1, 2, T):
        got = store.get(ids, k)
        assert got.shape == (len(ids), k, D)
        np.testing.assert_array_equal(got, expected[ids, :k])
    for bad in (0, T + 1):
        with pytest.raises(ValueError, match="tokens must be"):
            store.get(ids, bad)
    with open(tmp_path / "seg2.f16", "r+b") as f:
        f.truncate((2 * T + 1) * D * 2)  # rows 0 and 1 of 7, and row 2's first token
    np.testing.assert_array_equal(store.get(np.array([7, 5]), 1), expected[[7, 5], :1])
    with pytest.raises(IndexFormatError, match="ended before row"):
        store.get(np.array([7]), 2)
