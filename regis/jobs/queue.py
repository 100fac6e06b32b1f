"""The job queue interface, and the embedded queue: jobs run one at a time in a background thread.

The embedded queue is what the API uses without Redis: the same endpoints work, jobs run inside the API
process, and their state lives in memory (lost on restart; a job cut short by a restart never committed,
since index versions are published atomically).
"""

from __future__ import annotations

import abc
import logging
import queue as queue_mod
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

from regis.errors import IndexLockedError, RegisError
from regis.jobs.model import (
    JOB_STATES,
    JobError,
    JobInfo,
    JobProgress,
    JobSpec,
    QueueClosedError,
    error_code,
    utc_now,
)

log = logging.getLogger("regis.jobs")

ProgressFn = Callable[[dict], None]
Executor = Callable[[JobSpec, ProgressFn], dict]
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


def new_job_id() -> str:
    """A fresh job id: 32 hex digits."""
    return uuid.uuid4().hex


def valid_job_id(job_id: str) -> bool:
    """Whether ``job_id`` has the form of a regis job id (32 hex digits)."""
    return bool(_JOB_ID.match(job_id))


class JobQueue(abc.ABC):
    """Submit indexing jobs and see their state.

    Attributes:
        backend: "embedded" or "redis".
    """

    backend: str = ""

    @abc.abstractmethod
    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        """Queue a job (``job_id``: a given id from ``new_job_id``, else a fresh one).

        Raises:
            QueueUnavailableError: the queue cannot be reached.
        """

    @abc.abstractmethod
    def get(self, job_id: str) -> JobInfo | None:
        """A job's state, or None for an unknown (or expired) id.

        Raises:
            QueueUnavailableError: the queue cannot be reached.
        """

    @abc.abstractmethod
    def list(self, limit: int = 20) -> list[JobInfo]:
        """The most recently submitted jobs, newest first.

        Raises:
            QueueUnavailableError: the queue cannot be reached.
        """

    def counts(self) -> dict[str, int]:
        """Recent jobs per state (every state present, zeros included).

        Raises:
            QueueUnavailableError: the queue cannot be reached.
        """
        out = dict.fromkeys(JOB_STATES, 0)
        for info in self.list(limit=1000):
            out[info.state] += 1
        return out

    def ping(self) -> bool:
        """Whether the queue is reachable."""
        return True

    def close(self, cancel: JobError | None = None) -> None:  # noqa: B027 (optional for subclasses)
        """Release connections and threads. ``cancel``: the jobs not started yet fail with this error and later
        submissions are refused (``QueueClosedError``), where the queue holds them (the embedded one)."""


class LocalJobQueue(JobQueue):
    """Jobs run one at a time in a daemon thread of this process.

    Args:
        execute: runs a job: ``execute(spec, report_progress) -> result dict`` (``version``: the published
            index version or None). A ``RegisError`` fails the job with its message; any other exception fails
            it with a generic message (details go to the log).
        on_done: called with the job's final ``JobInfo`` after each job (e.g. to swap in the new version).
        history: finished jobs remembered.
    """

    backend = "embedded"

    def __init__(self, execute: Executor, on_done: Callable[[JobInfo], None] | None = None, history: int = 200):
        self._execute = execute
        self._on_done = on_done
        self._history = history
        self._jobs: OrderedDict[str, JobInfo] = OrderedDict()
        self._specs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()
        self._pending: queue_mod.Queue[str | None] = queue_mod.Queue()
        self._closed: JobError | None = None
        self._thread = threading.Thread(target=self._run, name="regis-jobs", daemon=True)
        self._thread.start()

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        """Queue a job; it runs after the ones before it.

        Raises:
            QueueClosedError: the queue was closed (its collection deleted: ``close(cancel=...)``).
        """
        job_id = job_id or new_job_id()
        info = JobInfo(id=job_id, kind=spec.kind, state="queued", params=spec.params(), submitted_at=utc_now())
        with self._lock:
            if self._closed is not None:
                raise QueueClosedError(self._closed.message, code=self._closed.code)
            self._jobs[job_id] = info
            self._specs[job_id] = spec
            self._forget_old()
            out = info.model_copy(deep=True)
        self._pending.put(job_id)
        return out

    def get(self, job_id: str) -> JobInfo | None:
        """A job's state, or None."""
        with self._lock:
            info = self._jobs.get(job_id)
            return info.model_copy(deep=True) if info else None

    def list(self, limit: int = 20) -> list[JobInfo]:
        """Recent jobs, newest first."""
        with self._lock:
            return [info.model_copy(deep=True) for info in reversed(self._jobs.values())][:limit]

    def close(self, cancel: JobError | None = None, timeout_s: float = 5.0) -> None:
        """Stop after the running job (waits up to ``timeout_s``; a job still running then is abandoned
        uncommitted when the process exits). With ``cancel`` (a deleted collection): the queued jobs fail with
        that error at once, later submissions raise ``QueueClosedError``, and nothing is waited for (the running
        job ends on its own: its collection is gone)."""
        with self._lock:
            self._closed = cancel or JobError(code="queue_closed", message="the job queue is stopping")
            if cancel is not None:
                for job_id, info in self._jobs.items():
                    if info.state == "queued":
                        self._specs.pop(job_id, None)
                        info.state, info.error, info.ended_at = "failed", cancel, utc_now()
        self._pending.put(None)
        if cancel is None:
            self._thread.join(timeout=timeout_s)

    def _forget_old(self) -> None:
        finished = [i for i, info in self._jobs.items() if info.state in ("done", "failed")]
        for job_id in finished[: max(0, len(self._jobs) - self._history)]:
            del self._jobs[job_id]
            self._specs.pop(job_id, None)

    def _update(self, job_id: str, **changes) -> JobInfo:
        with self._lock:
            info = self._jobs[job_id]
            for key, value in changes.items():
                setattr(info, key, value)
            return info.model_copy(deep=True)

    def _run(self) -> None:
        while True:
            job_id = self._pending.get()
            if job_id is None:
                return
            with self._lock:
                spec = self._specs.get(job_id)
            if spec is None:
                continue
            try:
                self._run_one(job_id, spec)
            except Exception:  # the thread outlives any one job: the jobs after it still run (issue 27, item 1)
                log.exception("job %s: recording its end failed", job_id)
                self._fail(job_id, JobError(code="internal", message="the job failed unexpectedly; see the server "
                                                                     "log"))

    def _fail(self, job_id: str, error: JobError) -> None:
        """Mark a job failed without copying what it holds (its result may be what could not be copied)."""
        with self._lock:
            self._specs.pop(job_id, None)
            info = self._jobs.get(job_id)
            if info is not None:
                info.state, info.result, info.error, info.ended_at = "failed", None, error, utc_now()

    def _run_one(self, job_id: str, spec: JobSpec) -> None:
        self._update(job_id, state="running", started_at=utc_now(), attempts=1,
                     progress=JobProgress(phase="starting"))

        def report(progress: dict) -> None:
            with self._lock:
                info = self._jobs[job_id]
                info.progress = info.progress.model_copy(update=progress)

        changes: dict = {}
        try:
            result = self._execute(spec, report)
            changes = {"state": "done", "result": result}
        except IndexLockedError as exc:
            changes = {"state": "failed", "error": JobError(code="index_locked", message=str(exc))}
        except RegisError as exc:
            changes = {"state": "failed", "error": JobError(code=error_code(exc), message=str(exc))}
        except Exception as exc:  # never let one job stop the thread; details go to the log only
            log.exception("job %s failed", job_id)
            changes = {"state": "failed", "error": JobError(
                code="internal", message=f"the job failed unexpectedly ({type(exc).__name__}); see the server log")}
        with self._lock:
            self._specs.pop(job_id, None)
            if changes["state"] == "done":
                changes["progress"] = self._jobs[job_id].progress.model_copy(update={"phase": "done"})
        final = self._update(job_id, ended_at=utc_now(), **changes)
        if self._on_done is not None:
            try:
                self._on_done(final)
            except Exception:
                log.exception("after job %s", job_id)


def wait_for(queue: JobQueue, job_id: str, timeout_s: float, poll_s: float = 0.05) -> JobInfo | None:
    """Block until a job is done or failed, or ``timeout_s`` passes; returns its last known state."""
    deadline = time.monotonic() + timeout_s
    info = queue.get(job_id)
    while info is not None and info.state not in ("done", "failed") and time.monotonic() < deadline:
        time.sleep(poll_s)
        info = queue.get(job_id)
    return info
