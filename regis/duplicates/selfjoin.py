"""The self-join: every image's stored tokens searched against the index, pairs kept above a floor.

For a batch of query images, one FAISS call fetches the ``depth`` nearest token vectors of all their tokens (the
candidate stage of a search, ``regis.retrieve.candidates``); the images owning them are each query's candidates.
Every candidate is scored exactly from the stored float16 tokens in both directions at once (one matrix product
gives the query-token x candidate-token cosines: the max over the candidate's tokens summed over the query's is
S(q, c), the max over the query's tokens summed over the candidate's is S(c, q); METHODS.md section 1). A pair is
kept when S / T reaches ``floor`` in either direction; each query keeps its ``neighbours`` best.

An index of two framings per image ("center-crop+aspect", 2T tokens an image: the default of new CNN indexes, on
which the relation thresholds are calibrated, docs/DUPLICATES.md) scores each direction on the centre crop's T tokens
of one image matched against all 2T tokens of the other ("centre-all"): S(a, b) = sum over a's centre-crop tokens of
the best of b's tokens in either framing. A crop from the side of a landscape photo (or the end of a portrait) is
largely cut off by that photo's centre crop; its whole-image tokens still hold it (at equal numbers of unrelated
pairs let through, 1.7-2.4 % more of the labelled set's crop pairs reach the floor or gate than with centre-crop tokens
on both sides: ``python -m bench.duplicates_framings``). Only the centre crop's tokens search FAISS; FAISS holds both
framings' tokens, so a query token's nearest tokens include aspect-framing ones (its own image's among them): the
depth is per framing (``depth`` x framings neighbours are fetched), and an aspect token's image is a candidate like
any other. An index of one framing scores its T tokens both ways, as before.

A pair is found when one of the query's tokens has one of the other image's tokens among its ``depth`` nearest:
near-duplicates share near-identical tokens, so a shallow depth finds them, unless more than ``depth`` images share
the same token. With ``complete=True`` the bound of the ``bounded`` candidate method
(``regis.retrieve.candidates.range_radius``), with the floor as its threshold, says when images outside the first
round could still reach the floor; those tokens get one FAISS range search more, so no pair above the floor is lost
to a full neighbour list (up to the FAISS index's own approximation, and ``RANGE_CAP`` tokens per query token).
With a low floor that search returns much of the collection for most queries: it is off by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from regis.errors import ConfigError
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve import candidates as cands
from regis.scores.maxsim_np import maxsim_terms

DEFAULT_BATCH = 256  # query images per FAISS call
STAGES = ("search", "candidates", "fetch", "score", "select", "merge")  # where a self-join's time goes


@dataclass
class CandidatePairs:
    """Pairs of images (a < b) with their MaxSim per token in both directions.

    Attributes:
        a, b: (p,) int64 image ids, a < b.
        s_ab: (p,) float32 S(a, b) / T: a's tokens matched in b (1.0: every token of a has an identical one in b).
        s_ba: (p,) float32 S(b, a) / T.
    """

    a: np.ndarray
    b: np.ndarray
    s_ab: np.ndarray
    s_ba: np.ndarray

    @classmethod
    def empty(cls) -> CandidatePairs:
        """No pairs."""
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), np.zeros(0, np.float32), np.zeros(0, np.float32))

    def __len__(self) -> int:
        return len(self.a)

    def take(self, keep: np.ndarray) -> CandidatePairs:
        """The pairs selected by a bool mask or index array."""
        return CandidatePairs(self.a[keep], self.b[keep], self.s_ab[keep], self.s_ba[keep])

    @classmethod
    def concat(cls, parts: list[CandidatePairs]) -> CandidatePairs:
        """All pairs of ``parts``, each (a, b) once (sorted by a, then b)."""
        if not parts:
            return cls.empty()
        a = np.concatenate([p.a for p in parts])
        b = np.concatenate([p.b for p in parts])
        s_ab = np.concatenate([p.s_ab for p in parts])
        s_ba = np.concatenate([p.s_ba for p in parts])
        _, first = np.unique(np.stack([a, b], axis=1), axis=0, return_index=True)
        return cls(a[first], b[first], s_ab[first], s_ba[first])


def both_ways(query: np.ndarray, docs: np.ndarray, scored: int) -> tuple[np.ndarray, np.ndarray]:
    """MaxSim of a query against documents, and of each document against the query, from one product.

    NumPy, not torch: these products are small (T x c*T'), and threads cost more than they compute on them;
    ``self_join`` runs it with BLAS on one thread (threadpoolctl), which torch's process-wide thread count does not
    allow without changing the service's (on 2 busy cores, 1,024 queries of a 20,000-image collection of
    ``python -m bench.duplicates``: torch with 2 threads 30 s, NumPy with 2 BLAS threads 11.5 s, with 1 5.3 s).

    Args:
        query: (T, D) float32 tokens.
        docs: (c, T', D) float tokens (float16 is upcast).
        scored: the first ``scored`` tokens of each side are scored, each against all of the other side's tokens
            (T: a two-framing index's centre crop against both framings, "centre-all", module docstring; on an
            index of one framing every token).

    Returns:
        forward (c,) S(query, doc) and reverse (c,) S(doc, query), float32 (sums over the scored tokens).
    """
    c, t, d = docs.shape
    sims = (query @ docs.reshape(-1, d).astype(np.float32, copy=False).T).reshape(query.shape[0], c, t)
    return maxsim_terms(sims[:scored]), sims[:, :, :scored].max(axis=0).sum(axis=1)


def score_against(snapshot: IndexSnapshot, query: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MaxSim per token of one image's stored tokens against images ``ids`` both ways, as the self-join scores its
    candidates (``both_ways``: on an index of two framings, each side's centre-crop tokens against all of the
    other's; every stored token read).

    Args:
        query: (W, D) float32 every stored token of the query image (W: ``store.tokens_per_image``).
        ids: (c,) int64 live image ids.

    Returns:
        (c,) S(query, id) / T and (c,) S(id, query) / T, float32 (T: the tokens of one framing).
    """
    t = snapshot.manifest.encoder.tokens_per_framing
    if len(ids) == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    fwd, rev = both_ways(query, snapshot.store.get(ids, snapshot.store.tokens_per_image), t)
    return fwd / t, rev / t


def score_pairs(snapshot: IndexSnapshot, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``score_against`` of given pairs: (p,) S(a, b) / T and (p,) S(b, a) / T, float32, for (p,) int64 live image
    ids a and b."""
    width = snapshot.store.tokens_per_image
    s_ab, s_ba = np.zeros(len(a), np.float32), np.zeros(len(a), np.float32)
    for x in np.unique(a).tolist():
        rows = np.flatnonzero(a == x)
        query = snapshot.store.get(np.array([x], np.int64), width)[0].astype(np.float32)
        s_ab[rows], s_ba[rows] = score_against(snapshot, query, np.asarray(b[rows], np.int64))
    return s_ab, s_ba


class _Join:
    """The state of one self-join over a snapshot (see ``self_join``)."""

    def __init__(self, snapshot: IndexSnapshot, floor: float, neighbours: int, depth: int, nprobe: int | None,
                 threads: int | None, complete: bool, per_image: bool = False):
        self.snapshot = snapshot
        self.store = snapshot.store
        self.per_id = snapshot.manifest.tokens_per_image  # FAISS token ids per image (owner = token id // per_id)
        self.T = snapshot.manifest.encoder.tokens_per_framing  # tokens scored: the first framing's
        self.width = self.store.tokens_per_image  # tokens read: every framing's (centre-all)
        self.floor = floor
        self.neighbours = neighbours
        self.depth = depth
        self.nprobe = nprobe or snapshot.manifest.faiss.nprobe
        self.threads = threads
        self.complete = complete
        self.spent = dict.fromkeys(STAGES, 0.0)  # seconds per stage (``self_join``'s ``stats``)
        self.scored = 0  # query-candidate pairs scored
        self.per_image = complete or per_image  # image by image (``one``): ``complete``'s range search is per image

    def owners(self, token_ids: np.ndarray) -> np.ndarray:
        token_ids = token_ids[token_ids >= 0]
        ids = np.unique(token_ids // self.per_id)
        return ids[self.store.is_live(ids)]

    def score(self, query: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return score_against(self.snapshot, query, ids)

    def one(self, image_id: int, query: np.ndarray, sims: np.ndarray, token_ids: np.ndarray) -> CandidatePairs:
        """The kept pairs of one query image from its tokens' first-round neighbours (T, depth)."""
        q = query
        cand = self.owners(token_ids.reshape(-1))
        cand = cand[cand != image_id]
        self.scored += len(cand)
        fwd, rev = self.score(q, cand)
        best = np.maximum(fwd, rev)
        # the bound: an image none of whose tokens came back scores <= sum of the lists' last similarities
        kth = np.sort(fwd)[-self.neighbours] if len(fwd) >= self.neighbours else -np.inf
        theta = max(self.floor, float(kth)) * self.T
        which, radius = np.zeros(0, np.int64), 0.0
        if self.complete:
            tails, full = cands.list_tails(sims, token_ids)
            which, radius = cands.range_radius(tails, full, theta)
        if len(which):
            found = cands.range_tokens(self.snapshot.faiss, query[:self.T][which], radius, nprobe=self.nprobe,
                                       threads=self.threads)
            extra = np.setdiff1d(self.owners(found), np.append(cand, image_id))
            self.scored += len(extra)
            if len(extra):
                f2, r2 = self.score(q, extra)
                cand, fwd, rev = np.concatenate([cand, extra]), np.concatenate([fwd, f2]), np.concatenate([rev, r2])
                best = np.maximum(fwd, rev)
        keep = np.flatnonzero(best >= self.floor)
        if len(keep) > self.neighbours:
            keep = keep[np.argsort(-best[keep], kind="stable")[: self.neighbours]]
        other = cand[keep]
        swap = other < image_id  # store each pair as (a < b)
        a = np.where(swap, other, image_id).astype(np.int64)
        b = np.where(swap, image_id, other).astype(np.int64)
        s_ab = np.where(swap, rev[keep], fwd[keep]).astype(np.float32)
        s_ba = np.where(swap, fwd[keep], rev[keep]).astype(np.float32)
        return CandidatePairs(a, b, s_ab, s_ba)

    def batch(self, ids: np.ndarray) -> list[CandidatePairs]:
        """The kept pairs of a batch of query images: one FAISS call for all their tokens, then the candidates
        of every query at once (``vectorised``), or image by image with ``complete`` (its range search is per
        image)."""
        t0 = time.perf_counter()
        tokens = self.store.get(ids, self.width).astype(np.float32)  # (b, W, D): every framing's
        b, t, d = tokens.shape[0], self.T, tokens.shape[2]
        if self.snapshot.faiss.ntotal == 0:
            return []
        depth = min(self.depth, int(self.snapshot.faiss.ntotal))
        sims, token_ids = faiss_index.search(self.snapshot.faiss, np.ascontiguousarray(tokens[:, :t]).reshape(b * t, d),
                                             depth, nprobe=self.nprobe, threads=self.threads)  # the centre crop's
        self.spent["search"] += time.perf_counter() - t0
        if not self.per_image:
            return [self.vectorised(ids, tokens, token_ids.reshape(b, t * depth))]
        t1 = time.perf_counter()
        out = [self.one(int(ids[i]), tokens[i], sims[i * t:(i + 1) * t], token_ids[i * t:(i + 1) * t])
               for i in range(b)]
        self.spent["score"] += time.perf_counter() - t1
        return out

    def vectorised(self, ids: np.ndarray, tokens: np.ndarray, token_ids: np.ndarray) -> CandidatePairs:
        """``one`` for every query of a batch at once, with the same pairs and scores: the candidates of all
        queries from one ``np.unique`` of (query, owner), their tokens read from the store once (the union), the
        exact both-way MaxSim per query from one matrix product each, the floor and the per-query
        ``neighbours`` cut vectorised (ties kept in the same order: by candidate id).

        Args:
            ids: (b,) int64 query image ids; tokens: (b, W, D) float32 their tokens (every framing's, the centre
                crop's T first); token_ids: (b, T * depth) int64 FAISS token ids of their neighbours (-1: none).

        Returns:
            ``CandidatePairs`` of the batch (a < b; a pair found from both of its images appears twice, as with
            ``one``: ``CandidatePairs.concat`` keeps one).
        """
        t0 = time.perf_counter()
        b = tokens.shape[0]
        owner = np.where(token_ids >= 0, token_ids // self.per_id, -1)
        query = np.repeat(np.arange(b, dtype=np.int64), owner.shape[1])
        owner = owner.reshape(-1)
        ok = owner >= 0
        span = int(owner.max()) + 1 if ok.any() else 1
        key = np.unique(query[ok] * span + owner[ok])  # sorted: by query, then candidate id
        q, cand = key // span, key % span
        keep = self.store.is_live(cand) & (cand != ids[q])
        q, cand = q[keep], cand[keep]
        self.scored += len(cand)
        self.spent["candidates"] += time.perf_counter() - t0
        if len(cand) == 0:
            return CandidatePairs.empty()
        t1 = time.perf_counter()
        union, pos = np.unique(cand, return_inverse=True)
        docs = self.store.get(union, self.width)  # (u, W, D) float16, read once for the batch
        self.spent["fetch"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        fwd = np.empty(len(cand), np.float32)
        rev = np.empty(len(cand), np.float32)
        bounds = np.searchsorted(q, np.arange(b + 1))
        for i in range(b):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                fwd[lo:hi], rev[lo:hi] = both_ways(tokens[i], docs[pos[lo:hi]], self.T)
        fwd /= self.T
        rev /= self.T
        self.spent["score"] += time.perf_counter() - t2
        t3 = time.perf_counter()
        best = np.maximum(fwd, rev)
        keep = np.flatnonzero(best >= self.floor)
        q, cand, fwd, rev, best = q[keep], cand[keep], fwd[keep], rev[keep], best[keep]
        order = np.lexsort((-best, q))  # stable: equal scores stay in candidate order, as ``one``'s argsort
        rank = np.arange(len(order)) - np.searchsorted(q[order], q[order])
        keep = np.sort(order[rank < self.neighbours])
        q, other, fwd, rev = q[keep], cand[keep], fwd[keep], rev[keep]
        me = ids[q]
        swap = other < me  # store each pair as (a < b)
        out = CandidatePairs(np.where(swap, other, me).astype(np.int64), np.where(swap, me, other).astype(np.int64),
                             np.where(swap, rev, fwd).astype(np.float32), np.where(swap, fwd, rev).astype(np.float32))
        self.spent["select"] += time.perf_counter() - t3
        return out


def self_join(snapshot: IndexSnapshot, query_ids: np.ndarray | None = None, floor: float = 0.45,
              neighbours: int = 16, depth: int | None = None, nprobe: int | None = None, batch: int = DEFAULT_BATCH,
              threads: int | None = None, progress: Callable[[int, int], None] | None = None,
              complete: bool = False, stats: dict | None = None, per_image: bool = False) -> CandidatePairs:
    """Candidate pairs of the index: each query image against every live image (module docstring).

    Args:
        snapshot: the index version.
        query_ids: the images searched (None: every live image; an incremental run passes the new ones). Ids
            that are not live are skipped.
        floor: keep a pair when S / T >= floor in either direction.
        neighbours: pairs kept per query image (the best by max(S(a, b), S(b, a))).
        depth: FAISS neighbours per query token and framing (None: the manifest's; x2 on a two-framing index).
        nprobe: IVF lists probed (None: the manifest's).
        batch: query images per FAISS call.
        threads: FAISS threads (None: FAISS's default, every core).
        progress: called with (images searched, images to search) after each batch.
        complete: range-search saturated token lists so that no pair above the floor is missed (module docstring).
        stats: if given, filled with the wall milliseconds of each of ``STAGES`` ("search": reading the queries'
            tokens and the FAISS call; "candidates": their owners; "fetch": the candidates' tokens; "score":
            both-way MaxSim; "select": floor and neighbours; "merge": one row per pair) and the counts
            "queries", "candidates" (query-candidate pairs scored) and "pairs".
        per_image: score the candidates image by image, each image's tokens read on its own (the path before the
            batch was vectorised; the same pairs; ``python -m bench.duplicates --per-image`` compares them).

    Returns:
        ``CandidatePairs``, each pair once.

    Raises:
        ConfigError: neighbours, depth or batch < 1.
    """
    if neighbours < 1 or batch < 1 or (depth is not None and depth < 1):
        raise ConfigError(f"neighbours, depth and batch must be >= 1 (got {neighbours}, {depth}, {batch})")
    ids = snapshot.store.live_ids if query_ids is None else np.asarray(query_ids, dtype=np.int64)
    ids = np.unique(ids[snapshot.store.is_live(ids)])
    framings = snapshot.manifest.encoder.framings  # FAISS holds every framing's tokens: depth per framing
    join = _Join(snapshot, floor, neighbours, int(depth or snapshot.manifest.faiss.depth) * framings, nprobe, threads,
                 complete, per_image)
    parts: list[CandidatePairs] = []
    # small products: one BLAS thread (process-wide while it runs: a concurrent search's NumPy products too)
    with threadpool_limits(limits=1, user_api="blas"):
        for start in range(0, len(ids), batch):
            parts += join.batch(ids[start:start + batch])
            if progress is not None:
                progress(min(start + batch, len(ids)), len(ids))
    t0 = time.perf_counter()
    out = CandidatePairs.concat(parts)
    join.spent["merge"] += time.perf_counter() - t0
    if stats is not None:
        stats.update({f"{k}_ms": v * 1e3 for k, v in join.spent.items()})
        stats.update({"queries": int(len(ids)), "candidates": join.scored, "pairs": len(out)})
    return out
