"""Query-result cache in Redis, keyed by (query image SHA-256, index version, search parameters).

A new index version changes every key, so nothing is ever stale, and so does a new answer shape
(``regis.jobs.names.CACHE_ANSWER_FORMAT``); entries expire after a TTL. The cache never
fails a search: when Redis errors, the cache reports an error and stays off for ``backoff_s`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

log = logging.getLogger("regis.cache")


def params_key(**params) -> str:
    """A short stable digest of search parameters (sorted ``name=value`` pairs)."""
    text = "&".join(f"{k}={params[k]}" for k in sorted(params))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class QueryCache:
    """Search results in Redis.

    Args:
        conn: a redis-py client.
        names: ``regis.jobs.names.RedisNames`` (the key layout).
        ttl_s: seconds an entry lives.
        backoff_s: after a Redis error, seconds during which the cache is skipped.

    ``get`` and ``put`` never raise: they return / do nothing when Redis is down. ``last_error`` says whether
    the last call hit an error (the caller counts it).
    """

    def __init__(self, conn, names, ttl_s: int = 300, backoff_s: float = 5.0):
        self.conn = conn
        self.names = names
        self.ttl_s = ttl_s
        self.backoff_s = backoff_s
        self._down_until = 0.0
        self._lock = threading.Lock()

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            self._down_until = time.monotonic() + self.backoff_s
        log.warning("query cache %s failed (%s); cache off for %.0f s", what, type(exc).__name__, self.backoff_s)

    def get(self, version: int, query_sha256: str, params: str) -> tuple[dict | None, bool]:
        """(cached result or None, whether Redis failed or is in back-off)."""
        if not self._available():
            return None, True
        try:
            raw = self.conn.get(self.names.cache_key(version, query_sha256, params))
        except Exception as exc:  # redis errors of any kind: the search goes on without the cache
            self._failed("read", exc)
            return None, True
        if raw is None:
            return None, False
        try:
            return json.loads(raw), False
        except ValueError:
            return None, False

    def put(self, version: int, query_sha256: str, params: str, result: dict) -> bool:
        """Store a result for ``ttl_s`` seconds; False when Redis failed or is in back-off."""
        if not self._available():
            return False
        try:
            self.conn.set(self.names.cache_key(version, query_sha256, params), json.dumps(result), ex=self.ttl_s)
        except Exception as exc:
            self._failed("write", exc)
            return False
        return True
