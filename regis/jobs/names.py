"""Names of what regis keeps in Redis: one prefix (``REGIS_REDIS_PREFIX``) separates deployments sharing a
Redis server."""

from __future__ import annotations

import re
from dataclasses import dataclass

from regis.errors import ConfigError

DEFAULT_PREFIX = "regis"
# the shape of the search answers the query cache holds (``cache_key``): a new shape gets new keys, so no instance
# serves an answer cached in another shape (after an upgrade, or from an older instance sharing the Redis).
# Bump it with every change of ``regis.retrieve.answers.result_json``'s answer. 2: with ``max_score`` (93505f0).
CACHE_ANSWER_FORMAT = 2
_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is 1-64 letters, digits, ``_``, ``.`` or ``-``.

    Raises:
        ConfigError: any other prefix.
    """
    if not _PREFIX.match(prefix):
        raise ConfigError(f"Redis prefix must be 1-64 letters, digits, '_', '.' or '-', got {prefix!r}")
    return prefix


@dataclass(frozen=True)
class RedisNames:
    """Key, queue and channel names under one prefix.

    Attributes:
        prefix: the deployment's prefix (default ``regis``).
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def queue(self) -> str:
        """The RQ queue indexing jobs go to."""
        return f"{self.prefix}-index"

    @property
    def index_updates(self) -> str:
        """Pub/sub channel: the worker publishes {"version": N} after each committed index version."""
        return f"{self.prefix}:index-updates"

    @property
    def recent_jobs(self) -> str:
        """Sorted set of job ids by submission time, every collection's (metrics, start-up clean-up)."""
        return f"{self.prefix}:jobs:recent"

    def recent_jobs_of(self, collection: str | None) -> str:
        """Sorted set of the job ids of one collection (None: the default one) by submission time
        (``GET /v1/jobs``, ``GET /v1/collections/{name}/jobs``). Collection names start with a letter or digit,
        so ``-`` cannot be one."""
        return f"{self.prefix}:jobs:recent:{collection or '-'}"

    def cache_key(self, version: int, query_sha256: str, params: str) -> str:
        """Query-result cache key of a query image hash, an index version and the search parameters, under the
        answer format (``CACHE_ANSWER_FORMAT``): ``{prefix}:cache:a{format}:v{version}:{sha256}:{params}``."""
        return f"{self.prefix}:cache:a{CACHE_ANSWER_FORMAT}:v{version}:{query_sha256}:{params}"
