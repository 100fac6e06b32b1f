"""Retrieval metrics from ranked neighbour lists (METHODS.md section 3; Musgrave et al. 2020, "A Metric Learning
Reality Check").

Inputs are a (Q, k) bool matrix ``hits``: ``hits[q, i]`` is True when the query's i-th nearest gallery item
(rank i + 1) shares its label; and ``num_relevant`` (Q,): R, how many gallery items share the query's label
(leave-one-out: not counting the query itself). Every query must have R >= 1.
"""

from __future__ import annotations

import numpy as np

from regis.errors import ConfigError


def relevance(neighbour_labels: np.ndarray, query_labels: np.ndarray) -> np.ndarray:
    """(Q, k) labels of the ranked neighbours and (Q,) query labels -> (Q, k) bool hits."""
    neighbour_labels, query_labels = np.asarray(neighbour_labels), np.asarray(query_labels)
    if neighbour_labels.ndim != 2 or query_labels.shape != (neighbour_labels.shape[0],):
        raise ConfigError(f"neighbour labels {neighbour_labels.shape} and query labels {query_labels.shape} differ")
    return neighbour_labels == query_labels[:, None]


def recall_at_k(hits: np.ndarray, k: int) -> float:
    """Recall@K (metric-learning definition): the share of queries with a same-label item among their K nearest.

    Raises:
        ConfigError: K < 1 or fewer than K ranked neighbours.
    """
    if k < 1 or hits.shape[1] < k:
        raise ConfigError(f"Recall@{k} needs K >= 1 and at least K ranked neighbours, got {hits.shape[1]}")
    return float(hits[:, :k].any(axis=1).mean())


def _check_r(hits: np.ndarray, num_relevant: np.ndarray) -> np.ndarray:
    r = np.asarray(num_relevant, dtype=np.int64)
    if r.shape != (hits.shape[0],):
        raise ConfigError(f"num_relevant must be ({hits.shape[0]},), got {r.shape}")
    if r.size and r.min() < 1:
        raise ConfigError("every query needs R >= 1 relevant gallery items; drop the others first")
    if r.size and hits.shape[1] < r.max():
        raise ConfigError(f"mAP@R and R-precision need R = {r.max()} ranked neighbours, got {hits.shape[1]}")
    return r


def r_precision(hits: np.ndarray, num_relevant: np.ndarray) -> float:
    """R-precision: mean over queries of (same-label items among the R nearest) / R.

    Raises:
        ConfigError: a query with R < 1, or fewer than max R ranked neighbours.
    """
    r = _check_r(hits, num_relevant)
    if r.size == 0:
        return float("nan")
    within = np.arange(hits.shape[1])[None, :] < r[:, None]
    return float(((hits & within).sum(axis=1) / r).mean())


def map_at_r(hits: np.ndarray, num_relevant: np.ndarray) -> float:
    """mAP@R: mean over queries of (1 / R) * sum_{i=1..R} P(i) * rel(i), P(i) the precision at rank i.

    Raises:
        ConfigError: a query with R < 1, or fewer than max R ranked neighbours.
    """
    r = _check_r(hits, num_relevant)
    if r.size == 0:
        return float("nan")
    ranks = np.arange(1, hits.shape[1] + 1)[None, :]
    within = ranks <= r[:, None]
    rel = hits & within
    precision = np.cumsum(rel, axis=1) / ranks
    return float(((precision * rel).sum(axis=1) / r).mean())
