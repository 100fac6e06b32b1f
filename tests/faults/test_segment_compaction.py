"""Every write adds a token segment; without merging, an index written 54 times held 54 segments and every open
version one descriptor per segment, until EMFILE (issue 14, fault 6). Segments are now compacted: bounded
per version and on disk, and the tokens read back are exactly the ones written."""

from __future__ import annotations

import os

import numpy as np
import pytest

from regis.indexes.layout import SEGMENTS_DIR
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import DEFAULT_KEEP_VERSIONS, MAX_SEGMENTS, IndexWriter


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_many_small_writes_keep_segments_and_descriptors_bounded(tmp_path, tiny_encoder):
    T, D = tiny_encoder.config.tokens_per_image, tiny_encoder.config.dim
    rng = np.random.default_rng(0)
    expected: dict[int, np.ndarray] = {}
    index = tmp_path / "index"
    for write in range(30):
        with IndexWriter(index, tiny_encoder.config, tiny_encoder.weights_info) as w:
            ids = w.allocate_ids(2)
            tokens = rng.standard_normal((2, T, D)).astype(np.float32)
            tokens /= np.linalg.norm(tokens, axis=-1, keepdims=True)
            w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 8, 8, 1, 0.0) for i in ids], tokens)
            expected.update({int(i): t for i, t in zip(ids, tokens, strict=True)})
            if write % 5 == 4:  # a delete and a re-embedding now and then: dead rows for the merge to drop
                victim = sorted(expected)[write // 5]
                w.delete([victim])
                del expected[victim]
                again = sorted(expected)[-3]
                new = rng.standard_normal((1, T, D)).astype(np.float32)
                new /= np.linalg.norm(new, axis=-1, keepdims=True)
                w.put([ImageRecord(again, f"{again}.png", "1" * 64, 8, 8, 1, 1.0)], new)
                expected[again] = new[0]
            manifest = w.commit()
        assert len(manifest.segments) <= MAX_SEGMENTS
        on_disk = [p for p in (index / SEGMENTS_DIR).iterdir()]
        assert len(on_disk) <= DEFAULT_KEEP_VERSIONS * MAX_SEGMENTS

    before = _open_fds()
    snap = IndexSnapshot.open(index)
    try:
        assert _open_fds() - before <= MAX_SEGMENTS + 4  # segments + table + the rest, not one per write
        ids = np.array(sorted(expected))
        assert np.array_equal(snap.store.live_ids, ids)
        got = snap.store.get(ids).astype(np.float32)
        want = np.stack([expected[i] for i in ids]).astype(np.float16).astype(np.float32)
        assert np.array_equal(got, want)
        assert snap.faiss.ntotal == len(ids) * T
    finally:
        snap.close()
