"""How often regis's Redis clients try to reach a Redis that is down (a closed port), counted per TCP connect.

The API's queue, cache and readiness calls make one attempt and fail at once (503 / no cache / not ready), not
redis-py 8's default of 10 retries with backoff for ``redis.Redis(...)``; the worker's connection retries a
bounded number of times. Counting connects (not timing) checks "does not retry" without a timed test.
"""

from __future__ import annotations

import socket

import pytest
import redis
from redis.connection import Connection

from regis.errors import ConfigError
from regis.jobs.model import JobSpec, QueueUnavailableError
from regis.jobs.names import RedisNames
from regis.jobs.rq_queue import RedisJobQueue, redis_connection


@pytest.fixture
def closed_url() -> str:
    """A Redis URL on a local port nothing listens on (connects are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def connects(monkeypatch) -> list[int]:
    """Counts TCP connect attempts of every redis-py connection (``Connection._connect``)."""
    count = [0]
    real = Connection._connect

    def counting(self):
        count[0] += 1
        return real(self)

    monkeypatch.setattr(Connection, "_connect", counting)
    return count


def test_no_retries_makes_one_attempt(closed_url, connects):
    conn = redis_connection(closed_url, timeout_s=1.0, retries=0)
    with pytest.raises(redis.exceptions.ConnectionError):
        conn.ping()
    assert connects[0] == 1


def test_the_api_queue_fails_at_once_with_queue_unavailable(closed_url, connects):
    queue = RedisJobQueue(closed_url, RedisNames("retries"))
    with pytest.raises(QueueUnavailableError, match="cannot be reached"):
        queue.submit(JobSpec(kind="index", folder="x"))
    assert connects[0] == 1


def test_retries_are_bounded_and_counted(closed_url, connects):
    conn = redis_connection(closed_url, timeout_s=1.0, retries=2)
    with pytest.raises(redis.exceptions.ConnectionError):
        conn.ping()
    assert connects[0] == 3  # the first try and 2 retries (0.2 s + 0.4 s of backoff)


def test_negative_retries_are_refused(closed_url):
    with pytest.raises(ConfigError, match="retries must be >= 0"):
        redis_connection(closed_url, retries=-1)  # redis-py would retry forever


def test_a_socket_closed_under_a_read_is_queue_unavailable_not_a_crash(closed_url, monkeypatch):
    """Found by scripts/soak.py (Redis mode, 1 of ~1,000 index jobs): while Redis restarted, redis-py's health
    check read from a socket closed under it and let out ``ValueError: I/O operation on closed file`` (not a
    ``ConnectionError``; redis/redis-py#883, #947), and the job submission answered 500. The same failure is
    injected at the connect: it must be the 503 ``queue_unavailable`` of any Redis outage. Any other ValueError
    still comes out as itself."""
    queue = RedisJobQueue(closed_url, RedisNames("closed-file"))

    def closed_under_read(self):
        raise ValueError("I/O operation on closed file.")

    monkeypatch.setattr(Connection, "_connect", closed_under_read)
    with pytest.raises(QueueUnavailableError, match="cannot be reached"):
        queue.submit(JobSpec(kind="index", folder="x"))

    def other(self):
        raise ValueError("something else")

    monkeypatch.setattr(Connection, "_connect", other)
    with pytest.raises(ValueError, match="something else"):
        queue.submit(JobSpec(kind="index", folder="x"))
