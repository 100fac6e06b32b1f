"""Query-by-image search over one index snapshot: FAISS candidates, then exact MaxSim rerank.

ANN mode: each of the query's m tokens fetches its ``depth`` nearest token vectors from FAISS; the images
owning them are the candidates; their stored tokens are scored exactly with MaxSim and the top k returned.
Exact mode scores every live image (the oracle for tests and benchmarks). Search parameters are per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from regis.errors import ConfigError
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.scores.maxsim import maxsim_scores

DEFAULT_DEPTH = 64
MAX_K = 1000
MAX_DEPTH = 4096
Mode = Literal["ann", "exact"]


@dataclass
class SearchResult:
    """Ranked results of one query.

    Attributes:
        ids: (k',) int64 image ids, best first (k' <= k when the index is smaller or candidates run short).
        scores: (k',) float32 MaxSim scores, descending; ties broken by ascending id.
        num_candidates: images scored exactly (all live images in exact mode).
        timings_ms: {"candidates": ms, "rerank": ms}.
    """

    ids: np.ndarray
    scores: np.ndarray
    num_candidates: int
    timings_ms: dict[str, float] = field(default_factory=dict)


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score descending, id ascending on ties) of parallel arrays ids (n,) and scores (n,)."""
    if len(ids) > 4 * k:
        part = np.argpartition(-scores, k - 1)[:k]
        # keep every id tied with the k-th score so the id tie-break is exact
        kth = scores[part].min()
        part = np.flatnonzero(scores >= kth)
        ids, scores = ids[part], scores[part]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


class Searcher:
    """Search one ``IndexSnapshot``.

    Args:
        snapshot: the index version to search.
        device: torch device for the MaxSim rerank ("cpu" or "cuda").
        exact_chunk: images scored per step in exact mode.
    """

    def __init__(self, snapshot: IndexSnapshot, device: str = "cpu", exact_chunk: int = 8192):
        self.snapshot = snapshot
        self.device = torch.device(device)
        self.exact_chunk = exact_chunk
        self.T = snapshot.manifest.tokens_per_image
        self.D = snapshot.manifest.dim

    def _check_query(self, query: np.ndarray, k: int, depth: int) -> np.ndarray:
        query = np.asarray(query, dtype=np.float32)
        if query.ndim != 2 or query.shape[1] != self.D or query.shape[0] < 1:
            raise ConfigError(f"query tokens must be (m, {self.D}), got {tuple(query.shape)}")
        if not 1 <= k <= MAX_K:
            raise ConfigError(f"k must be between 1 and {MAX_K}, got {k}")
        if not 1 <= depth <= MAX_DEPTH:
            raise ConfigError(f"candidate depth must be between 1 and {MAX_DEPTH}, got {depth}")
        return query

    def candidates(self, query: np.ndarray, depth: int, nprobe: int | None = None) -> np.ndarray:
        """Live image ids owning the ``depth`` nearest token vectors of each query token.

        Args:
            query: (m, D) float32 unit-norm query tokens.
            depth: k', neighbours per query token.
            nprobe: IVF probes for this call (default: the manifest's).

        Returns:
            (c,) int64 unique image ids, ascending, c <= m * depth.
        """
        if self.snapshot.faiss.ntotal == 0:
            return np.zeros(0, dtype=np.int64)
        nprobe = nprobe or self.snapshot.manifest.faiss.nprobe
        _, token_ids = faiss_index.search(self.snapshot.faiss, query, depth, nprobe=nprobe)
        token_ids = token_ids[token_ids >= 0]
        image_ids = np.unique(token_ids // self.T)
        return image_ids[self.snapshot.store.is_live(image_ids)]

    def rerank(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Exact MaxSim of ``query`` (m, D) against the stored tokens of ``ids`` (c,): (c,) float32."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.float32)
        docs = torch.from_numpy(self.snapshot.store.get(ids)).to(self.device)
        q = torch.from_numpy(np.ascontiguousarray(query)).to(self.device)
        return maxsim_scores(q, docs).float().cpu().numpy()

    def _exact(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        best_ids = np.zeros(0, dtype=np.int64)
        best_scores = np.zeros(0, dtype=np.float32)
        q = torch.from_numpy(np.ascontiguousarray(query)).to(self.device)
        for ids, tokens in self.snapshot.store.iter_chunks(self.exact_chunk):
            scores = maxsim_scores(q, torch.from_numpy(tokens).to(self.device)).float().cpu().numpy()
            best_ids, best_scores = top_k(
                np.concatenate([best_ids, ids]), np.concatenate([best_scores, scores]), k
            )
        return best_ids, best_scores, len(self.snapshot.store)

    def search(
        self,
        query: np.ndarray,
        k: int = 10,
        depth: int = DEFAULT_DEPTH,
        mode: Mode = "ann",
        nprobe: int | None = None,
    ) -> SearchResult:
        """Rank the index's images for one query.

        Args:
            query: (m, D) float32 unit-norm query tokens (m need not equal T).
            k: results wanted, 1..1000.
            depth: ANN mode: neighbours per query token (k'), 1..4096.
            mode: "ann" (candidates + rerank) or "exact" (score every image).
            nprobe: IVF lists probed for this call.

        Returns:
            A ``SearchResult``.

        Raises:
            ConfigError: bad shapes or parameters.
        """
        query = self._check_query(query, k, depth)
        if mode == "exact":
            t0 = time.perf_counter()
            ids, scores, n = self._exact(query, k)
            return SearchResult(ids, scores, n, {"candidates": 0.0, "rerank": (time.perf_counter() - t0) * 1e3})
        if mode != "ann":
            raise ConfigError(f"mode must be 'ann' or 'exact', got {mode!r}")
        t0 = time.perf_counter()
        cand = self.candidates(query, depth, nprobe)
        t1 = time.perf_counter()
        ids, scores = top_k(cand, self.rerank(query, cand), k)
        t2 = time.perf_counter()
        return SearchResult(ids, scores, len(cand), {"candidates": (t1 - t0) * 1e3, "rerank": (t2 - t1) * 1e3})
