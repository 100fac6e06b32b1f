"""A sharded collection behind the ``QueryEngine`` interface, so the service's routes serve it unchanged.

``ShardedQueryEngine`` decodes and encodes a query once, fans the query tokens out to every shard, merges their
exact MaxSim top-k (``regis.sharding.search.merge_top_k``) and pages the merged list. The shards are reached
through *shard clients* with one method, ``call(method, *args, ref=ShardRef)`` -> a handle whose ``result()``
gives the answer of ``ShardSearcher.<method>`` (``search``, ``select``, ``records``, ``tokens``, ``info``,
``explain``, ``stored_image``, ...) on the shard and version ``ref`` names (its folder, its number and the shard
count of the state, its version):

- ``LocalShards``: every shard opened in this process (embedded ``regis serve`` on a sharded collection);
- ``cluster.serve.RayShard``: a Ray Serve shard deployment (``regis serve --ray``).

Shard ``s`` of a state is asked of client ``s % len(clients)``: one client per shard when the engine starts, and a
collection re-sharded while it is served (``regis.sharding.reshard``) is served at once with the clients there are
(a Ray deployment then serves more than one shard, each in its own folder; `regis serve --ray` started again
deploys one per shard).

Every call is started on every shard before any answer is awaited, so remote shards work in parallel. A shard
whose call fails with ``UnavailableError`` (dead replica, timeout) is *missing*: the query fails with
``ShardsUnavailableError`` (HTTP 503 ``shards_unavailable``), or, with ``on_missing="partial"``, answers from the
other shards with ``partial: true`` and ``missing_shards``: never a silently incomplete ranking.

``snapshot`` is a ``ShardedView``: what the routes read of an ``IndexSnapshot`` (``version``, ``name``,
``len()``, ``manifest``, ``index_dir``, ``table.get / get_many / select_where``). The engine serves one
published state of the collection at a time (``regis.sharding.layout.read_state``: the collection record's
version and the version of every shard) and passes each shard's version with every call (``version=``), so
a query's fan-out reads one state: all of a write or none of it. ``refresh`` reads the record again and moves
every shard to the new state at once. The collection's version (what the query cache keys on) is the record's:
one more per write.

Explanations (``explain=true``, POST /v1/explain): each result lives in one shard (``shard_of``), an ordinary
regis index with its own stored tokens and buddy patches, so that shard explains it (``explain_hits``: one call
per shard holding results, in parallel; ``stored_image``: one call to the image's shard). They equal the
unsharded index's explanations of the same images.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, NotSupportedError, ShardsUnavailableError, UnavailableError
from regis.images.decode import DEFAULT_MAX_PIXELS
from regis.indexes.layout import version_number
from regis.indexes.table import ImageRecord
from regis.models.transforms import eval_transform
from regis.retrieve.query import QueryEngine, _page, result_json
from regis.retrieve.searcher import MAX_K, Mode
from regis.scores.framings import perfect_score
from regis.sharding.layout import CollectionState, read_state, shard_of
from regis.sharding.search import ShardSearcher, merge_top_k


class _Done:
    """An answer already computed (or its exception), with the ``result()`` of a remote call."""

    def __init__(self, fn, *args):
        try:
            self.value, self.error = fn(*args), None
        except Exception as exc:  # handed to whoever asks for the result
            self.value, self.error = None, exc

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def collection_encoder(collection: Path | str, weights: str | None = None, device: str = "cpu"):
    """The encoder a collection's manifest records (``RegisEncoder``; weights: the path given, else the copy the
    collection stores, else the manifest's source), for queries and for the images its writes embed.

    Raises:
        IndexFormatError: not a sharded collection, or no shard version yet.
        IndexMismatchError / WeightsError: the encoder cannot be rebuilt identically.
    """
    from regis.indexes.weights_copy import stored_weights
    from regis.models.encoder import encoder_from_manifest
    from regis.sharding.layout import collection_manifest, first_versioned_shard

    manifest = collection_manifest(collection)
    stored = stored_weights(first_versioned_shard(collection), manifest.weights)
    return encoder_from_manifest(manifest.encoder, manifest.weights, weights, device,
                                 stored=str(stored) if stored else None)


@dataclass(frozen=True)
class ShardRef:
    """Which shard a call is for: its folder name (``CollectionState.dir_name``), its number, the shard count of
    the state, and its version name (None: an empty shard)."""

    dir_name: str
    shard: int
    num_shards: int
    version: str | None


def shard_ref(state: CollectionState, shard: int) -> ShardRef:
    """The ``ShardRef`` of shard ``shard`` in ``state``."""
    return ShardRef(state.dir_name(shard), shard, state.num_shards, state.names[shard])


class LiveShard:
    """One shard folder of a collection opened in this process, at the versions its callers ask for:
    ``at(name)`` opens version ``name`` unless it is open already. The newest version stays open; the one it
    replaced is kept ``GRACE_S`` seconds for queries pinned to the state before (a query in flight keeps the
    searcher it started with either way; a dropped one is freed when the last query using it returns).

    Args:
        collection: the collection folder.
        ref: the shard (its folder, number and shard count; its version is opened now).
        device: torch device for the rerank.
    """

    GRACE_S = 30.0

    def __init__(self, collection: Path | str, ref: ShardRef, device: str = "cpu"):
        self.collection, self.device = str(collection), device
        self.dir_name, self.shard, self.num_shards = ref.dir_name, ref.shard, ref.num_shards
        self._lock = threading.Lock()
        self._open: list[ShardSearcher] = []  # newest version first
        self._replaced_at = 0.0
        self.at(ref.version)

    @property
    def searcher(self) -> ShardSearcher:
        """The newest version opened."""
        return self._open[0]

    def at(self, name: str | None) -> ShardSearcher:
        """The searcher over version ``name`` of the shard (None: empty), opened if needed.

        Raises:
            IndexFormatError: the version is missing or unreadable.
        """
        opened = self._open
        for searcher in opened:
            if searcher.name == name:
                if searcher is opened[0] and len(opened) > 1 and time.monotonic() - self._replaced_at > self.GRACE_S:
                    with self._lock:  # the grace is over: drop the replaced version
                        if self._open[0] is searcher:
                            self._open = self._open[:1]
                return searcher
        with self._lock:
            for searcher in self._open:
                if searcher.name == name:
                    return searcher
            searcher = ShardSearcher.at(Path(self.collection) / self.dir_name, self.shard, self.num_shards, name,
                                        self.device)
            if self._open and version_number(name) < version_number(self._open[0].name):
                self._open = [self._open[0], searcher]  # an older state asked again: keep the newest first
            else:
                self._open = [searcher, *self._open[:1]]
                self._replaced_at = time.monotonic()
            return searcher

    def close(self) -> None:
        """Close the shard's open snapshots."""
        for searcher in self._open:
            searcher.close()


class LiveShards:
    """The shard folders of a collection opened in this process, one ``LiveShard`` each, opened on first use
    (after a re-sharding, the new layout's folders; the old ones are closed ``RETIRE_S`` seconds after the last
    call that asked for them).

    Args:
        collection: the collection folder.
        device: torch device for the rerank.
    """

    RETIRE_S = 120.0

    def __init__(self, collection: Path | str, device: str = "cpu"):
        self.collection, self.device = str(collection), device
        self._lock = threading.Lock()
        self._live: dict[str, LiveShard] = {}
        self._used: dict[str, float] = {}

    def at(self, ref: ShardRef) -> ShardSearcher:
        """The searcher over ``ref``'s version of ``ref``'s shard folder, opened if needed.

        Raises:
            IndexFormatError: the version is missing or unreadable.
        """
        live = self._live.get(ref.dir_name)
        if live is None:
            with self._lock:
                live = self._live.get(ref.dir_name)
                if live is None:
                    live = self._live[ref.dir_name] = LiveShard(self.collection, ref, self.device)
                    self._retire()
        self._used[ref.dir_name] = time.monotonic()
        return live.at(ref.version)

    def _retire(self) -> None:
        """Close the folders no call asked for in ``RETIRE_S`` (a re-sharded collection's old shards)."""
        now = time.monotonic()
        for name in [n for n, t in self._used.items() if now - t > self.RETIRE_S]:
            self._used.pop(name, None)
            live = self._live.pop(name, None)
            if live is not None:
                live.close()

    def close(self) -> None:
        """Close every shard's open snapshots."""
        for live in list(self._live.values()):
            live.close()
        self._live.clear()


class LocalShards:
    """Shard client over every shard of the collection, opened in this process (``LiveShards``; calls run at
    once, in the caller's thread, so a batched search takes the caller's FAISS thread count: ``in_process``)."""

    in_process = True

    def __init__(self, collection: Path | str, device: str = "cpu"):
        self.live = LiveShards(collection, device)

    def call(self, method: str, *args, ref: ShardRef) -> _Done:
        """``ShardSearcher.<method>(*args)`` on the shard and version ``ref`` names."""
        try:
            searcher = self.live.at(ref)
        except Exception as exc:  # handed to whoever asks for the result
            return _Done(_raise, exc)
        return _Done(getattr(searcher, method), *args)

    def close(self) -> None:
        self.live.close()


def _raise(exc: Exception):
    raise exc


class ShardedTable:
    """The read side of ``ImageTable`` over every shard (global ids)."""

    def __init__(self, engine: ShardedQueryEngine):
        self.engine = engine

    def get_many(self, ids, state: CollectionState | None = None) -> dict[int, ImageRecord]:
        """Rows of global ``ids`` (each asked of its own shard), keyed by id; unknown ids are absent (``state``:
        the collection state to read, default the engine's).

        Raises:
            ShardsUnavailableError: a shard holding some of the ids did not answer.
        """
        ids = np.asarray(list(ids), dtype=np.int64)
        if not len(ids):
            return {}
        state = state or self.engine.state
        owners = shard_of(ids, state.num_shards)
        calls = {int(s): self.engine._call(state, int(s), "records", ids[owners == s]) for s in np.unique(owners)}
        out: dict[int, ImageRecord] = {}
        for s, call in calls.items():
            out.update(self.engine._answer(s, call, required=True))
        return out

    def get(self, image_id: int) -> ImageRecord | None:
        """The row of image ``image_id`` (None: no such image)."""
        if not 0 <= int(image_id) < 2**62:
            return None
        return self.get_many([int(image_id)]).get(int(image_id))

    def missing_fields(self, fields: list[str]) -> list[str]:
        """The metadata fields no image of any shard has (``ImageTable.missing_fields``), in the order given.

        Raises:
            ShardsUnavailableError: a shard did not answer.
        """
        state = self.engine.state
        calls = [self.engine._call(state, s, "missing_fields", list(fields)) for s in range(state.num_shards)]
        missing = set(fields)
        for i, call in enumerate(calls):
            missing &= set(self.engine._answer(i, call, required=True))
        return [f for f in fields if f in missing]

    def field_names(self) -> set[str]:
        """Every metadata field some image of some shard has (``ImageTable.field_names``)."""
        state = self.engine.state
        calls = [self.engine._call(state, s, "field_names") for s in range(state.num_shards)]
        return set().union(*(set(self.engine._answer(i, c, required=True)) for i, c in enumerate(calls)))

    def select_where(self, where: str | None, params=(), limit: int = 100, offset: int = 0
                     ) -> tuple[list[ImageRecord], int]:
        """A page of the rows matching a compiled metadata filter (``ImageTable.select_where``), in global id
        order, and the total count: each shard returns its first ``offset + limit`` matches, merged by id.

        Raises:
            ShardsUnavailableError: a shard did not answer.
        """
        state = self.engine.state
        calls = [self.engine._call(state, s, "select", where, list(params), limit, offset)
                 for s in range(state.num_shards)]
        answers = [self.engine._answer(i, c, required=True) for i, c in enumerate(calls)]
        rows = sorted((r for part, _ in answers for r in part), key=lambda r: r.id)
        return rows[offset : offset + limit], sum(total for _, total in answers)


class ShardedView:
    """What the service reads of a served ``IndexSnapshot``, for a sharded collection."""

    def __init__(self, engine: ShardedQueryEngine):
        self.engine = engine
        self.table = ShardedTable(engine)
        self.index_dir = engine.collection
        self.manifest = engine.manifest

    @property
    def version(self) -> int:
        """The collection's version (its record's: one more per write; ``regis.sharding.layout.read_state``)."""
        return self.engine.state.version

    @property
    def name(self) -> str:
        """The shards' version names, joined with "+" ("-" for an empty shard)."""
        return "+".join(name or "-" for name in self.engine.state.names)

    def __len__(self) -> int:
        return sum(i["images"] for i in self.engine.infos)


class ShardedQueryEngine(QueryEngine):
    """``QueryEngine`` over a sharded collection: decode and encode here, search on every shard, merge.

    Args:
        encoder: the collection's encoder (``regis.models.encoder.RegisEncoder``, or any object with ``config``
            and ``encode(pixels (B, 3, H, W) float32) -> (B, T, D)`` such as Ray Serve's remote encoder).
        shards: the shard clients (at least one; shard ``s`` is asked of ``shards[s % len(shards)]``: module
            docstring).
        collection: the collection folder.
        manifest: the collection's manifest (``regis.sharding.layout.collection_manifest``).
        device: torch device of the encoder.
        max_pixels: decompression-bomb limit for query images, pixels.
        on_missing: "error" (a missing shard fails the query) or "partial" (answer with the others, flagged).
        refresh: ask every shard for its version's info now (False: the image counts read 0 until ``refresh``
            runs; remote shards are not called from the constructor, which may run on an event loop). The
            collection's state is read from its record either way.
        query_runtime, query_threads: how a CNN encoder in this process encodes queries (``QueryEngine``'s).

    Raises:
        ConfigError: no shard client, a bad ``on_missing`` or query runtime.
        ShardsUnavailableError: with ``refresh``, a shard does not answer.
    """

    def __init__(self, encoder, shards: list, collection: Path | str, manifest, device: str = "cpu",
                 max_pixels: int = DEFAULT_MAX_PIXELS, on_missing: str = "error", refresh: bool = True,
                 query_runtime: str | None = None, query_threads: int | None = None):
        if on_missing not in ("error", "partial"):
            raise ConfigError(f"on_missing must be 'error' or 'partial', got {on_missing!r}")
        self._set_query_runtime(query_runtime, query_threads)
        self.collection = Path(collection)
        if not shards:
            raise ConfigError("a sharded query engine needs at least one shard client")
        self.encoder, self.shards, self.manifest = encoder, list(shards), manifest
        self.device, self.max_pixels, self.on_missing = device, max_pixels, on_missing
        self.transform = eval_transform(encoder.config)
        state = read_state(collection)
        self._pinned: tuple[CollectionState, list[dict]] = (state, [
            {"shard": s, "version": version_number(n) or None, "name": n, "images": 0, "state": "unknown"}
            for s, n in enumerate(state.names)])
        if refresh:
            self.refresh(required=True)
        self._view = ShardedView(self)

    @classmethod
    def open(cls, collection: Path | str, weights: str | None = None, device: str = "cpu",
             max_pixels: int = DEFAULT_MAX_PIXELS, query_runtime: str | None = None,
             query_threads: int | None = None) -> ShardedQueryEngine:
        """Open every shard of ``collection`` in this process with the encoder its manifest names
        (``query_runtime``, ``query_threads``: as the constructor's).

        Raises:
            IndexFormatError: not a sharded collection, no shard version yet, or an unreadable shard.
            IndexMismatchError / WeightsError: the collection's encoder cannot be rebuilt identically.
        """
        from regis.sharding.layout import collection_manifest

        manifest = collection_manifest(collection)
        encoder = collection_encoder(collection, weights, device)
        shards = LocalShards(collection, device)
        try:
            return cls(encoder, [shards], collection, manifest, device, max_pixels, query_runtime=query_runtime,
                       query_threads=query_threads)
        except BaseException:
            shards.close()
            raise

    # ----------------------------------------------------------------- shards
    def _answer(self, shard: int, call, required: bool = False):
        """A shard call's answer; ``UnavailableError`` becomes ``ShardsUnavailableError`` naming the shard when
        ``required`` (else it propagates for the caller to count the shard missing)."""
        try:
            return call.result()
        except UnavailableError:
            if not required:
                raise
            raise ShardsUnavailableError(f"shard {shard} of {self.num_shards} did not answer; retry later",
                                         [shard]) from None

    @property
    def num_shards(self) -> int:
        """S of the state served now (it changes when the collection is re-sharded)."""
        return self._pinned[0].num_shards

    @property
    def state(self) -> CollectionState:
        """The collection state served now (the collection version and every shard's version)."""
        return self._pinned[0]

    @property
    def infos(self) -> list[dict]:
        """Each shard's {"shard", "version", "name", "images", "state"} in the state served; "state": "ok" (it
        answered the last ``refresh``), "unavailable" (it did not: "images" is its last count) or "unknown" (not
        asked yet)."""
        return self._pinned[1]

    def _call(self, state: CollectionState, shard: int, method: str, *args):
        """Start ``method(*args)`` on shard ``shard`` of ``state`` at its version there (its client: module
        docstring)."""
        return self.shards[shard % len(self.shards)].call(method, *args, ref=shard_ref(state, shard))

    def refresh(self, required: bool = False) -> bool:
        """Read the collection's record; open its state on every shard (each shard's ``info`` at the listed
        version) and serve it from then on, every shard at once; True when the state changed. A shard that does
        not answer keeps its last image count unless ``required`` (then nothing changes and
        ``ShardsUnavailableError`` is raised).

        Raises:
            IndexFormatError: the record or a shard version it lists is unreadable (nothing changes).
            ShardsUnavailableError: ``required`` and a shard did not answer.
        """
        state = read_state(self.collection)
        old_state, old_infos = self._pinned
        calls = [self._call(state, s, "info") for s in range(state.num_shards)]
        same_layout = old_state.num_shards == state.num_shards and old_state.dirs == state.dirs
        infos = []
        for s, call in enumerate(calls):
            try:
                infos.append({**self._answer(s, call, required), "state": "ok"})
            except UnavailableError:
                name = state.names[s]
                last = old_infos[s] if same_layout else {"shard": s, "images": 0}
                infos.append({**last, "version": version_number(name) or None, "name": name,
                              "state": "unavailable"})
        self._pinned = (state, infos)  # one assignment: a query reads the old state or the new one
        return state != old_state

    @property
    def snapshot(self) -> ShardedView:
        """The collection as the routes read a snapshot (see ``ShardedView``)."""
        return self._view

    def swap(self, snapshot):
        """Not for sharded collections: the engine follows the collection's record (``refresh``)."""
        raise NotSupportedError("a sharded collection follows its collection record; use refresh()")

    # ----------------------------------------------------------------- search
    def search_tokens(self, tokens: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                      nprobe: int | None = None, candidates: str | None = None, where: dict | None = None,
                      offset: int = 0, score_threshold: float | None = None) -> dict:
        """``QueryEngine.search_tokens`` over every shard: each returns its exact top-(k + offset) (filtered by
        ``where`` on the shard), the merge keeps the best, then the page is cut. Table rows come with a shard's
        answer when it sends them (``SearchResult.records``: Ray Serve's shards), else one lookup per shard.
        Adds ``partial`` and ``missing_shards`` when shards are missing and ``on_missing`` is "partial".

        Raises:
            ConfigError: bad parameters (from any shard).
            ShardsUnavailableError: shards missing with ``on_missing="error"``, or every shard missing.
        """
        want = self._check(k, offset, where)
        query = np.ascontiguousarray(tokens, dtype=np.float32)
        state = self.state  # the whole query reads this one state
        calls = [self._call(state, s, "search", query, want, depth, mode, nprobe, candidates, where)
                 for s in range(state.num_shards)]
        parts, missing = self._gather(state, calls)
        return self._merged(state, [p for p in parts if p is not None], missing, k, depth, mode, offset,
                            score_threshold, len(query))

    def _check(self, k: int, offset: int, where: dict | None) -> int:
        """k + offset, checked (and the filter's fields, over the whole collection: a shard may lack one).

        Raises:
            ConfigError: k + offset past ``MAX_K``, or a filter on a field no image has.
        """
        want = k + offset
        if want > MAX_K:
            raise ConfigError(f"k + offset must be <= {MAX_K}, got {want}")
        if where:
            from regis.indexes.filters import check_fields

            check_fields(self.snapshot.table, where)
        return want

    def _gather(self, state: CollectionState, calls: list) -> tuple[list, list[int]]:
        """Each shard's answer (None where missing) and the missing shards.

        Raises:
            ShardsUnavailableError: shards missing with ``on_missing="error"``, or every shard missing.
        """
        parts, missing = [], []
        for s, call in enumerate(calls):
            try:
                parts.append(self._answer(s, call))
            except UnavailableError:
                parts.append(None)
                missing.append(s)
        if missing and (self.on_missing == "error" or len(missing) == state.num_shards):
            raise ShardsUnavailableError(f"shards {missing} of {state.num_shards} did not answer; the ranking would "
                                         "be incomplete: retry later", missing)
        return parts, missing

    def _merged(self, state: CollectionState, parts: list, missing: list[int], k: int, depth: int | None,
                mode: Mode, offset: int, score_threshold: float | None, m: int) -> dict:
        """The answer of one query of ``m`` tokens from its shards' results (``search_tokens``)."""
        merged = merge_top_k(parts, k + offset)
        records = {g: r for p in parts for g, r in (getattr(p, "records", None) or {}).items()}  # sent along
        ask = [int(g) for g in merged.ids.tolist() if int(g) not in records]
        if ask:
            records.update(self.snapshot.table.get_many(ask, state))
        out = result_json(merged, records, state.version, k, depth or self.manifest.faiss.depth, mode,
                          perfect_score(m, self.manifest.encoder.score_framings))
        if missing:
            out.update(partial=True, missing_shards=missing)
        return _page(out, offset, score_threshold)

    def search_tokens_batch(self, tokens: np.ndarray, k: int = 10, depth: int | None = None, mode: Mode = "ann",
                            nprobe: int | None = None, candidates: str | None = None, threads: int | None = None,
                            where: dict | None = None, offset: int = 0, score_threshold: float | None = None
                            ) -> list[dict]:
        """``search_tokens`` of each of the B queries (B, T, D) float32, with ONE call per shard for all of them
        (``ShardSearcher.search_batch``: one batched FAISS search per shard; on Ray Serve, S calls instead of
        B x S). ``threads``, the FAISS threads of ``QueryEngine.search_tokens_batch``, applies to the shards searched
        in this process (``LocalShards``: the embedded server, Ray Serve's ingress on one node); remote shards
        choose their own. Each answer equals ``search_tokens``'s.

        Raises:
            ConfigError: bad parameters (from any shard).
            ShardsUnavailableError: as ``search_tokens``.
        """
        want = self._check(k, offset, where)
        queries = np.ascontiguousarray(tokens, dtype=np.float32)
        if not len(queries):
            return []
        state = self.state
        calls = [self._call(state, s, "search_batch", queries, want, depth, mode, nprobe, candidates, where,
                            *((threads,) if getattr(self.shards[s % len(self.shards)], "in_process", False) else ()))
                 for s in range(state.num_shards)]
        parts, missing = self._gather(state, calls)
        return [self._merged(state, [p[b] for p in parts if p is not None], missing, k, depth, mode, offset,
                             score_threshold, queries.shape[1]) for b in range(len(queries))]

    def search_id(self, image_id: int, **params) -> dict:
        """"More like this" with the stored tokens of image ``image_id`` (asked of its shard).

        Raises:
            KeyError: no live image ``image_id``.
            ShardsUnavailableError: its shard does not answer.
        """
        tokens = self._ask_owner(image_id, "tokens")
        return self.search_tokens(np.asarray(tokens, dtype=np.float32), **params)

    def _ask_owner(self, image_id: int, method: str):
        """``method(image_id)`` asked of the shard that holds image ``image_id`` (``shard_of``).

        Raises:
            KeyError: no live image ``image_id`` (the shard answers None, or the id is out of range).
            ShardsUnavailableError: its shard does not answer.
        """
        if not 0 <= int(image_id) < 2**62:
            raise KeyError(image_id)
        state = self.state
        s = int(shard_of(int(image_id), state.num_shards))
        answer = self._answer(s, self._call(state, s, method, int(image_id)), required=True)
        if answer is None:
            raise KeyError(image_id)
        return answer

    # ----------------------------------------------------------------- explain
    def explain_hits(self, query: np.ndarray, hits: list[dict]) -> None:
        """``QueryEngine.explain_hits`` on a sharded collection: each result is explained by its own shard
        (``ShardSearcher.explain``), the shards holding results called in parallel.

        Args:
            query: (m, D) float32 query tokens.
            hits: the ``results`` of a ``search_tokens`` answer (global ids); changed in place.

        Raises:
            ShardsUnavailableError: a shard holding results did not answer.
        """
        query = np.ascontiguousarray(query, dtype=np.float32)
        groups: dict[int, list[dict]] = {}
        state = self.state
        for hit in hits:
            groups.setdefault(int(shard_of(int(hit["id"]), state.num_shards)), []).append(hit)
        calls = {s: self._call(state, s, "explain", query, [{"id": int(h["id"]), "width": h.get("width"),
                                                             "height": h.get("height")} for h in group])
                 for s, group in groups.items()}
        for s, call in calls.items():
            for hit, explanation in zip(groups[s], self._answer(s, call, required=True), strict=True):
                hit["explanation"] = explanation

    def stored_image(self, image_id: int):
        """``QueryEngine.stored_image``, asked of the image's shard.

        Raises:
            KeyError: no live image ``image_id``.
            ShardsUnavailableError: its shard does not answer.
        """
        return self._ask_owner(image_id, "stored_image")

    def close(self) -> None:
        """Close the shard clients that hold resources (local shards)."""
        for s in self.shards:
            close = getattr(s, "close", None)
            if close is not None:
                close()
