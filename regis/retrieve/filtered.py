"""Filtered search: only images whose table row matches a metadata filter (``regis.indexes.filters``) are ranked.

The filter runs in SQLite once per index version and filter (the allowed ids are cached per snapshot: a
snapshot never changes). Then:

- a selective filter (at most ``exact_limit`` allowed images) is answered by exact MaxSim over the allowed
  set: k results whenever k images match, equal to exact scoring;
- otherwise the ANN candidates are filtered before the rerank. The first round's depth is the search's depth
  divided by the fraction of images the filter keeps (``filtered_depth``: 128 for a 50 % filter at depth 64), so
  about as many allowed images are scored as an unfiltered search scores images (with the fixed-depth
  candidate method a 50 % filter otherwise lost recall: 0.49 against 0.80 now, BENCHMARKS.md section 8; the
  bounded method was exact either way and now needs fewer range-searched images). When fewer than k pass, the depth
  is raised (x4 up to ``MAX_DEPTH``) and, if still short, the allowed set is scored exactly. So a filtered
  search returns min(k, allowed) results. With the ``"bounded"`` candidate method (``regis.retrieve.candidates``)
  the saturated query tokens then get the same range search as an unfiltered search, its images filtered too.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np

from regis.indexes.filters import canonical, compile_filter
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve import candidates as cands
from regis.retrieve.searcher import MAX_DEPTH, Searcher, SearchResult, top_k

EXACT_LIMIT = 4096  # allowed images scored exactly rather than through FAISS (a few ms of MaxSim on CPU)
_CACHE_SIZE = 64
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def allowed_ids(snapshot: IndexSnapshot, where: dict) -> np.ndarray:
    """Ids of the snapshot's images matching filter ``where``: (n,) int64, ascending. Cached per snapshot and
    filter (LRU of 64 filters).

    Raises:
        ConfigError: a malformed filter.
    """
    key = canonical(where)
    with _cache_lock:
        per_snapshot = _cache.setdefault(snapshot, OrderedDict())
        hit = per_snapshot.get(key)
        if hit is not None:
            per_snapshot.move_to_end(key)
            return hit
    sql, params = compile_filter(where)
    ids = snapshot.table.ids_where(sql, params)
    ids.setflags(write=False)
    with _cache_lock:
        per_snapshot[key] = ids
        while len(per_snapshot) > _CACHE_SIZE:
            per_snapshot.popitem(last=False)
    return ids


def exact_over(searcher: Searcher, query: np.ndarray, ids: np.ndarray, k: int,
               chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Exact MaxSim of ``query`` (m, D) against the float16 tokens of ``ids`` (n,), top k (ids, scores)."""
    best_ids = np.zeros(0, dtype=np.int64)
    best_scores = np.zeros(0, dtype=np.float32)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        scores = searcher.rerank(query, part)
        best_ids, best_scores = top_k(np.concatenate([best_ids, part]), np.concatenate([best_scores, scores]), k)
    return best_ids, best_scores


def filtered_depth(depth: int, n_allowed: int, n_live: int, limit: int = MAX_DEPTH) -> int:
    """First-round candidate depth of a filtered ANN search: ``depth`` / (n_allowed / n_live), in [depth, limit].

    The images owning a query token's d nearest token vectors pass a filter keeping a fraction f of the images in
    about the proportion f, so depth / f neighbours give as many allowed candidates as an unfiltered search at
    ``depth`` has candidates (BENCHMARKS.md section 8).

    Args:
        depth: the search's candidate depth k' (neighbours per query token).
        n_allowed: live images the filter keeps (> 0).
        n_live: live images of the snapshot.
        limit: the largest depth returned (``MAX_DEPTH``).

    Returns:
        The scaled depth (int).
    """
    if n_allowed <= 0 or n_allowed >= n_live:
        return depth
    return int(min(max(limit, depth), math.ceil(depth * n_live / n_allowed)))


def search_filtered(searcher: Searcher, query: np.ndarray, allowed: np.ndarray, k: int = 10,
                    depth: int | None = None, mode: str = "ann", nprobe: int | None = None,
                    exact_limit: int = EXACT_LIMIT, candidates: str | None = None) -> SearchResult:
    """Rank only the ``allowed`` images (ascending int64 ids, e.g. from ``allowed_ids``) for one query.

    Args:
        searcher: the searcher of the snapshot ``allowed`` comes from.
        query: (m, D) float32 unit-norm query tokens.
        allowed: (n,) int64 ascending image ids.
        k, depth, nprobe: as ``Searcher.search``.
        mode: "ann" (filtered candidates, exact fallback) or "exact" (score every allowed image).
        exact_limit: allowed sets up to this size are always scored exactly.
        candidates: candidate method ("bounded" or "depth"); None: the searcher's.

    Returns:
        A ``SearchResult`` of min(k, n) images; ``num_candidates`` counts the images scored; ``depth`` the
        first-round depth used (``filtered_depth``, raised x4 while fewer than k candidates pass).

    Raises:
        ConfigError: bad shapes or parameters.
    """
    depth = depth or searcher.default_depth
    query = searcher._check_query(query, k, depth)
    method = cands.check_method(candidates or searcher.candidate_method)
    allowed = allowed[searcher.snapshot.store.is_live(allowed)] if len(allowed) else allowed
    t0 = time.perf_counter()
    if mode == "exact" or len(allowed) <= max(exact_limit, k):
        ids, scores = exact_over(searcher, query, allowed, k)
        return SearchResult(ids, scores, len(allowed), {"candidates": 0.0, "rerank": (time.perf_counter() - t0) * 1e3},
                            depth=None if mode == "exact" else depth)
    d = filtered_depth(depth, len(allowed), len(searcher.snapshot))
    while True:
        sims, token_ids = searcher._neighbours(query, d, nprobe, searcher.search_threads)
        cand = searcher._live_images(token_ids.reshape(-1))
        cand = cand[np.isin(cand, allowed, assume_unique=True)]
        if len(cand) >= k or d >= MAX_DEPTH:
            break
        d = min(MAX_DEPTH, d * 4)
    t1 = time.perf_counter()
    if len(cand) >= k:
        ids, scores = searcher._rank(query, cand, k)
        n = len(cand)
        if method == "bounded":
            extra = searcher._bounded_extra(query, sims, token_ids, cand, float(scores[-1]), nprobe,
                                            searcher.search_threads)
            extra = extra[np.isin(extra, allowed, assume_unique=True)]
            if len(extra):
                more_ids, more_scores = searcher.rank_extra(query, extra, k)
                ids, scores = top_k(np.concatenate([ids, more_ids]), np.concatenate([scores, more_scores]), k)
                n += len(extra)
    else:  # the filter keeps too few of even the deepest candidates: score the allowed set exactly
        ids, scores = exact_over(searcher, query, allowed, k)
        n = len(allowed)
    return SearchResult(ids, scores, n, {"candidates": (t1 - t0) * 1e3, "rerank": (time.perf_counter() - t1) * 1e3},
                        depth=d)
