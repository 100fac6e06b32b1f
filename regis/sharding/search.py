"""Search over a sharded collection: the query tokens go to every shard, each shard returns its exact MaxSim
top-k (ANN: its own FAISS candidates, reranked exactly; exact: every image), and the merge keeps the k best.

The merge is exact: each shard's scores are exact MaxSim scores, and a global top-k image is in the top-k of its
own shard, so the merged list equals the unsharded one in exact mode (ties broken by ascending global id, as
``Searcher`` does: a shard's local order is its global order, since ``global = local * S + shard``). In ANN mode
every shard probes its own FAISS index with the full depth, so the sharded candidates are a superset in
expectation and the recall is at least the unsharded one's (tested).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.retrieve.searcher import Mode, Searcher, SearchResult, top_k
from regis.sharding.layout import CollectionState, read_state, shard_of, to_global, to_local

LIVE = "<live>"  # ShardSearcher.open's default: the version the collection record lists

log = logging.getLogger("regis.sharding")


def merge_top_k(parts: list[SearchResult], k: int) -> SearchResult:
    """The k best of several shards' results (global ids), score descending, id ascending on ties.

    Args:
        parts: each shard's ``SearchResult`` in global ids.
        k: results wanted.

    Returns:
        One ``SearchResult``: ``num_candidates`` summed, timings the slowest shard's per stage (ms).
    """
    if not parts:
        return SearchResult(np.zeros(0, np.int64), np.zeros(0, np.float32), 0, {"candidates": 0.0, "rerank": 0.0})
    ids, scores = top_k(np.concatenate([p.ids for p in parts]).astype(np.int64),
                        np.concatenate([p.scores for p in parts]).astype(np.float32), k)
    timings = {name: max(p.timings_ms.get(name, 0.0) for p in parts) for name in ("candidates", "rerank")}
    return SearchResult(ids, scores, sum(p.num_candidates for p in parts), timings, depth=parts[0].depth)


@dataclass
class ShardSearcher:
    """One shard of a collection, answering in global ids.

    Attributes:
        shard: the shard number s.
        num_shards: S.
        searcher: the ``Searcher`` over the shard's snapshot (None for a shard that never received an image).
    """

    shard: int
    num_shards: int
    searcher: Searcher | None

    @classmethod
    def open(cls, collection: Path | str, shard: int, device: str = "cpu", name: str | None = LIVE,
             state: CollectionState | None = None, **searcher_kwargs) -> ShardSearcher:
        """Open shard ``shard`` of the published state ``state`` (default: the one published now,
        ``regis.sharding.layout.read_state``) at version ``name`` (default ``LIVE``: the state's; None: the shard
        is empty in the state the caller read).

        Raises:
            IndexFormatError: the shard has no index although global ids were routed to it, or the version is
                missing or unreadable.
        """
        state = state if state is not None else read_state(collection)
        if name == LIVE:
            name = state.names[shard]
        return cls.at(state.shard_path(collection, shard), shard, state.num_shards, name, device, **searcher_kwargs)

    @classmethod
    def at(cls, path: Path | str, shard: int, num_shards: int, name: str | None, device: str = "cpu",
           **searcher_kwargs) -> ShardSearcher:
        """Open version ``name`` of the shard index in ``path``, shard ``shard`` of ``num_shards`` (None: an empty
        shard).

        Raises:
            IndexFormatError: the version is missing or unreadable.
        """
        if name is None:
            return cls(shard, num_shards, None)
        return cls(shard, num_shards, Searcher(IndexSnapshot.open(path, name), device=device, **searcher_kwargs))

    @property
    def version(self) -> int | None:
        """The shard's index version (None: empty shard)."""
        return self.searcher.snapshot.version if self.searcher else None

    @property
    def name(self) -> str | None:
        """The shard's index version name (None: empty shard)."""
        return self.searcher.snapshot.name if self.searcher else None

    def search(self, query: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
               nprobe: int | None = None, candidates: str | None = None, where: dict | None = None) -> SearchResult:
        """``Searcher.search`` on this shard (with a metadata filter ``where``: ``regis.retrieve.filtered`` over
        the shard's allowed images), ids made global. Query (m, D) float32.

        Raises:
            ConfigError: bad parameters or filter.
        """
        if self.searcher is None:
            return SearchResult(np.zeros(0, np.int64), np.zeros(0, np.float32), 0,
                                {"candidates": 0.0, "rerank": 0.0}, depth)
        if where:
            from regis.retrieve.filtered import allowed_ids, search_filtered

            allowed = allowed_ids(self.searcher.snapshot, where)
            r = search_filtered(self.searcher, query, allowed, k=k, depth=depth, mode=mode, nprobe=nprobe,
                                candidates=candidates)
        else:
            r = self.searcher.search(query, k=k, depth=depth, mode=mode, nprobe=nprobe, candidates=candidates)
        r.ids = to_global(r.ids, self.shard, self.num_shards)
        return r

    def missing_fields(self, fields: list[str]) -> list[str]:
        """The metadata fields no image of this shard has (``ImageTable.missing_fields``; empty shard: all)."""
        return self.searcher.snapshot.table.missing_fields(fields) if self.searcher is not None else list(fields)

    def field_names(self) -> set[str]:
        """The metadata fields some image of this shard has (``ImageTable.field_names``)."""
        return self.searcher.snapshot.table.field_names() if self.searcher is not None else set()

    def select(self, where: str | None, params: list, limit: int, offset: int) -> tuple[list[ImageRecord], int]:
        """The first ``offset + limit`` rows of this shard matching a compiled metadata filter (``where``, SQL
        with ``params``: ``regis.indexes.filters.compile_filter``; None: every row) in id order, with global ids,
        and the number of rows matching (the caller merges the shards and cuts the page)."""
        if self.searcher is None:
            return [], 0
        rows, total = self.searcher.snapshot.table.select_where(where, params, offset + limit, 0)
        return [dataclasses.replace(r, id=int(to_global(np.array([r.id]), self.shard, self.num_shards)[0]))
                for r in rows], total

    def tokens(self, image_id: int) -> np.ndarray | None:
        """The stored (T, D) float16 tokens of the live image with global id ``image_id`` (None: not here)."""
        if self.searcher is None or int(shard_of(image_id, self.num_shards)) != self.shard:
            return None
        local = to_local(np.array([image_id]), self.num_shards)
        store = self.searcher.snapshot.store
        return store.get(local)[0] if store.is_live(local)[0] else None

    def explain(self, query: np.ndarray, hits: list[dict]) -> list[dict | None]:
        """The explanations of this shard's results (``regis.retrieve.explain.explain_hits`` on the shard's live
        version: its stored tokens and buddy patches), in the order of ``hits``.

        Args:
            query: (m, D) float32 query tokens.
            hits: {"id": global id of this shard, "width", "height"} of each result to explain.

        Returns:
            One explanation dict per hit (see ``regis.retrieve.explain``), None for a hit no longer live here.

        Raises:
            ConfigError: an id that belongs to another shard.
        """
        from regis.retrieve.explain import explain_hits

        ids = np.array([int(h["id"]) for h in hits], dtype=np.int64)
        if (shard_of(ids, self.num_shards) != self.shard).any():
            raise ConfigError(f"ids {ids[shard_of(ids, self.num_shards) != self.shard].tolist()} are not in shard "
                              f"{self.shard} of {self.num_shards}")
        if self.searcher is None:
            return [None] * len(hits)
        local = [{"id": int(i), "width": h.get("width"), "height": h.get("height")}
                 for i, h in zip(to_local(ids, self.num_shards), hits, strict=True)]
        explain_hits(self.searcher.snapshot, np.asarray(query, dtype=np.float32), local)
        return [h["explanation"] for h in local]

    def stored_image(self, image_id: int):
        """What the shard stores of the live image with global id ``image_id`` for explanations
        (``regis.retrieve.explain.StoredImage``), or None: not a live image of this shard."""
        from regis.retrieve.explain import stored_image

        if self.searcher is None or not 0 <= int(image_id) < 2**62:
            return None
        if int(shard_of(int(image_id), self.num_shards)) != self.shard:
            return None
        return stored_image(self.searcher.snapshot, int(to_local(np.array([int(image_id)]), self.num_shards)[0]))

    def info(self) -> dict:
        """{"shard", "version", "name", "images"} (None, None, 0 for an empty shard)."""
        return {"shard": self.shard, "version": self.version, "name": self.name,
                "images": len(self.searcher.snapshot) if self.searcher else 0}

    def search_batch(self, queries: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                     nprobe: int | None = None, candidates: str | None = None, where: dict | None = None,
                     threads: int | None = None) -> list[SearchResult]:
        """B queries (B, m, D) float32 with the same parameters (ANN without a filter: one batched search,
        ``Searcher.search_batch`` on ``threads`` FAISS threads of the calling thread, None: unchanged; else query
        by query), ids made global."""
        if self.searcher is None or mode != "ann" or where:
            return [self.search(q, k, depth, mode, nprobe, candidates, where) for q in queries]
        out = self.searcher.search_batch(queries, k=k, depth=depth, nprobe=nprobe, candidates=candidates,
                                         threads=threads)
        for r in out:
            r.ids = to_global(r.ids, self.shard, self.num_shards)
        return out

    def records(self, ids: np.ndarray) -> dict[int, ImageRecord]:
        """Table rows of this shard's global ``ids`` (n,), keyed by global id, with global ids (ids of other
        shards: absent)."""
        if self.searcher is None:
            return {}
        ids = np.asarray(ids, dtype=np.int64)
        mine = ids[shard_of(ids, self.num_shards) == self.shard]
        rows = self.searcher.snapshot.table.get_many(to_local(mine, self.num_shards).tolist())
        return {int(g): dataclasses.replace(rows[int(local)], id=int(g))
                for g, local in zip(mine, to_local(mine, self.num_shards), strict=True) if int(local) in rows}

    def close(self) -> None:
        """Close the shard's snapshot."""
        if self.searcher is not None:
            self.searcher.snapshot.close()


class ShardedSearcher:
    """Every shard of a collection, searched one after the other in this process (the embedded path; the Ray
    application in ``cluster/`` runs one deployment per shard instead).

    Args:
        collection: the collection folder.
        device: torch device for the rerank.

    Raises:
        IndexFormatError: not a collection, or a shard unreadable.
    """

    def __init__(self, collection: Path | str, device: str = "cpu", **searcher_kwargs):
        state = read_state(collection)  # one published state for every shard
        self.num_shards = state.num_shards
        self.shards: list[ShardSearcher] = []
        try:
            for s in range(self.num_shards):
                self.shards.append(ShardSearcher.open(collection, s, device, state.names[s], state, **searcher_kwargs))
        except BaseException:
            self.close()
            raise

    def search(self, query: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
               nprobe: int | None = None, candidates: str | None = None) -> SearchResult:
        """Fan the query (m, D) float32 out to every shard and merge their top-k; see ``merge_top_k``."""
        t0 = time.perf_counter()
        out = merge_top_k([s.search(query, k, depth, mode, nprobe, candidates) for s in self.shards], k)
        out.timings_ms["total"] = (time.perf_counter() - t0) * 1e3
        return out

    def records(self, ids: np.ndarray) -> dict[int, ImageRecord]:
        """Table rows of global ``ids``, keyed by global id."""
        out: dict[int, ImageRecord] = {}
        for s in self.shards:
            out.update(s.records(ids))
        return out

    def close(self) -> None:
        """Close every shard."""
        for s in self.shards:
            s.close()
