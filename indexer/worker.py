"""``regis worker``: runs indexing jobs from Redis (RQ, see ``regis.jobs.rq_queue``) and announces every new
index version on Redis pub/sub, so that the API swaps to it.

Each job runs in a work horse forked from the worker (RQ's default), which loads the encoder, runs the job
(``indexer.jobs.execute_job``) and exits: a job that crashes, or that the kernel kills for memory, cannot
take the worker with it. The worker heartbeats every ``job_monitoring_interval_s``; a worker that dies
entirely leaves its job in RQ's started registry, where any worker's registry clean-up (every
``maintenance_interval_s``) finds it once the heartbeat is ``heartbeat_grace_s`` late, and re-queues it (or
marks it failed when it has no retries left). The clean-up runs under a lock that lapses after
``maintenance_lock_s`` (RQ's lasted 15 minutes when the worker holding it was killed). Index versions are
published atomically, so a killed job leaves nothing half-written, and a retried job redoes only what was not
committed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

import redis
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from regis.errors import ConfigError, IndexLockedError, RegisError
from regis.faults import crash_point, pause_point
from regis.jobs.model import JobError, JobSpec, error_code
from regis.jobs.names import DEFAULT_PREFIX, RedisNames
from regis.settings_types import FrameName, QueryLayoutName, RedisPrefix, RedisURL, TorchDevice

log = logging.getLogger("regis.worker")


class WorkerSettings(BaseSettings):
    """Configuration of ``regis worker``: environment variables prefixed ``REGIS_`` (the same names as the
    service's), or command-line options.

    Attributes:
        redis_url: Redis holding the job queue (REGIS_REDIS_URL), required.
        redis_prefix: key prefix shared with the API.
        index_dir: the index the jobs for the default collection write (REGIS_INDEX_DIR; default, as the API's:
            ``collections_root/default_collection``).
        images_root: the folder index jobs may read (None: index jobs fail, uploads still work).
        uploads_dir: where uploads are stored (default: ``images_root/.uploads``, else ``index_dir/uploads``).
        backbone, weights, random_init: the encoder for a new index (an existing index's own encoder
            otherwise; see ``regis.options.encoder_for``).
        frame, query_layout: that encoder's (None: its defaults; a collection's config sets them).
        device: torch device for encoding.
        build_batch_size: images per forward pass.
        build_workers: DataLoader decoding processes (None: min(4, CPUs) for large jobs).
        lock_timeout_s: how long a job waits for another writer of the index, seconds.
        torch_threads: torch intra-op threads per job (None: torch's default).
        job_monitoring_interval_s: heartbeat period while a job runs, seconds.
        heartbeat_grace_s: a running job whose heartbeat is this late counts as abandoned, seconds.
        maintenance_interval_s: how often the worker looks for abandoned jobs, seconds.
        stop_grace_s: after SIGTERM / SIGINT, how long a running job may go on before it is stopped and put back
            in the queue (not counted as one of its tries), seconds (REGIS_STOP_GRACE_S). Keep it under the grace
            period of what stops the worker (``docker compose stop``: the worker's ``stop_grace_period``, 15 s in
            docker-compose.yml; Docker's default is 10 s).
        collections_root: the folder holding the deployment's collections (jobs naming a collection other
            than ``default_collection`` write there; ``regis.indexes.collections``).
        default_collection: the name of ``index_dir`` as a collection.
    """

    model_config = SettingsConfigDict(env_prefix="REGIS_", extra="ignore")

    redis_url: RedisURL
    redis_prefix: RedisPrefix = DEFAULT_PREFIX
    index_dir: Path | None = None  # filled in from collections_root when not given (never None after validation)
    images_root: Path | None = None
    uploads_dir: Path | None = None
    backbone: str | None = None
    weights: Path | None = None
    random_init: bool = False
    frame: FrameName | None = None
    query_layout: QueryLayoutName | None = None
    device: TorchDevice = "cpu"
    build_batch_size: int = Field(default=32, ge=1, le=4096)
    build_workers: int | None = Field(default=None, ge=0, le=64)
    lock_timeout_s: float = Field(default=300.0, ge=0)
    torch_threads: int | None = Field(default=None, ge=1)
    job_monitoring_interval_s: int = Field(default=5, ge=1, le=600)
    heartbeat_grace_s: int = Field(default=30, ge=1, le=3600)
    maintenance_interval_s: int = Field(default=30, ge=1, le=3600)
    stop_grace_s: float = Field(default=8.0, ge=0, le=24 * 3600)
    collections_root: Path | None = None
    default_collection: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")

    @model_validator(mode="after")
    def _default_index(self) -> WorkerSettings:
        if self.index_dir is None:  # as the API's settings: docs/DEPLOY.md's default
            if self.collections_root is None:
                raise ValueError("set index_dir (REGIS_INDEX_DIR) or collections_root (REGIS_COLLECTIONS_ROOT)")
            self.index_dir = self.collections_root / self.default_collection
        return self

    def resolved_uploads_dir(self) -> Path:
        """The uploads folder, default applied."""
        from regis.indexes.uploads import default_uploads_dir

        return self.uploads_dir or default_uploads_dir(self.index_dir, self.images_root)


_settings: WorkerSettings | None = None  # set by run_worker; the forked work horses inherit it


def _current_settings() -> WorkerSettings:
    return _settings if _settings is not None else WorkerSettings()


def _encoder(settings: WorkerSettings):
    from regis.index_encoder import encoder_for
    from regis.retrieve.query import set_torch_threads

    set_torch_threads(settings.torch_threads)
    return encoder_for(settings.index_dir, settings.backbone, settings.weights, settings.random_init, None, None,
                       settings.device, frame=settings.frame, query_layout=settings.query_layout)


def _collection_settings(settings: WorkerSettings, collection: str | None) -> WorkerSettings:
    """The settings of a job for ``collection`` (its index directory, uploads folder and encoder).

    Raises:
        ConfigError: no collections root is configured.
        CollectionNotFoundError: no such collection.
    """
    if collection is None or collection == settings.default_collection:
        return settings
    if settings.collections_root is None:
        raise ConfigError(f"job for collection {collection!r}, but this worker has no REGIS_COLLECTIONS_ROOT")
    from regis.indexes.collections import CollectionsRoot

    return settings.model_copy(update=CollectionsRoot(settings.collections_root).overrides(collection))


def _collection_check(settings: WorkerSettings, collection: str | None, uid: str | None):
    """A job's ``JobContext.check_alive`` (None for the default collection), run once now.

    Raises:
        CollectionDeletedError: the collection was deleted since the job was queued (a refusal: no retry).
    """
    if collection is None or collection == settings.default_collection or settings.collections_root is None:
        return None
    from regis.indexes.collections import CollectionsRoot

    root = CollectionsRoot(settings.collections_root)

    def check() -> None:
        root.check_alive(collection, uid)

    check()
    return check


def perform_job(spec: dict) -> dict:
    """The RQ job function (``regis.jobs.rq_queue.PERFORM_JOB``): run one job in the work horse.

    Returns:
        {"ok": True, "result": {...}} when the job ran; {"ok": False, "error": {"code", "message"}} when it
        was refused for a reason a retry cannot fix (bad folder, another encoder, ...).

    Raises:
        IndexLockedError: another writer held the index too long (RQ retries the job).
        Exception: anything unexpected (logged; RQ retries the job while it has retries left).
    """
    from rq import get_current_job

    from indexer.jobs import JobContext, execute_job
    from regis.jobs.rq_queue import JobReporter

    _die_with_worker()
    job = get_current_job()
    settings = _current_settings()
    reporter = JobReporter(job)
    attempt = reporter.start(os.getpid())
    log.info("job %s: attempt %d", job.id, attempt)
    try:
        parsed = JobSpec.model_validate(spec)
    except ValidationError as exc:
        return reporter.refuse(JobError(code="invalid_job", message=f"invalid job: {exc.error_count()} errors"))
    try:
        check_alive = _collection_check(settings, parsed.collection, parsed.collection_uid)
        settings = _collection_settings(settings, parsed.collection)
    except RegisError as exc:
        return reporter.refuse(JobError(code=error_code(exc), message=str(exc)))
    ctx = JobContext(
        index_dir=settings.index_dir, uploads_dir=settings.resolved_uploads_dir(), images_root=settings.images_root,
        encoder=lambda: _encoder(settings), batch_size=settings.build_batch_size,
        num_workers=settings.build_workers, lock_timeout_s=settings.lock_timeout_s, job_id=job.id,
        check_alive=check_alive,
    )
    try:
        result = execute_job(parsed, ctx, reporter.progress)
    except IndexLockedError as exc:
        reporter.error(JobError(code="index_locked", message=str(exc)))
        raise
    except RegisError as exc:
        log.warning("job %s refused: %s", job.id, exc)
        return reporter.refuse(JobError(code=error_code(exc), message=str(exc)))
    except Exception as exc:
        log.exception("job %s failed", job.id)
        reporter.error(JobError(code="internal", message=f"the job failed unexpectedly ({type(exc).__name__}); "
                                                         "see the worker log"))
        raise
    reporter.progress({"phase": "done"}, force=True)
    if result.get("version") is not None:
        names = RedisNames(settings.redis_prefix)
        job.connection.publish(names.index_updates, json.dumps({"version": result["version"], "job_id": job.id}))
    return {"ok": True, "result": result}


_worker_pid: int | None = None  # the worker process (set by run_worker; the work horses are its children)


def _die_with_worker() -> None:
    """Linux: the work horse gets SIGKILL when the worker process that forked it dies (``PR_SET_PDEATHSIG``).

    RQ puts the horse in its own process group, so killing only the worker process used to leave the horse
    running the job while another worker re-ran it after the heartbeat expired: the same job twice at once.
    Now a job runs in at most one process; the retry starts after the first execution is gone."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux") or _worker_pid is None:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != _worker_pid:  # the worker died before the prctl: do not run the job
        os._exit(1)


def maintenance_lock_s(settings: WorkerSettings) -> int:
    """How long a worker holds its queue's registry-cleaning lock at most, seconds: the heartbeat grace plus one
    maintenance interval, at least 10 s (a cleaning takes milliseconds; the lock only keeps two workers from
    re-queuing the same abandoned job at once)."""
    return max(10, settings.maintenance_interval_s + settings.heartbeat_grace_s)


def _queue_class():
    from rq import Queue

    class RegisQueue(Queue):
        """RQ's queue with a registry-cleaning lock that lapses after ``maintenance_lock_s`` (RQ's lasts 899 s).

        RQ's worker takes this lock before it cleans the queue's registries (``StartedJobRegistry.cleanup``
        re-queues the jobs of dead workers) and deletes it afterwards; a worker SIGKILLed inside that window, or
        whose Redis was killed there (the append-only file keeps the key and its expiry), left it for 15 minutes,
        and no worker re-queued an abandoned job meanwhile: the Redis soak ended with a job still "running"
        300 s after the load (``settled: false``, docs/DEPLOY.md). Reproduced by the crash point
        ``worker.maintenance-locked`` (``tests/faults/test_worker_faults.py``)."""

        maintenance_lock_s = 60

        def acquire_maintenance_lock(self) -> bool:
            acquired = bool(self.connection.set(self.registry_cleaning_key, 1, nx=True, ex=self.maintenance_lock_s))
            if acquired:
                crash_point("worker.maintenance-locked")
                pause_point("worker.maintenance-locked")
            return acquired

    return RegisQueue


def _worker_class():
    import threading

    from rq import Worker
    from rq.worker.base import WorkerStatus

    class RegisWorker(Worker):
        """RQ's forking worker with a configurable heartbeat grace (RQ's is a fixed 60 s) and a stop that always
        stops: RQ marks a stop only when it comes during a job (an idle worker's stop looked to ``run_worker``
        like RQ giving up on Redis, and it started over: issue 27, item 7), and waits for the job however long
        it runs. Here a stop is remembered either way (``stop_requested``), and a job still running
        ``stop_grace_s`` after it has its work horse stopped and goes back to the queue (``handle_job_failure``
        gives it the try back): jobs are idempotent and replay (``indexer.job_record``), so nothing is lost."""

        heartbeat_grace_s = 30
        stop_grace_s = 8.0
        stop_requested = False
        _requeue_job_id: str | None = None
        _grace_timer: threading.Timer | None = None

        def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
            if job.timeout and job.timeout > 0:
                remaining = job.timeout - working_time
                return int(min(remaining, self.job_monitoring_interval)) + self.heartbeat_grace_s
            return self.job_monitoring_interval + self.heartbeat_grace_s

        def request_stop(self, signum, frame):
            self.stop_requested = True
            if self.get_state() == WorkerStatus.BUSY and self._grace_timer is None:
                log.info("worker %s: stopping once its job ends (at most %.0f s; then the job goes back to the "
                         "queue)", self.name, self.stop_grace_s)
                self._grace_timer = threading.Timer(self.stop_grace_s, self._grace_over)
                self._grace_timer.daemon = True
                self._grace_timer.start()
            super().request_stop(signum, frame)

        def _grace_over(self) -> None:
            job_id = self.get_current_job_id()
            if not self.horse_pid or job_id is None:
                return
            log.warning("worker %s: job %s still runs %.0f s after the stop: stopping it and queueing it again",
                        self.name, job_id, self.stop_grace_s)
            self._requeue_job_id = job_id
            self.kill_horse(signal.SIGKILL)

        def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
            if job.id == self._requeue_job_id:  # stopped by the grace period: not one of its tries
                job.retries_left = (job.retries_left or 0) + 1
                exc_string = "stopped with its worker; queued again"
            super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                       exc_string=exc_string, execution=execution)

        def cancel_grace(self) -> None:
            if self._grace_timer is not None:
                self._grace_timer.cancel()

    return RegisWorker


def default_worker_name() -> str:
    """``<hostname>.<pid>``: unique per process, recognisable per container (see ``check_worker``)."""
    return f"{socket.gethostname()}.{os.getpid()}"


def run_worker(settings: WorkerSettings, burst: bool = False, name: str | None = None,
               log_level: str = "INFO") -> None:
    """Take jobs from the queue until stopped: SIGTERM or SIGINT stops an idle worker at once, and a busy one
    when its job ends or ``settings.stop_grace_s`` after the signal, whichever comes first (then the job is
    stopped and queued again, not counted as a try); a second signal kills it at once (the job is retried once
    its heartbeat lapses). When Redis fails under it, the worker stops the job in
    flight, waits for Redis with exponential backoff and starts again (the job is re-queued once its heartbeat
    lapses); its connection retries brief blips itself (redis-py ``Retry``).

    Args:
        settings: worker settings.
        burst: stop when the queue is empty.
        name: worker name (default ``default_worker_name()``).
        log_level: logging level name.

    Raises:
        QueueUnavailableError: Redis cannot be reached at startup.
    """
    global _settings, _worker_pid
    from rq.serializers import JSONSerializer

    from regis.jobs.rq_queue import redis_connection, redis_location, unavailable_as

    _settings = settings
    _worker_pid = os.getpid()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import indexer.jobs  # noqa: F401  (torch, timm and the indexer load once; each work horse inherits them)

    conn = redis_connection(settings.redis_url, retries=3)
    names = RedisNames(settings.redis_prefix)
    with unavailable_as(f"Redis at {redis_location(settings.redis_url)} cannot be reached"):
        conn.ping()
    queue_class = _queue_class()
    queue_class.maintenance_lock_s = maintenance_lock_s(settings)
    queue = queue_class(names.queue, connection=conn, serializer=JSONSerializer)
    base_name = name or default_worker_name()
    for incarnation in itertools.count():
        worker = _worker_class()(
            [queue], connection=conn, serializer=JSONSerializer, queue_class=queue_class,
            name=base_name if incarnation == 0 else f"{base_name}.{incarnation}",
            job_monitoring_interval=settings.job_monitoring_interval_s,
            maintenance_interval=settings.maintenance_interval_s,
            worker_ttl=settings.maintenance_interval_s + 15,  # an idle worker wakes up for maintenance this often
        )
        worker.heartbeat_grace_s = settings.heartbeat_grace_s
        worker.stop_grace_s = settings.stop_grace_s
        log.info("regis worker %s: queue %s on %s, index %s", worker.name, names.queue,
                 redis_location(settings.redis_url), settings.index_dir)
        try:
            worker.work(burst=burst, logging_level=log_level.upper(), with_scheduler=False)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:  # from RQ's teardown
            log.warning("worker %s: Redis failed while stopping: %s", worker.name, exc)
        finally:
            worker.cancel_grace()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # RQ's handlers expect a running worker: now just stop
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if burst or worker.stop_requested:
            log.info("worker %s: stopped", worker.name)
            return
        # RQ gave up on a Redis error: stop the job in flight (its heartbeat lapses and any worker re-queues
        # it), wait for Redis with backoff, and start again: recovery without a restart of the container.
        if worker.horse_pid:
            worker.kill_horse(signal.SIGKILL)
            worker.wait_for_horse()
        _wait_for_redis(conn, settings.redis_url)
        time.sleep(1.0)  # never a tight restart loop, whatever made RQ give up


def _wait_for_redis(conn, url: str, cap_s: float = 10.0) -> None:
    """Ping Redis with exponential backoff (redis-py's, base 0.2 s, capped at ``cap_s``) until it answers."""
    from redis.backoff import ExponentialBackoff

    from regis.jobs.rq_queue import redis_location

    backoff = ExponentialBackoff(cap=cap_s, base=0.2)
    for failures in itertools.count(1):
        try:
            conn.ping()
            log.warning("Redis at %s answers again: starting over", redis_location(url))
            return
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            delay = backoff.compute(failures)
            log.warning("Redis at %s does not answer; trying again in %.1f s", redis_location(url), delay)
            time.sleep(delay)


def check_worker(settings: WorkerSettings, prefix: str | None = None) -> bool:
    """Whether a live worker of this queue whose name starts with ``prefix`` (default: this host's name)
    is registered in Redis (a container healthcheck)."""
    from rq import Queue, Worker
    from rq.serializers import JSONSerializer

    from regis.jobs.rq_queue import redis_connection

    conn = redis_connection(settings.redis_url, timeout_s=3)
    queue = Queue(RedisNames(settings.redis_prefix).queue, connection=conn, serializer=JSONSerializer)
    prefix = prefix or f"{socket.gethostname()}."
    return any(w.name.startswith(prefix) for w in Worker.all(queue=queue))
