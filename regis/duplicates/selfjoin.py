"""The self-join: every image's stored tokens searched against the index, pairs kept above a floor.

For a batch of query images, one FAISS call fetches the ``depth`` nearest token vectors of all their tokens (the
candidate stage of a search, ``regis.retrieve.candidates``); the images owning them are each query's candidates.
Every candidate is scored exactly from the stored float16 tokens in both directions at once (one matrix product
gives the query-token x candidate-token cosines: the max over the candidate's tokens summed over the query's is
S(q, c), the max over the query's tokens summed over the candidate's is S(c, q); METHODS.md section 1). A pair is
kept when S / T reaches ``floor`` in either direction; each query keeps its ``neighbours`` best.

A pair is found when one of the query's tokens has one of the other image's tokens among its ``depth`` nearest:
near-duplicates share near-identical tokens, so a shallow depth finds them, unless more than ``depth`` images share
the same token. With ``complete=True`` the bound of the ``bounded`` candidate method
(``regis.retrieve.candidates.range_radius``), with the floor as its threshold, says when images outside the first
round could still reach the floor; those tokens get one FAISS range search more, so no pair above the floor is lost
to a full neighbour list (up to the FAISS index's own approximation, and ``RANGE_CAP`` tokens per query token).
With a low floor that search returns much of the collection for most queries: it is off by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from regis.errors import ConfigError
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.retrieve import candidates as cands

DEFAULT_BATCH = 256  # query images per FAISS call


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


def both_ways(query: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MaxSim of a query against documents, and of each document against the query, from one product.

    NumPy, not torch: these products are small (T x c*T'), and threads cost more than they compute on them;
    ``self_join`` runs it with BLAS on one thread (threadpoolctl), which torch's process-wide thread count does not
    allow without changing the service's (on 2 busy cores, 1,024 queries of a 20,000-image collection of
    ``python -m bench.duplicates``: torch with 2 threads 30 s, NumPy with 2 BLAS threads 11.5 s, with 1 5.3 s).

    Args:
        query: (T, D) float32 tokens.
        docs: (c, T', D) float tokens (float16 is upcast).

    Returns:
        forward (c,) S(query, doc) and reverse (c,) S(doc, query), float32.
    """
    c, t, d = docs.shape
    sims = (query @ docs.reshape(-1, d).astype(np.float32, copy=False).T).reshape(query.shape[0], c, t)
    return sims.max(axis=2).sum(axis=0), sims.max(axis=0).sum(axis=1)


class _Join:
    """The state of one self-join over a snapshot (see ``self_join``)."""

    def __init__(self, snapshot: IndexSnapshot, floor: float, neighbours: int, depth: int, nprobe: int | None,
                 threads: int | None, complete: bool):
        self.snapshot = snapshot
        self.store = snapshot.store
        self.T = snapshot.manifest.tokens_per_image
        self.floor = floor
        self.neighbours = neighbours
        self.depth = depth
        self.nprobe = nprobe or snapshot.manifest.faiss.nprobe
        self.threads = threads
        self.complete = complete

    def owners(self, token_ids: np.ndarray) -> np.ndarray:
        token_ids = token_ids[token_ids >= 0]
        ids = np.unique(token_ids // self.T)
        return ids[self.store.is_live(ids)]

    def score(self, query: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(ids) == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        fwd, rev = both_ways(query, self.store.get(ids))
        return fwd / self.T, rev / self.T

    def one(self, image_id: int, query: np.ndarray, sims: np.ndarray, token_ids: np.ndarray) -> CandidatePairs:
        """The kept pairs of one query image from its tokens' first-round neighbours (T, depth)."""
        q = query
        cand = self.owners(token_ids.reshape(-1))
        cand = cand[cand != image_id]
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
            found = cands.range_tokens(self.snapshot.faiss, query[which], radius, nprobe=self.nprobe,
                                       threads=self.threads)
            extra = np.setdiff1d(self.owners(found), np.append(cand, image_id))
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
        tokens = self.store.get(ids).astype(np.float32)
        b, t, d = tokens.shape
        if self.snapshot.faiss.ntotal == 0:
            return []
        depth = min(self.depth, int(self.snapshot.faiss.ntotal))
        sims, token_ids = faiss_index.search(self.snapshot.faiss, tokens.reshape(b * t, d), depth,
                                             nprobe=self.nprobe, threads=self.threads)
        return [self.one(int(ids[i]), tokens[i], sims[i * t:(i + 1) * t], token_ids[i * t:(i + 1) * t])
                for i in range(b)]


def self_join(snapshot: IndexSnapshot, query_ids: np.ndarray | None = None, floor: float = 0.45,
              neighbours: int = 16, depth: int | None = None, nprobe: int | None = None, batch: int = DEFAULT_BATCH,
              threads: int | None = None, progress: Callable[[int, int], None] | None = None,
              complete: bool = False) -> CandidatePairs:
    """Candidate pairs of the index: each query image against every live image (module docstring).

    Args:
        snapshot: the index version.
        query_ids: the images searched (None: every live image; an incremental run passes the new ones). Ids
            that are not live are skipped.
        floor: keep a pair when S / T >= floor in either direction.
        neighbours: pairs kept per query image (the best by max(S(a, b), S(b, a))).
        depth: FAISS neighbours per query token (None: the manifest's).
        nprobe: IVF lists probed (None: the manifest's).
        batch: query images per FAISS call.
        threads: FAISS threads (None: FAISS's default, every core).
        progress: called with (images searched, images to search) after each batch.
        complete: range-search saturated token lists so that no pair above the floor is missed (module docstring).

    Returns:
        ``CandidatePairs``, each pair once.

    Raises:
        ConfigError: neighbours, depth or batch < 1.
    """
    if neighbours < 1 or batch < 1 or (depth is not None and depth < 1):
        raise ConfigError(f"neighbours, depth and batch must be >= 1 (got {neighbours}, {depth}, {batch})")
    ids = snapshot.store.live_ids if query_ids is None else np.asarray(query_ids, dtype=np.int64)
    ids = np.unique(ids[snapshot.store.is_live(ids)])
    join = _Join(snapshot, floor, neighbours, int(depth or snapshot.manifest.faiss.depth), nprobe, threads, complete)
    parts: list[CandidatePairs] = []
    # small products: one BLAS thread (process-wide while it runs: a concurrent search's NumPy products too)
    with threadpool_limits(limits=1, user_api="blas"):
        for start in range(0, len(ids), batch):
            parts += join.batch(ids[start:start + batch])
            if progress is not None:
                progress(min(start + batch, len(ids)), len(ids))
    return CandidatePairs.concat(parts)
