"""The service's side of jobs: which queue (Redis or embedded), and waiting for a job from a request."""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.concurrency import run_in_threadpool

from regis.jobs.model import JobError, JobInfo, JobSpec, QueueClosedError, QueueUnavailableError
from regis.jobs.names import RedisNames
from regis.jobs.queue import JobQueue
from service.live import LiveIndex

log = logging.getLogger("regis.service")


class CollectionJobQueue(JobQueue):
    """A shared (Redis) queue seen from one collection (None: the default one): the jobs it submits name the
    collection (and its incarnation, ``uid``), so the worker writes that collection's index; it shows only that
    collection's jobs (``GET /v1/collections/X/jobs`` used to list every collection's)."""

    def __init__(self, queue: JobQueue, collection: str | None, uid: str | None = None, owns: bool = True):
        self.queue = queue
        self.collection = collection
        self.uid = uid
        self.owns = owns  # close() closes the queue underneath
        self.backend = queue.backend
        self._closed: JobError | None = None  # why close() was called (the collection deleted, or shutting down)

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        """Queue a job for this collection.

        Raises:
            QueueClosedError: the queue was closed (``collection_deleted``: the API answers 404), also when it was
                closed under the call: its Redis connection then fails as in an outage (redis-py: "I/O operation
                on closed file"), which answered 503 ``queue_unavailable`` (found by scripts/soak.py).
            QueueUnavailableError: Redis cannot be reached.
        """
        self._check_open()
        try:
            return self.queue.submit(spec.model_copy(update={"collection": self.collection,
                                                             "collection_uid": self.uid}), job_id)
        except QueueUnavailableError:
            self._check_open()
            raise

    def _check_open(self) -> None:
        closed = self._closed
        if closed is not None:
            raise QueueClosedError(closed.message, code=closed.code)

    def get(self, job_id: str) -> JobInfo | None:
        """A job of this collection, or None.

        Raises:
            QueueClosedError: the queue was closed, also under the call (its Redis connection closed under a read
                fails in redis-py's own ways, e.g. ``AttributeError``: an upload waiting for its job as the
                collection was deleted answered 500, found by scripts/soak.py).
            QueueUnavailableError: Redis cannot be reached.
        """
        self._check_open()
        try:
            info = self.queue.get(job_id)
        except Exception:
            self._check_open()
            raise
        return info if info is not None and info.params.get("collection") == self.collection else None

    def list(self, limit: int = 20) -> list[JobInfo]:
        """This collection's recent jobs (raises as ``get``)."""
        self._check_open()
        try:
            return self.queue.list(limit, collection=self.collection)
        except Exception:
            self._check_open()
            raise

    def ping(self) -> bool:
        return self.queue.ping()

    def close(self, cancel: JobError | None = None) -> None:
        """Take no more jobs (``cancel``: why, e.g. ``collection_deleted``; its jobs already in Redis are refused
        by the worker through the collection's ``uid``); closes the queue underneath when it owns it."""
        self._closed = cancel or JobError(code="queue_closed", message="the job queue is closed")
        if self.owns:
            self.queue.close()


def make_job_queue(settings, live: LiveIndex, collection: str | None = None, uid: str | None = None) -> JobQueue:
    """The Redis queue when ``settings.redis_url`` is set, else the embedded one (jobs run in this process,
    through the indexer's public ``execute_job``, and the new version is swapped in right after).

    ``collection``: a collection other than the default one (``settings`` are then that collection's, see
    ``service.collections``), ``uid`` its incarnation; its Redis jobs carry both for the worker, its embedded
    jobs check them (a job of a deleted collection fails ``collection_not_found``)."""
    if settings.redis_url:
        from regis.jobs.rq_queue import RedisJobQueue

        queue = RedisJobQueue(settings.redis_url, RedisNames(settings.redis_prefix), retries=settings.job_retries,
                              job_timeout_s=settings.job_timeout_s)
        return CollectionJobQueue(queue, collection, uid) if collection else queue
    from indexer import JobContext, execute_job
    from regis.jobs.queue import LocalJobQueue

    check_alive = None
    if collection is not None:
        from regis.indexes.collections import CollectionsRoot

        root = CollectionsRoot(settings.collections_root)
        check_alive = lambda: root.check_alive(collection, uid)  # noqa: E731
    ctx = JobContext(
        index_dir=settings.index_dir, uploads_dir=settings.resolved_uploads_dir(), images_root=settings.images_root,
        encoder=live.ensure_encoder, batch_size=settings.build_batch_size, num_workers=settings.build_workers,
        lock_timeout_s=settings.lock_timeout_s, check_alive=check_alive,
    )
    return LocalJobQueue(lambda spec, report: execute_job(spec, ctx, report), on_done=lambda _: live.refresh())


async def await_job(queue: JobQueue, live: LiveIndex, job_id: str, timeout_s: float) -> JobInfo | None:
    """Wait (without blocking the event loop) until a job ends or ``timeout_s`` passes; once it is done, make
    sure the version it published is the one served (read-your-writes). Returns the job's last state seen, None
    if none was.

    The job is queued already: when the queue cannot be reached meanwhile (Redis down), the wait ends with what
    was seen so far, so the caller answers 202 with the job id instead of a 503 that would say the write was
    refused (the job runs once Redis is back; issue 14, found by ``scripts/soak.py``).
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    info = None
    try:
        info = await run_in_threadpool(queue.get, job_id)
        while info is not None and info.state not in ("done", "failed") and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)
            info = await run_in_threadpool(queue.get, job_id)
    except QueueUnavailableError:
        log.warning("the job queue went away while waiting for job %s: answering with its job id", job_id)
        return info
    if info is not None and info.state == "done":
        await await_served(live, info, deadline + 5 - time.monotonic())
    return info


async def await_served(live: LiveIndex | None, info: JobInfo, timeout_s: float) -> bool:
    """Once a job is done, wait (without blocking the event loop) until ``live`` serves the version it published,
    for at most ``timeout_s`` seconds: a client that sees "done" then reads its own write (read-your-writes), even
    when the job ran elsewhere (a Redis worker, the Ray ``Writer``) and the index watcher has not polled yet.

    Returns True when that version (or a newer one) is served, or there is nothing to wait for (no live index,
    a job that is not done or published no version); False when ``timeout_s`` passed first.
    """
    version = (info.result or {}).get("version") if info.state == "done" else None
    if live is None or version is None:
        return True
    deadline = time.monotonic() + timeout_s
    while (live.version or 0) < version:
        if time.monotonic() >= deadline:
            log.warning("job %s published version %d; still serving %s", info.id, version, live.version)
            return False
        if not await run_in_threadpool(live.refresh):
            await asyncio.sleep(0.02)
    return True
