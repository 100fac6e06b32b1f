"""The compressed store's refine rule (issue 24): the candidates re-scored exactly on float16 are
max(refine x k, refine_share x candidates), so they follow the candidate count as the collection grows; new
indexes record refine 16 and share 0.4, an index written before the share was recorded keeps re-scoring refine x k
(share 0.0), also after it grows. Small random tokens, so that a query has several hundred candidates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import add_tokens, unit_tokens
from regis.errors import ConfigError
from regis.indexes import codes as token_codes
from regis.indexes.layout import MANIFEST_FILE
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve.searcher import Searcher

T, D, N = 10, 32, 1_200  # 1,200 images: Flat candidates; depth 64 x 10 query tokens -> hundreds of images


def _add(path, tokens: np.ndarray):
    return add_tokens(path, tokens, "test-refine-rule")


def _tokens(n: int, seed: int) -> np.ndarray:
    return unit_tokens(n, seed, T, D)


def _rows_rescored(searcher: Searcher, query: np.ndarray) -> tuple[int, int]:
    """(float16 rows the search read, its candidates), counted on the token store's reads."""
    store = searcher.snapshot.store
    read = []
    original = store.get
    store.get = lambda ids: (read.append(len(ids)), original(ids))[1]
    try:
        result = searcher.search(query, k=10, candidates="depth")
    finally:
        store.get = original
    return sum(read), result.num_candidates


def test_new_index_rescores_a_share_of_its_candidates(tmp_path):
    m = _add(tmp_path / "idx", _tokens(N, 0))
    assert m.token_store.spec == "SQ4"
    assert (m.token_store.refine, m.token_store.refine_share) == (16, token_codes.DEFAULT_REFINE_SHARE) == (16, 0.4)
    snap = IndexSnapshot.open(tmp_path / "idx")
    query = _tokens(1, 1)[0]
    rows, cands = _rows_rescored(Searcher(snap), query)
    assert cands > 400  # so that 0.4 x candidates is above refine x k = 160
    assert rows == int(np.ceil(0.4 * cands)) > 160
    assert _rows_rescored(Searcher(snap, refine_share=0.0), query)[0] == 160  # the rule before the share
    assert Searcher(snap).refine_rows(10, 100) == 160  # few candidates: refine x k still the floor
    ann, exact = Searcher(snap).search(query, k=10), Searcher(snap).search(query, k=10, mode="exact")
    np.testing.assert_allclose(ann.scores, Searcher(snap).rerank(query, ann.ids), rtol=1e-6)  # exact scores
    assert len(np.intersect1d(ann.ids, exact.ids)) >= 9
    with pytest.raises(ConfigError, match="refine_share"):
        Searcher(snap, refine_share=1.5)
    snap.close()


def test_an_index_written_before_the_share_keeps_its_rule_as_it_grows(tmp_path):
    path = tmp_path / "old"
    _add(path, _tokens(N, 0))
    version = path / "versions" / IndexSnapshot.open(path).name
    raw = json.loads((version / MANIFEST_FILE).read_text())
    del raw["token_store"]["refine_share"]  # as an index written before the share was recorded
    raw["token_store"]["refine"] = 4
    (version / MANIFEST_FILE).write_text(json.dumps(raw))
    snap = IndexSnapshot.open(path)
    assert (snap.manifest.token_store.refine, snap.manifest.token_store.refine_share) == (4, 0.0)
    assert _rows_rescored(Searcher(snap), _tokens(1, 1)[0])[0] == 40
    snap.close()
    m = _add(path, _tokens(200, 2))  # a new version of the same index
    assert (m.token_store.refine, m.token_store.refine_share) == (4, 0.0) and m.num_images == N + 200


def test_an_index_written_with_refine_8_keeps_it_as_it_grows(tmp_path):
    path = tmp_path / "refine8"
    _add(path, _tokens(N, 0))
    version = path / "versions" / IndexSnapshot.open(path).name
    raw = json.loads((version / MANIFEST_FILE).read_text())
    raw["token_store"]["refine"] = 8  # as an index written while the default was 8
    (version / MANIFEST_FILE).write_text(json.dumps(raw))
    snap = IndexSnapshot.open(path)
    assert Searcher(snap).refine_rows(10, 100) == 80
    snap.close()
    m = _add(path, _tokens(200, 2))
    assert (m.token_store.refine, m.token_store.refine_share) == (8, 0.4) and m.num_images == N + 200


def test_sq4_scores_on_the_codes_equal_maxsim_of_the_decoded_tokens(tmp_path):
    _add(tmp_path / "idx", _tokens(N, 0))
    snap = IndexSnapshot.open(tmp_path / "idx")
    store = snap.codes
    assert store.sq4 is not None  # a plain SQ4 codec: scored without decoding
    ids = np.arange(0, N, 3)
    query = _tokens(1, 5)[0]
    decoded = store.get(ids)  # FAISS sa_decode: (n, T, D) float32
    expected = (query @ decoded.reshape(-1, D).T).reshape(T, len(ids), T).max(axis=2).sum(axis=0)
    np.testing.assert_allclose(store.maxsim(query, ids), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Searcher(snap).rerank_codes(query, ids), expected, rtol=1e-5, atol=1e-5)
    chunked = token_codes.sq4_maxsim(query, store.get_codes(ids), *store.sq4, chunk_images=7)
    np.testing.assert_allclose(chunked, expected, rtol=1e-5, atol=1e-5)
    snap.close()
    codec = token_codes.train_codec("SQ8", _tokens(300, 3).reshape(-1, D))
    assert token_codes.sq4_params(codec) is None  # other codecs: decoded, then scored


def test_the_bounded_extras_rescore_refine_x_k_rows_not_a_share(tmp_path):
    """``Searcher.rank_extra`` (the bounded method's extra images, BENCHMARKS.md section 9 run T): the codes rank
    all of them, float16 re-scores only the best refine x k = 160, whatever the index's share; its results are
    exact scores, the best of the extras by exact MaxSim when the codes keep them among the 160."""
    _add(tmp_path / "idx", _tokens(N, 0))
    snap = IndexSnapshot.open(tmp_path / "idx")
    searcher, query = Searcher(snap), _tokens(1, 1)[0]
    extra = np.arange(0, N, 2, dtype=np.int64)  # 600 extras: the share would re-score 240 of them
    store, read = snap.store, []
    original = store.get
    store.get = lambda ids: (read.append(len(ids)), original(ids))[1]
    try:
        ids, scores = searcher.rank_extra(query, extra, 10)
        assert read == [160]
        read.clear()
        searcher._rank(query, extra, 10)
        assert read == [int(np.ceil(0.4 * len(extra)))] == [240]
    finally:
        store.get = original
    np.testing.assert_allclose(scores, searcher.rerank(query, ids), rtol=1e-6)
    best = extra[np.argsort(-searcher.rerank(query, extra))[:10]]
    assert len(np.intersect1d(ids, best)) >= 9
    snap.close()
