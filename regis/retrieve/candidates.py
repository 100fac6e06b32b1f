"""Candidate generation of the ANN search: which images get scored exactly with MaxSim (issue 15).

Two methods, named in the index manifest (``FaissInfo.candidates``) and selectable per ``Searcher`` or call:

- ``"depth"`` (regis before issue 15): the images owning each query token's ``depth`` nearest token vectors.
  When more than ``depth`` images hold a near-identical token (a white background, sky, a watermark, register
  tokens), the neighbour list *saturates*: it keeps an arbitrary ``depth`` of them and the others are never
  scored, so recall@10 of the exact ranking falls (0.51 at depth 64 with ~250 images per shared token,
  BENCHMARKS.md).
- ``"bounded"`` (default): the same first round, then a bound decides whether any image not yet scored could
  still enter the top k, and fetches exactly the tokens that could put one there. With ``t_i`` the similarity
  of query token i's last (depth-th) neighbour, an image none of whose tokens was returned for token i has
  similarity <= t_i with it, so its MaxSim is <= sum_i t_i (the threshold algorithm's stopping rule, Fagin,
  Lotem & Naor 2003). If that sum is <= theta, the k-th best exact score of the candidates, the candidate set is
  complete and nothing more is done (the usual case on real tokens). Otherwise the saturated tokens (the largest
  t_i) get one FAISS range search with a radius r chosen so that sum over searched tokens of r + sum over the
  others of t_i = theta (``range_radius``): afterwards every unseen image scores <= theta and cannot displace
  the top k. The cost follows the number of images that really hold a close token, not the collection size,
  and is capped at ``RANGE_CAP`` tokens per query token (the most similar kept) so a token shared by a large
  part of the collection cannot turn a query into a full scan.

The guarantee is relative to the FAISS index's own similarities (SQ8 codes, the probed IVF lists): the same
approximation the ``depth`` method makes, without its dependence on how many images share a token.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from regis.errors import ConfigError
from regis.indexes import faiss_index

CandidateMethod = Literal["depth", "bounded"]
CANDIDATE_METHODS: tuple[str, ...] = ("depth", "bounded")
DEFAULT_CANDIDATES: CandidateMethod = "bounded"
RANGE_CAP = 4096  # tokens kept per query token by the bounded range search (the most similar)


def check_method(method: str) -> str:
    """``method`` if it is a candidate method name.

    Raises:
        ConfigError: not one of ``CANDIDATE_METHODS``.
    """
    if method not in CANDIDATE_METHODS:
        raise ConfigError(f"candidates must be one of {', '.join(CANDIDATE_METHODS)}; got {method!r}")
    return method


def list_tails(sims: np.ndarray, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Similarity of each query token's last returned neighbour, and whether its list was full.

    Args:
        sims: (m, depth) float32 inner products from ``faiss_index.search``, descending per row.
        token_ids: (m, depth) int64 token ids; -1 where FAISS found fewer than ``depth`` neighbours.

    Returns:
        tails (m,) float32 (-inf for a row with no neighbour at all), full (m,) bool: the row holds ``depth``
        neighbours. A row that is not full returned every token of the lists FAISS probes: searching it again
        finds nothing new, so it is never searched again.
    """
    valid = token_ids >= 0
    count = valid.sum(axis=1)
    rows = np.arange(len(sims))
    tails = np.where(count > 0, sims[rows, np.maximum(count - 1, 0)], -np.inf).astype(np.float32)
    return tails, count == sims.shape[1]


def range_radius(tails: np.ndarray, full: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """Which query tokens need a range search so that no unseen image can score above ``theta``, and its radius.

    An unseen image's MaxSim is at most sum_i t_i (``tails``). Tokens whose tail is above theta / m are searched
    (largest first) with one radius r = (theta - sum of the other tails) / (tokens searched), which is >= theta/m;
    a searched token whose tail is already <= r would gain nothing and joins the others (r only grows).

    Args:
        tails, full: from ``list_tails``, (m,) each.
        theta: the k-th best score among the candidates scored so far (-inf when fewer than k).

    Returns:
        (s,) int64 indices of the query tokens to search (empty when the candidates are already complete, or when
        theta is not finite), and the radius r (inner product; tokens with similarity > r are wanted).
    """
    m = len(tails)
    finite = np.isfinite(tails)
    if m == 0 or not np.isfinite(theta) or not finite.any() or float(tails[finite].sum()) <= theta:
        return np.zeros(0, dtype=np.int64), float("inf")
    base = np.where(finite, tails, 0.0).astype(np.float64)  # an empty row bounds nothing: count it as 0
    search = np.flatnonzero(full & finite & (tails > theta / m))
    while len(search):
        radius = (theta - (base.sum() - base[search].sum())) / len(search)
        keep = search[tails[search] > radius]
        if len(keep) == len(search):
            return search[np.argsort(-tails[search], kind="stable")], float(radius)
        search = keep
    return np.zeros(0, dtype=np.int64), float("inf")


def range_tokens(index, query: np.ndarray, radius: float, nprobe: int | None = None,
                 threads: int | None = None, cap: int = RANGE_CAP) -> np.ndarray:
    """Token ids with inner product > ``radius`` to any of the ``query`` vectors, at most ``cap`` per vector.

    Args:
        index: the FAISS token index (``faiss_index``; IVF, Flat and HNSW all answer range searches).
        query: (s, D) float32 query token vectors.
        radius: inner-product threshold.
        nprobe: IVF lists probed (as the first round).
        threads: FAISS OpenMP threads of the calling thread (None: unchanged).
        cap: tokens kept per query vector (the most similar) when more pass the radius.

    Returns:
        (n,) int64 token ids (may repeat across query vectors).
    """
    faiss = faiss_index._faiss()
    query = np.ascontiguousarray(query, dtype=np.float32)
    if threads is not None:
        faiss.omp_set_num_threads(int(threads))
    params = faiss_index.search_params(index, nprobe)
    if params is None:
        lims, sims, ids = index.range_search(query, float(radius))
    else:
        lims, sims, ids = index.range_search(query, float(radius), params=params)
    parts = []
    for i in range(len(query)):
        row_ids, row_sims = ids[lims[i] : lims[i + 1]], sims[lims[i] : lims[i + 1]]
        if len(row_ids) > cap:
            row_ids = row_ids[np.argpartition(-row_sims, cap - 1)[:cap]]
        parts.append(row_ids)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
