"""``regis search -k 10`` returned 9 results from a 200-image index at the default depth: a few images owned
every neighbour of the query tokens (issue 14, fault 12). The candidate depth now widens until there are k."""

from __future__ import annotations

import numpy as np

from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve.searcher import Searcher


def test_k_results_whenever_the_index_holds_k_images(lite0_index, photos_dir, lite0_encoder, one_thread):
    from regis.retrieve.query import QueryEngine

    snap = IndexSnapshot.open(lite0_index)
    try:
        searcher = Searcher(snap)
        query = snap.store.get(np.array([3]))[0].astype(np.float32)  # an indexed image's own tokens
        narrow = searcher.candidates(query, depth=1)
        assert len(narrow) < 10  # the situation of the fault: depth 1 finds fewer than k images
        for k in (10, 21):
            result = searcher.search(query, k=k, depth=1)
            assert len(result.ids) == k and len(set(result.ids.tolist())) == k
            exact = searcher.search(query, k=k, mode="exact")
            assert result.ids[0] == exact.ids[0] == 3
        assert len(searcher.search(query, k=50, depth=1).ids) == 21  # never more than the index holds
        batch = searcher.search_batch(query[None], k=10, depth=1)
        assert len(batch[0].ids) == 10
    finally:
        snap.close()
    engine = QueryEngine.open(lite0_index, device="cpu")
    hits = engine.search_file(photos_dir / "skimage-coffee.png", k=10, depth=1)
    assert len(hits["results"]) == 10
