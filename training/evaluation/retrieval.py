"""Nearest neighbours and the retrieval metrics of a set of embeddings (METHODS.md section 3).

Two scorings of the same (N, T, D) unit-norm tokens: ``single`` = cosine of token 0 (CLS, or a CNN's global
pool), ``multi`` = MaxSim over all T tokens. Leave-one-out: the gallery is the query set and each query is
removed from its own neighbours. Query vs gallery: In-Shop. Queries with no same-label gallery item are left
out of every metric (and counted in the report).
"""

from __future__ import annotations

import numpy as np
import torch

from regis.errors import ConfigError
from regis.scores.maxsim import maxsim_scores
from training.evaluation.metrics import map_at_r, r_precision, recall_at_k, relevance

SCORINGS = ("single", "multi")


def score_block(queries: torch.Tensor, gallery: torch.Tensor, scoring: str) -> torch.Tensor:
    """(q, T, D) x (N, T, D) -> (q, N) float32 scores: cosine of token 0 ("single") or MaxSim ("multi")."""
    if scoring == "single":
        return queries[:, 0] @ gallery[:, 0].T
    if scoring == "multi":
        return maxsim_scores(queries, gallery)
    raise ConfigError(f"scoring must be one of {SCORINGS}, got {scoring!r}")


def nearest_neighbours(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    k: int,
    scoring: str = "multi",
    leave_one_out: bool = False,
    chunk_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best gallery items of every query.

    Args:
        queries: (Q, T, D) float unit-norm tokens.
        gallery: (N, T, D) float tokens, same device (for leave-one-out: the same tensor as ``queries``).
        k: neighbours per query, 1 <= k <= N (N - 1 for leave-one-out).
        scoring: "single" or "multi".
        leave_one_out: query i is gallery item i and is never its own neighbour.
        chunk_size: queries scored per step.

    Returns:
        scores (Q, k) float32 and indices (Q, k) int64 into the gallery, best first; ties: lower index first.

    Raises:
        ConfigError: k out of range or mismatched leave-one-out sets.
    """
    n = gallery.shape[0]
    available = n - 1 if leave_one_out else n
    if not 1 <= k <= available:
        raise ConfigError(f"{k} neighbours asked, but the gallery offers {available}")
    if leave_one_out and queries.shape[0] != n:
        raise ConfigError("leave-one-out needs the queries to be the gallery")
    out_s, out_i = [], []
    for start in range(0, queries.shape[0], chunk_size):
        s = score_block(queries[start : start + chunk_size], gallery, scoring).float()
        if leave_one_out:
            rows = torch.arange(s.shape[0], device=s.device)
            s[rows, rows + start] = float("-inf")
        best, idx = torch.sort(s, dim=1, descending=True, stable=True)
        out_s.append(best[:, :k])
        out_i.append(idx[:, :k])
    return torch.cat(out_s), torch.cat(out_i)


def retrieval_metrics(
    query_tokens: torch.Tensor,
    query_labels: np.ndarray,
    gallery_tokens: torch.Tensor | None,
    gallery_labels: np.ndarray | None,
    ks: tuple[int, ...],
    scorings: tuple[str, ...] = SCORINGS,
    index_tokens: int | None = None,
) -> dict:
    """Recall@K, mAP@R and R-precision of single- and multi-vector retrieval.

    Args:
        query_tokens: (Q, m, D) float unit-norm tokens (m >= T: a query layout with more tokens than the index's,
            ``EncoderConfig.query_layout``, whose first T are the index's).
        query_labels: (Q,) int labels.
        gallery_tokens, gallery_labels: the gallery, or None for leave-one-out over the queries.
        ks: the K of Recall@K.
        scorings: which of "single", "multi".
        index_tokens: T, the tokens an indexed image has: leave-one-out, the gallery is the queries' first T
            tokens (None: all of them).

    Returns:
        ``{"num_queries", "num_gallery", "queries_without_relevant", "protocol", "single": {...}, "multi": {...}}``
        with metric keys ``recall@K``, ``map@r``, ``r_precision`` (fractions in [0, 1]).

    Raises:
        ConfigError: a K larger than the gallery allows, or no query with a relevant gallery item.
    """
    loo = gallery_tokens is None
    query_labels = np.asarray(query_labels, dtype=np.int64)
    g_tokens = query_tokens[:, :index_tokens] if loo else gallery_tokens
    g_labels = query_labels if loo else np.asarray(gallery_labels, dtype=np.int64)
    uniq, counts = np.unique(g_labels, return_counts=True)
    count_of = dict(zip(uniq.tolist(), counts.tolist(), strict=True))
    num_relevant = np.array([count_of.get(int(y), 0) for y in query_labels], dtype=np.int64) - (1 if loo else 0)
    valid = num_relevant > 0
    if not valid.any():
        raise ConfigError("no query has a same-label item in the gallery; nothing to evaluate")
    available = g_tokens.shape[0] - (1 if loo else 0)
    if max(ks) > available:
        raise ConfigError(
            f"Recall@{max(ks)} needs at least {max(ks)} gallery items per query, the gallery offers {available}"
        )
    k = min(available, max(max(ks), int(num_relevant.max())))
    report = {
        "protocol": "leave-one-out" if loo else "query-gallery",
        "num_queries": int(query_labels.shape[0]),
        "num_gallery": int(g_labels.shape[0]),
        "queries_without_relevant": int((~valid).sum()),
    }
    for scoring in scorings:
        _, idx = nearest_neighbours(query_tokens, g_tokens, k, scoring, leave_one_out=loo)
        hits = relevance(g_labels[idx.cpu().numpy()], query_labels)[valid]
        r = num_relevant[valid]
        metrics = {f"recall@{kk}": recall_at_k(hits, kk) for kk in ks}
        metrics["map@r"] = map_at_r(hits, r)
        metrics["r_precision"] = r_precision(hits, r)
        report[scoring] = metrics
    return report
