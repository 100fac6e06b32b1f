"""The index version the service answers from, and how a new one is swapped in.

``LiveIndex.refresh()`` opens the version the index's CURRENT file names and, if it is newer, hands it to the
query engine (``QueryEngine.swap``: one attribute assignment). A query in flight keeps the searcher it started
with and finishes on the old version; the old version's files and memory are released by reference counting
when the last such query returns (it is never closed under a query's feet). A version is published only when
complete, so there is never a half-built index to see.

``IndexWatcher`` calls ``refresh`` when the worker announces a version on Redis pub/sub, and every
``poll_s`` seconds anyway (a missed notice, Redis down, or a writer outside the queue such as
``regis index build``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from regis.errors import IndexFormatError, RegisError
from regis.indexes.layout import read_current

log = logging.getLogger("regis.service")


class LiveIndex:
    """Holds the encoder and the query engine (None until the first index version exists).

    Args:
        settings: service settings (``index_dir``, encoder choice, device, ``enable_jobs``).
        on_swap: called with the new version number after each swap.
    """

    def __init__(self, settings, on_swap: Callable[[int], None] | None = None):
        self.settings = settings
        self.on_swap = on_swap
        self.engine = None
        self.encoder = None
        self.swaps = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()

    @property
    def index_dir(self) -> Path:
        """The index directory."""
        return Path(self.settings.index_dir)

    @property
    def version(self) -> int | None:
        """The version queries run on now (None: no index yet)."""
        engine = self.engine
        return engine.snapshot.version if engine is not None else None

    def served(self) -> dict:
        """What is served, for /readyz: {"images": the image count of the version served (None: no index yet)}
        and, for a sharded collection, "shards": each shard's {"shard", "version", "images", "state"} (state "ok",
        "unavailable" or "unknown": ``ShardedQueryEngine.infos``)."""
        engine = self.engine
        if engine is None:
            return {"images": None}
        out = {"images": len(engine.snapshot)}
        infos = getattr(engine, "infos", None)
        if infos is not None:
            out["shards"] = [{k: i[k] for k in ("shard", "version", "images", "state")} for i in infos]
        return out

    @property
    def is_default_collection(self) -> bool:
        """Whether this is the default collection of a collections root (``index_dir`` not set apart from it):
        a service of collections starts without it, a service of one index does not."""
        s = self.settings
        return s.collections_root is not None and Path(s.index_dir) == Path(s.collections_root) / s.default_collection

    def published(self) -> bool:
        """Whether the collection has a published index version on disk (CURRENT names one; a sharded collection
        counts as published: its shards say). False for a collection created and not written to yet."""
        from regis.sharding.layout import is_sharded

        return self._current() is not None or is_sharded(self.index_dir)

    def _current(self) -> str | None:
        return read_current(self.index_dir) if self.index_dir.is_dir() else None

    def _build_encoder(self):
        from regis.index_encoder import encoder_for

        s = self.settings
        return encoder_for(self.index_dir, s.backbone, s.weights, s.random_init, None, None, s.device,
                           frame=s.frame, query_layout=s.query_layout)

    def ensure_encoder(self):
        """The service's encoder, built from the settings (or the index's manifest) on first use.

        Raises:
            ConfigError / WeightsError: the configured encoder cannot be built.
        """
        with self._lock:
            if self.encoder is None:
                self.encoder = self._build_encoder()
            return self.encoder

    def load(self) -> None:
        """Open the live version at startup.

        Without an index, a service with ``enable_jobs`` builds the configured encoder and waits for the first
        version; so does the default collection of a collections root (``is_default_collection``), without
        building the encoder; any other read-only one fails.

        Raises:
            IndexFormatError: no readable index (read-only service), or a corrupt one.
            IndexMismatchError / WeightsError: the encoder cannot be built or does not match the index.
        """
        from regis.retrieve.query import QueryEngine, set_torch_threads

        s = self.settings
        set_torch_threads(s.resolved_torch_threads())
        if self._load_sharded():
            return
        if self._current() is None and s.enable_jobs:
            self.encoder = self._build_encoder()
            log.info("no index in %s yet: waiting for the first version", self.index_dir)
            return
        if self._current() is None and self.is_default_collection:
            log.info("the default collection %s holds no index: the routes without /v1/collections/{name} answer "
                     "404 until it has one", self.index_dir)
            return
        if s.backbone is None and not s.random_init:  # the index's own encoder (as before jobs existed)
            self.engine = QueryEngine.open(s.index_dir, weights=str(s.weights) if s.weights else None,
                                           device=s.device, max_pixels=s.max_pixels, **s.query_encoding())
            self.encoder = self.engine.encoder
            return
        from regis.indexes.snapshot import IndexSnapshot

        snapshot = IndexSnapshot.open(s.index_dir)
        try:
            self.encoder = self._build_encoder()
            self.engine = QueryEngine(self.encoder, snapshot, s.device, s.max_pixels, **s.query_encoding())
        except BaseException:
            snapshot.close()
            raise

    def _load_sharded(self) -> bool:
        """Open a sharded collection (``regis.sharding.engine``: every shard in this process, the query fanned
        out and merged); False when ``index_dir`` is not one. Uploads, deletes and metadata changes write every
        shard through ``regis.sharding.write.CollectionWriter``; folder builds run with ``--ray``."""
        from regis.sharding.layout import is_sharded

        s = self.settings
        if not is_sharded(self.index_dir):
            return False
        from regis.sharding.engine import ShardedQueryEngine

        self.engine = ShardedQueryEngine.open(s.index_dir, weights=str(s.weights) if s.weights else None,
                                              device=s.device, max_pixels=s.max_pixels, **s.query_encoding())
        self.encoder = self.engine.encoder
        return True

    def _open_sharded_late(self) -> bool:
        """A sharded collection opened after start-up (a named collection on its first request, or one whose first
        version appeared since): True when it is now served."""
        from regis.sharding.layout import is_sharded

        if not is_sharded(self.index_dir):
            return False
        with self._lock:
            if self.engine is None:
                try:
                    self._load_sharded()
                except IndexFormatError as exc:  # no shard version yet: next time
                    self.last_error = str(exc)
                    return False
            version = self.engine.snapshot.version
        log.info("serving sharded collection %s version %d", self.index_dir, version)
        if self.on_swap is not None:
            self.on_swap(version)
        return True

    @property
    def sharded(self) -> bool:
        """Whether the engine serves a sharded collection."""
        return getattr(self.engine, "num_shards", None) is not None

    def _refresh_sharded(self, engine) -> bool:
        """Follow the collection record (``ShardedQueryEngine.refresh``: every shard moves to the record's state
        at once); True when the state changed."""
        with self._lock:
            if not engine.refresh():
                return False
            self.swaps += 1
            version = engine.snapshot.version
        log.info("serving sharded collection version %d (%s)", version, engine.snapshot.name)
        if self.on_swap is not None:
            self.on_swap(version)
        return True

    def refresh(self) -> bool:
        """Swap to the version CURRENT names if it is newer than the one served; True when it swapped.

        Errors (an unreadable or mismatching version) are logged and kept in ``last_error``; the service goes
        on answering from the version it has.
        """
        from regis.indexes.snapshot import IndexSnapshot
        from regis.retrieve.query import QueryEngine

        if self.sharded:  # a ShardedQueryEngine (in this process, or over Ray Serve)
            return self._refresh_sharded(self.engine)
        if self.engine is None and self._open_sharded_late():
            return True
        with self._lock:
            current = self._current()
            engine = self.engine
            if current is None or (engine is not None and engine.snapshot.name == current):
                return False
            try:
                snapshot = IndexSnapshot.open(self.index_dir, current)
            except (IndexFormatError, OSError) as exc:  # removed by a writer's clean-up in between (next time), or
                # the collection deleted (its tombstone: NotADirectoryError)
                self.last_error = str(exc)
                log.warning("cannot open index version %s: %s", current, exc)
                return False
            if engine is not None and snapshot.version <= engine.snapshot.version:
                snapshot.close()
                return False
            try:
                if engine is None:
                    if self.encoder is None:
                        self.encoder = self._build_encoder()  # (the lock is held: not ensure_encoder)
                    self.engine = QueryEngine(self.encoder, snapshot, self.settings.device, self.settings.max_pixels,
                                              **self.settings.query_encoding())
                else:
                    engine.swap(snapshot)  # the old snapshot goes when the last query using it returns
            except RegisError as exc:
                snapshot.close()
                self.last_error = str(exc)
                log.error("index version %s cannot be served: %s", current, exc)
                return False
            self.swaps += 1
            self.last_error = None
            version = snapshot.version
        log.info("serving index version %d", version)
        if self.on_swap is not None:
            self.on_swap(version)
        return True

    def close(self) -> None:
        """Close the live snapshot."""
        if self.engine is not None:
            self.engine.close()


class IndexWatcher:
    """A daemon thread that calls ``live.refresh()`` on every index-update notice and every ``poll_s`` seconds.

    Args:
        live: the live index.
        poll_s: polling period, seconds.
        redis_url: Redis to subscribe to (None: polling only).
        channel: the pub/sub channel (``RedisNames.index_updates``).
    """

    def __init__(self, live: LiveIndex, poll_s: float, redis_url: str | None = None, channel: str | None = None):
        self.live = live
        self.poll_s = poll_s
        self.redis_url = redis_url
        self.channel = channel
        self.notices = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regis-index-watcher", daemon=True)

    def start(self) -> IndexWatcher:
        """Start the thread."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (within about ``poll_s``)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _refresh(self) -> None:
        try:
            self.live.refresh()
        except Exception:  # the watcher must survive anything
            log.exception("index refresh failed")

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.redis_url and self.channel:
                self._listen()
            if self._stop.wait(self.poll_s):
                return
            self._refresh()

    def _listen(self) -> None:
        """Subscribe and refresh on each notice (and each ``poll_s`` without one) until Redis fails or stop."""
        import redis

        from regis.jobs.rq_queue import redis_connection

        conn = pubsub = None
        try:
            conn = redis_connection(self.redis_url, timeout_s=max(self.poll_s, 1.0) + 5.0)
            pubsub = conn.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self.channel)
            self._refresh()  # whatever was published before we listened
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=self.poll_s)
                if message is not None and message.get("type") == "message":
                    self.notices += 1
                self._refresh()
        except redis.exceptions.RedisError as exc:
            log.warning("index-update channel unavailable (%s); polling the index directory", type(exc).__name__)
        finally:
            for closable in (pubsub, conn):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:
                        pass
