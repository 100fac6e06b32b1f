"""The Redis job queue, on RQ: the API submits and reads jobs here, ``regis worker`` runs them.

Why RQ (docs/DEPLOY.md has the longer version): jobs, their registries (queued, started, finished, failed)
and retries come from a widely used library; a worker forks a work horse per job, so a job that crashes or is
killed by the kernel is noticed at once by its worker; a worker that dies entirely stops its heartbeat, and
the next registry clean-up (any worker) re-queues the job while it has retries left, else marks it failed
with ``AbandonedJobError``. Jobs are stored with RQ's JSON serializer (no pickles in Redis).

What regis adds, in ``job.meta``: ``kind``, ``params``, ``submitted_at``, ``attempts``, ``progress`` (written
by the worker while it runs) and ``error`` (a client-safe reason). The job's return value is
``{"ok": true, "result": {...}}``, or ``{"ok": false, "error": {...}}`` for a job refused for a reason a retry
cannot fix (a missing folder, another encoder): that job is not retried and shows as failed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone

from regis.jobs.model import (
    JOB_STATES,
    JobError,
    JobInfo,
    JobProgress,
    JobSpec,
    QueueUnavailableError,
    utc_now,
)
from regis.jobs.names import RedisNames
from regis.jobs.queue import JobQueue, new_job_id, valid_job_id

log = logging.getLogger("regis.jobs")

PERFORM_JOB = "indexer.worker.perform_job"  # the function ``regis worker`` runs for every job
DEFAULT_JOB_TIMEOUT_S = 24 * 3600
DEFAULT_RESULT_TTL_S = 7 * 24 * 3600
RETRY_BACKOFF_CAP_S = 2.0  # the longest pause between two tries of a Redis command (redis_connection)


def redis_connection(url: str, timeout_s: float = 5.0, retries: int = 0):
    """A redis-py client for ``url`` with bounded connect and socket timeouts (seconds) and an explicit retry
    policy (redis-py ``Retry``; never redis-py's own default, which for ``redis.Redis(...)`` in redis-py 8 is 10
    retries with jittered backoff).

    Args:
        url: Redis URL (``redis://host:6379/0``).
        timeout_s: socket timeout (s); the connect timeout is ``min(timeout_s, 2)``.
        retries: re-tries of a command (and of its connect) after a connection error or timeout, with
            redis-py's exponential backoff (0.2 s, 0.4 s, ... capped at ``RETRY_BACKOFF_CAP_S``); 0 makes one
            attempt and fails at once (the API answers 503 rather than wait). The worker uses 3 (1.4 s).

    Raises:
        ConfigError: a malformed URL, or negative ``retries`` (redis-py would retry forever).
    """
    import redis
    from redis.backoff import ExponentialBackoff, NoBackoff
    from redis.retry import Retry

    from regis.errors import ConfigError

    if retries < 0:
        raise ConfigError(f"Redis retries must be >= 0, got {retries}")
    errors = [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    retry = (Retry(NoBackoff(), 0) if retries == 0
             else Retry(ExponentialBackoff(cap=RETRY_BACKOFF_CAP_S, base=0.1), retries))
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=min(timeout_s, 2.0), socket_timeout=timeout_s,
                                    health_check_interval=30, retry=retry, retry_on_error=errors)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL: {exc}") from None


def redis_location(url: str) -> str:
    """``host:port/db`` of a Redis URL, without credentials (for messages)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port or 6379}{parts.path or ''}"


@contextlib.contextmanager
def unavailable_as(message: str) -> Iterator[None]:
    """Turn redis-py connection and timeout errors into ``QueueUnavailableError(message)``; also a socket closed
    under a read, which redis-py can let out as ``ValueError: I/O operation on closed file`` instead of a
    ``ConnectionError`` (redis/redis-py#883, #947: a job submitted while Redis restarted answered 500, found by
    scripts/soak.py)."""
    import redis

    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        log.warning("%s: %s", message, exc)
        raise QueueUnavailableError(message) from None
    except ValueError as exc:
        if "closed file" not in str(exc):
            raise
        log.warning("%s: %s", message, exc)
        raise QueueUnavailableError(message) from None


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat(timespec="milliseconds")


def _failure_reason(exc_string: str | None, attempts: int) -> JobError:
    """A client-safe reason for a job RQ marked failed (never the traceback)."""
    text = exc_string or ""
    tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
    if "AbandonedJobError" in text:
        return JobError(code="worker_lost", message=f"the worker running this job stopped (killed, crashed or "
                        f"restarted) and the job has no retries left{tries}; nothing was half-written")
    if "Work-horse terminated unexpectedly" in text:
        signal = text.split("(signal", 1)[1].split(")", 1)[0].strip() if "(signal" in text else ""
        detail = f" by signal {signal}" if signal else ""
        return JobError(code="worker_crashed", message=f"the process running this job was terminated{detail} "
                        f"(out of memory?){tries}; nothing was half-written")
    if "JobTimeoutException" in text:
        return JobError(code="timeout", message=f"the job ran past its time limit{tries}")
    return JobError(code="internal", message=f"the job failed unexpectedly{tries}; see the worker log")


class RedisJobQueue(JobQueue):
    """Jobs in Redis through RQ (see the module docstring).

    Args:
        url: Redis URL (``redis://host:6379/0``).
        names: key and queue names.
        retries: how many times a job whose worker died or raised unexpectedly is re-queued.
        job_timeout_s: a job running longer is killed (seconds).
        result_ttl_s: how long finished and failed jobs stay visible (seconds).
        history: jobs ``GET /v1/jobs`` can list.
        connection: an existing redis-py client (else one is made from ``url``).
    """

    backend = "redis"

    def __init__(self, url: str, names: RedisNames | None = None, retries: int = 2,
                 job_timeout_s: int = DEFAULT_JOB_TIMEOUT_S, result_ttl_s: int = DEFAULT_RESULT_TTL_S,
                 history: int = 1000, connection=None):
        from rq import Queue
        from rq.serializers import JSONSerializer

        self.names = names or RedisNames()
        self.conn = connection if connection is not None else redis_connection(url)
        self.retries = retries
        self.job_timeout_s = job_timeout_s
        self.result_ttl_s = result_ttl_s
        self.history = history
        self.unavailable = (f"the job queue (Redis at {redis_location(url)}) cannot be reached; "
                            "search still works, jobs and uploads do not")
        self.queue = Queue(self.names.queue, connection=self.conn, serializer=JSONSerializer)

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        """Queue a job for ``regis worker``."""
        from rq import Retry

        job_id = job_id or new_job_id()
        meta = {"kind": spec.kind, "params": spec.params(), "submitted_at": utc_now(), "attempts": 0,
                "progress": JobProgress().model_dump()}
        with unavailable_as(self.unavailable):
            job = self.queue.enqueue(
                PERFORM_JOB, spec.model_dump(mode="json"), job_id=job_id, meta=meta,
                retry=Retry(max=self.retries) if self.retries > 0 else None,
                job_timeout=self.job_timeout_s, result_ttl=self.result_ttl_s, failure_ttl=self.result_ttl_s,
                description=f"regis {spec.kind} job",
            )
            pipe = self.conn.pipeline()
            for key in (self.names.recent_jobs, self.names.recent_jobs_of(spec.collection)):
                pipe.zadd(key, {job.id: time.time()})
                pipe.zremrangebyrank(key, 0, -self.history - 1)
            pipe.execute()
        return self._info(job)

    def get(self, job_id: str) -> JobInfo | None:
        """A job's state, or None (unknown id, or expired after ``result_ttl_s``)."""
        from rq.exceptions import NoSuchJobError
        from rq.job import Job
        from rq.serializers import JSONSerializer

        if not valid_job_id(job_id):
            return None
        with unavailable_as(self.unavailable):
            try:
                job = Job.fetch(job_id, connection=self.conn, serializer=JSONSerializer)
            except NoSuchJobError:
                return None
            return self._info(job)

    def list(self, limit: int = 20, collection: str | None = "*") -> list[JobInfo]:
        """Recent jobs, newest first (expired ones are left out): of one collection (None: the default one), or
        of every collection ("*")."""
        from rq.job import Job
        from rq.serializers import JSONSerializer

        key = self.names.recent_jobs if collection == "*" else self.names.recent_jobs_of(collection)
        with unavailable_as(self.unavailable):
            ids = [i.decode() for i in self.conn.zrevrange(key, 0, max(0, limit - 1))]
            jobs = Job.fetch_many(ids, connection=self.conn, serializer=JSONSerializer) if ids else []
            return [self._info(job) for job in jobs if job is not None]

    def counts(self) -> dict[str, int]:
        """Jobs per state among the last ``history`` submitted."""
        from rq.job import Job
        from rq.serializers import JSONSerializer

        out = dict.fromkeys(JOB_STATES, 0)
        with unavailable_as(self.unavailable):
            ids = [i.decode() for i in self.conn.zrevrange(self.names.recent_jobs, 0, self.history - 1)]
            for job in Job.fetch_many(ids, connection=self.conn, serializer=JSONSerializer) if ids else []:
                if job is not None:
                    out[self._state(job, details=False)[0]] += 1
        return out

    def ping(self) -> bool:
        """Whether Redis answers."""
        import redis

        try:
            return bool(self.conn.ping())
        except redis.exceptions.RedisError:
            return False

    def close(self) -> None:
        """Close the connection pool."""
        self.conn.close()

    # ------------------------------------------------------------------ RQ job -> JobInfo
    def _state(self, job, details: bool = True) -> tuple[str, dict | None, JobError | None]:
        """(state, result, error); without ``details`` only the state is right (no extra Redis reads)."""
        from rq.job import JobStatus

        status = job.get_status(refresh=False)
        meta = job.meta or {}
        if status == JobStatus.FINISHED:
            if meta.get("refused"):  # the job function returned {"ok": false, ...}
                return "failed", None, JobError.model_validate(meta.get("error") or {
                    "code": "job_error", "message": "the job was refused"})
            value = (job.return_value() or {}) if details else {}
            return "done", value.get("result"), None
        if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            if meta.get("error"):
                return "failed", None, JobError.model_validate(meta["error"])
            latest = job.latest_result() if details else None
            return "failed", None, _failure_reason(latest.exc_string if latest else None,
                                                   int(meta.get("attempts", 0)))
        if status == JobStatus.STARTED:
            return "running", None, None
        return "queued", None, None  # queued, scheduled or deferred (e.g. waiting for a retry)

    def _info(self, job) -> JobInfo:
        meta = job.meta or {}
        state, result, error = self._state(job)
        progress = JobProgress.model_validate(meta.get("progress") or {})
        if state == "done":
            progress.phase = "done"
        elif state == "queued" and meta.get("attempts"):
            progress.phase = "queued for retry"
        return JobInfo(
            id=job.id, kind=meta.get("kind", "index"), state=state, params=meta.get("params") or {},
            submitted_at=meta.get("submitted_at") or _iso(job.enqueued_at), started_at=_iso(job.started_at),
            ended_at=_iso(job.ended_at) if state in ("done", "failed") else None,
            attempts=int(meta.get("attempts", 0)), progress=progress, result=result, error=error,
        )


class JobReporter:
    """Worker side: records an attempt's start, progress and refusal in the current RQ job's meta.

    Progress writes are throttled to one per ``min_interval_s`` seconds (the last one always goes out).
    """

    def __init__(self, job, min_interval_s: float = 0.25):
        self.job = job
        self.min_interval_s = min_interval_s
        self._last = 0.0

    def start(self, worker_pid: int) -> int:
        """Count a new attempt (clears an earlier attempt's error); returns the attempt number."""
        self.job.meta["attempts"] = int(self.job.meta.get("attempts", 0)) + 1
        self.job.meta.pop("error", None)
        self.job.meta.pop("refused", None)
        self.job.meta["worker_pid"] = worker_pid
        self.job.meta["progress"] = JobProgress(phase="starting").model_dump()
        self.job.save_meta()
        return self.job.meta["attempts"]

    def progress(self, update: dict, force: bool = False) -> None:
        """Merge ``update`` into the stored progress."""
        progress = {**(self.job.meta.get("progress") or {}), **update}
        self.job.meta["progress"] = progress
        now = time.monotonic()
        if force or now - self._last >= self.min_interval_s:
            self._last = now
            self.job.save_meta()

    def error(self, error: JobError) -> None:
        """Record a client-safe reason before the job fails (shown once no retry is left)."""
        self.job.meta["error"] = error.model_dump()
        self.job.save_meta()

    def refuse(self, error: JobError) -> dict:
        """Record that the job is refused for good (no retry) and return the job function's value for it."""
        self.job.meta["refused"] = True
        self.error(error)
        return {"ok": False, "error": error.model_dump()}
