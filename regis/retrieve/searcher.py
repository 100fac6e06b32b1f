"""Query-by-image search over one index snapshot: FAISS candidates, then exact MaxSim rerank.

ANN mode: each of the query's m tokens fetches its ``depth`` nearest token vectors from FAISS; the images
owning them are the candidates; their stored tokens are scored exactly with MaxSim and the top k returned.
With the ``"bounded"`` candidate method (the default, ``regis.retrieve.candidates``) query tokens whose
neighbour list saturated get one range search more, so that no image left unscored could enter the top k.
With a compressed token store (``regis.indexes.codes``) the candidates are first scored on their decoded
codes, and the best ``refine * k`` of those are re-scored exactly on their float16 tokens, so the returned
scores are always exact. Exact mode scores every live image (the oracle for tests and benchmarks). Search
parameters are per call; their defaults (depth, nprobe) come from the index manifest. An index of two framings
per image with the "best" framing score (``EncoderConfig.score_framings``) scores each image by its better
framing's MaxSim in every path (float16, codes, exact), and the bounded candidates bound each framing apart.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from regis.errors import ConfigError
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve import candidates as cands
from regis.scores.framings import framing_split
from regis.scores.maxsim_np import maxsim_gemm_np

DEFAULT_DEPTH = 64  # candidate depth of indexes whose manifest records none (the manifest's depth wins)
# FAISS threads of one query's candidate search: its 10 token searches are too small to split across cores
# (an OpenMP team that wakes per query costs more than it saves, and fights the rerank's threads); concurrent
# queries use the cores instead. Batches use every core. Measured in BENCHMARKS.md (bench/search.py).
SINGLE_QUERY_THREADS = 1
MAX_K = 1000
MAX_DEPTH = 4096
Mode = Literal["ann", "exact"]


@dataclass
class SearchResult:
    """Ranked results of one query.

    Attributes:
        ids: (k',) int64 image ids, best first (k' < k only when the index holds fewer than k images).
        scores: (k',) float32 MaxSim scores, descending; ties broken by ascending id.
        num_candidates: images scored (all live images in exact mode).
        timings_ms: {"candidates": ms, "rerank": ms}.
        depth: the candidate depth k' used (None in exact mode).
    """

    ids: np.ndarray
    scores: np.ndarray
    num_candidates: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    depth: int | None = None


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
        device: torch device for the MaxSim rerank ("cpu" or "cuda"); None: the rerank in numpy
            (``maxsim_gemm_np``; the torch-free query path of ``regis search``, which then imports no torch).
        exact_chunk: images scored per step in exact mode.
        use_codes: rerank on the compressed token store when the index has one (False: float16 only).
        refine: compressed store: at least refine x k candidates are re-scored exactly on float16; 0 ranks on
            the decoded codes alone (no float16 read; scores are then approximate); None: the manifest's
            (``TokenStoreInfo.refine``: 16 for new indexes, 8 for those written while 8 was the default, 4 for
            those written before it was recorded).
        refine_share: compressed store: and at least this share (0..1) of the query's candidates
            (``refine_rows``); None: the manifest's (``TokenStoreInfo.refine_share``: 0.4 for new indexes, 0.0
            for those written before it was recorded). Ignored when refine is 0.
        search_threads: FAISS threads for a single query's candidate search (``search``); batches
            (``search_batch``) use ``batch_threads`` (None: every core).
        candidates: candidate method, "depth" or "bounded" (``regis.retrieve.candidates``); None: the
            manifest's.
        k_factor: FAISS returns ``k_factor x depth`` neighbours per query token, re-ranked on the compressed
            token store's codes (``CodeStore.token_sims``) to the best ``depth``; 1: FAISS's own similarities
            (also when the index has no compressed store). None: the manifest's (``FaissInfo.k_factor``).

    Raises:
        ConfigError: refine < 0, refine_share outside 0..1, k_factor < 1, or an unknown candidate method.
    """

    def __init__(self, snapshot: IndexSnapshot, device: str | None = "cpu", exact_chunk: int = 8192,
                 use_codes: bool = True, refine: int | None = None,
                 search_threads: int | None = SINGLE_QUERY_THREADS, batch_threads: int | None = None,
                 candidates: str | None = None, refine_share: float | None = None, k_factor: int | None = None):
        if refine is None:
            refine = snapshot.manifest.token_store.refine
        if refine < 0:
            raise ConfigError(f"refine must be >= 0, got {refine}")
        if refine_share is None:
            refine_share = snapshot.manifest.token_store.refine_share
        if not 0.0 <= refine_share <= 1.0:
            raise ConfigError(f"refine_share must be between 0 and 1, got {refine_share}")
        self.candidate_method = cands.check_method(candidates or snapshot.manifest.faiss.candidates)
        k_factor = snapshot.manifest.faiss.k_factor if k_factor is None else k_factor
        if k_factor < 1:
            raise ConfigError(f"k_factor must be >= 1, got {k_factor}")
        self.snapshot = snapshot
        if device is None:
            self.device = None
        else:
            import torch

            self.device = torch.device(device)
        self.exact_chunk = exact_chunk
        self.T = snapshot.manifest.tokens_per_image
        self.D = snapshot.manifest.dim
        # two framings scored apart ("best" framing score): the rerank keeps each image's better framing
        self.framings = snapshot.manifest.encoder.score_framings
        self.codes = snapshot.codes if use_codes else None
        self.refine = refine
        self.refine_share = float(refine_share)
        self.k_factor = int(k_factor) if self.codes is not None else 1
        self.search_threads = search_threads
        self.batch_threads = batch_threads or os.cpu_count() or 1

    @property
    def default_depth(self) -> int:
        """The manifest's candidate depth k' (what ``search`` uses when given none)."""
        return int(self.snapshot.manifest.faiss.depth or DEFAULT_DEPTH)

    def _check_query(self, query: np.ndarray, k: int, depth: int) -> np.ndarray:
        query = np.asarray(query, dtype=np.float32)
        if query.ndim != 2 or query.shape[1] != self.D or query.shape[0] < 1:
            raise ConfigError(f"query tokens must be (m, {self.D}), got {tuple(query.shape)}")
        framing_split(query.shape[0], self.T, self.framings)  # framings scored apart: equal blocks, one per framing
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
        _, token_ids = self._neighbours(query, depth, nprobe, self.search_threads)
        return self._live_images(token_ids.reshape(-1))

    def _neighbours(self, query: np.ndarray, depth: int, nprobe: int | None,
                    threads: int | None) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's ``depth`` nearest token vectors of each query vector (q, D): sims and ids, (q, depth) each,
        descending per row. With ``k_factor`` > 1, FAISS's ``k_factor x depth`` nearest re-ranked on the codes
        (``CodeStore.token_sims``): sims are then the codes' similarities."""
        if self.snapshot.faiss.ntotal == 0:
            return (np.full((len(query), depth), -np.inf, dtype=np.float32),
                    np.full((len(query), depth), -1, dtype=np.int64))
        nprobe = nprobe or self.snapshot.manifest.faiss.nprobe
        fetch = min(depth * self.k_factor, max(depth, int(self.snapshot.faiss.ntotal)))
        sims, ids = faiss_index.search(self.snapshot.faiss, query, fetch, nprobe=nprobe, threads=threads)
        if fetch == depth:
            return sims, ids
        return self.best_by_codes(query, ids, depth)

    def best_by_codes(self, query: np.ndarray, ids: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """The token re-ranking of ``k_factor``: FAISS's neighbours ``ids`` (q, f) int64 of the query vectors
        (q, D) scored on the compressed store's codes (``CodeStore.token_sims``), the best ``depth`` of each row
        kept: (sims, ids), (q, depth) each, descending per row (ties in FAISS's order)."""
        sims = self.codes.token_sims(query, ids)
        best = np.argsort(-sims, axis=1, kind="stable")[:, :depth]
        return np.take_along_axis(sims, best, axis=1), np.take_along_axis(ids, best, axis=1)

    def _bounded_extra(self, query: np.ndarray, sims: np.ndarray, token_ids: np.ndarray, seen: np.ndarray,
                       theta: float, nprobe: int | None, threads: int | None) -> np.ndarray:
        """Images the first round missed that could still enter the top k (``candidates.range_radius``).

        Args:
            query: (m, D) float32; sims, token_ids: (m, depth) first-round neighbours; seen: (c,) int64 sorted
            candidate ids already scored; theta: their k-th best score.

        Returns:
            (e,) int64 live image ids not in ``seen``, ascending.
        """
        tails, full = cands.list_tails(sims, token_ids)
        nprobe = nprobe or self.snapshot.manifest.faiss.nprobe
        found = []
        # framings scored apart: an image's score is its better framing's, so each framing's query tokens must
        # bound it below theta on their own (``candidates.range_radius`` per block)
        for block in np.split(np.arange(len(query)), self.framings):
            which, radius = cands.range_radius(tails[block], full[block], theta)
            if len(which):
                found.append(cands.range_tokens(self.snapshot.faiss, query[block[which]], radius, nprobe=nprobe,
                                                threads=threads))
        if not found:
            return np.zeros(0, dtype=np.int64)
        return np.setdiff1d(self._live_images(np.concatenate(found)), seen, assume_unique=True)

    def _ann(self, query: np.ndarray, sims: np.ndarray, token_ids: np.ndarray, cand: np.ndarray, k: int,
             nprobe: int | None, method: str, threads: int | None) -> tuple[np.ndarray, np.ndarray, int, float, float]:
        """The candidates ``cand`` (c,) (the live images of the first-round neighbours (m, depth),
        ``_enough_neighbours``) ranked; returns ids, scores, number of candidates, candidate ms and rank ms. The
        bounded method adds the images ``_bounded_extra`` finds."""
        t1 = time.perf_counter()
        ids, scores = self._rank(query, cand, k)
        t2 = time.perf_counter()
        if method == "depth" or len(ids) < k:
            return ids, scores, len(cand), 0.0, (t2 - t1) * 1e3
        extra = self._bounded_extra(query, sims, token_ids, cand, float(scores[-1]), nprobe, threads)
        t3 = time.perf_counter()
        if len(extra):
            more_ids, more_scores = self.rank_extra(query, extra, k)
            ids, scores = top_k(np.concatenate([ids, more_ids]), np.concatenate([scores, more_scores]), k)
        t4 = time.perf_counter()
        return ids, scores, len(cand) + len(extra), (t3 - t2) * 1e3, (t2 - t1 + t4 - t3) * 1e3

    def _enough_neighbours(self, query: np.ndarray, sims: np.ndarray, token_ids: np.ndarray, k: int, depth: int,
                           nprobe: int | None,
                           threads: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Widen the depth (x4 per step, up to every token vector) while the candidates are fewer than
        min(k, images): k results are returned whenever the index holds k images, even when a few images own
        all of the query tokens' nearest neighbours. Takes the neighbours (sims, token_ids, both (m, depth));
        returns the neighbours, their live images (c,) int64 ascending (the candidates) and the depth that gave
        them."""
        want = min(k, len(self.snapshot.store))
        cap = min(MAX_DEPTH, int(self.snapshot.faiss.ntotal))
        cand = self._live_images(token_ids.reshape(-1))
        while len(cand) < want and depth < cap:
            depth = min(depth * 4, cap)
            sims, token_ids = self._neighbours(query, depth, nprobe, threads)
            cand = self._live_images(token_ids.reshape(-1))
        return sims, token_ids, cand, depth

    def _live_images(self, token_ids: np.ndarray) -> np.ndarray:
        token_ids = token_ids[token_ids >= 0]
        image_ids = np.unique(token_ids // self.T)
        return image_ids[self.snapshot.store.is_live(image_ids)]

    def _maxsim(self, query: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """MaxSim of ``query`` (m, D) against ``docs`` (c, T, D): (c,) float32; an index of two framings scored
        apart: each image's better framing (``self.framings``)."""
        if self.device is None:
            return maxsim_gemm_np(query, docs, framings=self.framings)
        import torch

        from regis.scores.maxsim import maxsim_gemm

        q = torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32)).to(self.device)
        return maxsim_gemm(q, torch.from_numpy(docs).to(self.device), framings=self.framings).float().cpu().numpy()

    def rerank(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Exact MaxSim of ``query`` (m, D) against the stored float16 tokens of ``ids`` (c,): (c,) float32."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.float32)
        return self._maxsim(query, self.snapshot.store.get(ids))

    def rerank_codes(self, query: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """MaxSim of ``query`` (m, D) against the decoded compressed tokens of ``ids`` (c,): (c,) float32.

        Raises:
            ConfigError: the index has no compressed token store.
        """
        if self.codes is None:
            raise ConfigError("this index has no compressed token store (token_store is float16)")
        if len(ids) == 0:
            return np.zeros(0, dtype=np.float32)
        scores = self.codes.maxsim(query, ids, self._gemm_nt, framings=self.framings)  # plain SQ4: on its codes
        return self._maxsim(query, self.codes.get(ids)) if scores is None else scores

    def _gemm_nt(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (m, K) @ b (n, K).T float32 on the CPU: torch's GEMM (its own thread count) unless the searcher is
        torch-free (``device=None``: numpy)."""
        if self.device is None:
            return a @ b.T
        import torch

        return (torch.from_numpy(a) @ torch.from_numpy(b).T).numpy()

    def refine_rows(self, k: int, num_candidates: int, share: float | None = None) -> int:
        """Candidates re-scored exactly on float16 after the codes ranked ``num_candidates`` of them:
        ``max(refine x k, ceil(share x num_candidates))``, ``share`` the index's ``refine_share`` unless given.
        The share makes the re-scored rows follow the candidate count, which grows with the collection: SQ4's
        ordering of many close images misplaces more of the exact top k (BENCHMARKS.md section 9: at 1M images,
        ~860 candidates, 80 rows gave recall@10 0.967)."""
        share = self.refine_share if share is None else share
        return max(self.refine * k, int(np.ceil(share * num_candidates)))

    def rank_extra(self, query: np.ndarray, extra: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top k of the bounded method's extra images (``_bounded_extra``: the first round missed them, a range
        search found that they could still beat its k-th score): as ``_rank``, but with an index of compressed
        tokens only the codes' best ``refine x k`` are re-scored on float16, not a share of them. The extras are
        many where the first round's bound is loose (two framings at 1M images: 1,447 a query on average, p90
        3,953) and seldom enter the top k: with the share their float16 rows were most of the p99 (BENCHMARKS.md
        section 9, run T, ``python -m bench.extras_share``: p99 96-249 -> 65 ms, recall@10 0.998 either way).

        Args:
            query: (m, D) float32; extra: (e,) int64 live image ids; k: results wanted.

        Returns:
            (ids, scores): at most k, best first.
        """
        return self._rank(query, extra, k, share=0.0)

    def _rank(self, query: np.ndarray, cand: np.ndarray, k: int,
              share: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top k of the candidates: exact float16 rerank, or codes then exact re-scoring of ``refine_rows``
        (``share``: as ``refine_rows``)."""
        if self.codes is not None and self.refine == 0:
            return top_k(cand, self.rerank_codes(query, cand), k)
        rows = self.refine_rows(k, len(cand), share)
        if self.codes is not None and len(cand) > rows:
            keep, _ = top_k(cand, self.rerank_codes(query, cand), rows)
            cand = np.sort(keep)
        return top_k(cand, self.rerank(query, cand), k)

    def _exact(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        best_ids = np.zeros(0, dtype=np.int64)
        best_scores = np.zeros(0, dtype=np.float32)
        for ids, tokens in self.snapshot.store.iter_chunks(self.exact_chunk):
            scores = self._maxsim(query, tokens)
            best_ids, best_scores = top_k(
                np.concatenate([best_ids, ids]), np.concatenate([best_scores, scores]), k
            )
        return best_ids, best_scores, len(self.snapshot.store)

    def search(
        self,
        query: np.ndarray,
        k: int = 10,
        depth: int | None = None,
        mode: Mode = "ann",
        nprobe: int | None = None,
        candidates: str | None = None,
    ) -> SearchResult:
        """Rank the index's images for one query.

        Args:
            query: (m, D) float32 unit-norm query tokens (m need not equal T).
            k: results wanted, 1..1000.
            depth: ANN mode: neighbours per query token (k'), 1..4096; None: the manifest's.
            mode: "ann" (candidates + rerank) or "exact" (score every image).
            nprobe: IVF lists probed for this call.
            candidates: ANN mode: candidate method for this call ("depth" or "bounded"); None: the searcher's.

        Returns:
            A ``SearchResult``.

        Raises:
            ConfigError: bad shapes or parameters.
        """
        depth = depth or self.default_depth
        query = self._check_query(query, k, depth)
        if mode == "exact":
            t0 = time.perf_counter()
            ids, scores, n = self._exact(query, k)
            return SearchResult(ids, scores, n, {"candidates": 0.0, "rerank": (time.perf_counter() - t0) * 1e3})
        if mode != "ann":
            raise ConfigError(f"mode must be 'ann' or 'exact', got {mode!r}")
        method = cands.check_method(candidates or self.candidate_method)
        t0 = time.perf_counter()
        sims, token_ids = self._neighbours(query, depth, nprobe, self.search_threads)
        sims, token_ids, cand, depth = self._enough_neighbours(query, sims, token_ids, k, depth, nprobe,
                                                               self.search_threads)
        t1 = time.perf_counter()
        ids, scores, n, cand_ms, rank_ms = self._ann(query, sims, token_ids, cand, k, nprobe, method,
                                                     self.search_threads)
        return SearchResult(ids, scores, n, {"candidates": (t1 - t0) * 1e3 + cand_ms, "rerank": rank_ms},
                            depth=depth)

    def search_batch(
        self, queries: np.ndarray, k: int = 10, depth: int | None = None, nprobe: int | None = None,
        candidates: str | None = None, threads: int | None = None,
    ) -> list[SearchResult]:
        """ANN search of many queries at once: one FAISS call for all their tokens (FAISS spreads it over its
        threads), then the per-query rerank. Same results as ``search`` query by query.

        Args:
            queries: (B, m, D) float32 unit-norm query tokens.
            k, depth, nprobe, candidates: as ``search``.
            threads: FAISS threads of this call (None: ``batch_threads``); the service's batched path passes 1,
                as its encoder threads already take the cores.

        Returns:
            B ``SearchResult``; timings are the batch's, divided evenly.

        Raises:
            ConfigError: bad shapes or parameters.
        """
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim != 3 or queries.shape[0] < 1:
            raise ConfigError(f"queries must be (B, m, {self.D}), got {tuple(queries.shape)}")
        depth = depth or self.default_depth
        method = cands.check_method(candidates or self.candidate_method)
        b, m, _ = queries.shape
        threads = threads or self.batch_threads
        for q in queries[:1]:
            self._check_query(q, k, depth)
        t0 = time.perf_counter()
        sims, token_ids = self._neighbours(queries.reshape(b * m, -1), depth, nprobe, threads)
        t1 = time.perf_counter()
        out = []
        for i in range(b):
            rows = slice(i * m, (i + 1) * m)
            q_sims, q_ids, cand, _ = self._enough_neighbours(queries[i], sims[rows], token_ids[rows], k, depth,
                                                             nprobe, threads)
            ids, scores, n, _, _ = self._ann(queries[i], q_sims, q_ids, cand, k, nprobe, method, threads)
            out.append(SearchResult(ids, scores, n, depth=depth))
        t2 = time.perf_counter()
        for r in out:
            r.timings_ms = {"candidates": (t1 - t0) * 1e3 / b, "rerank": (t2 - t1) * 1e3 / b}
        return out
