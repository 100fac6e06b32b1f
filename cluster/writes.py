"""Writes on Ray Serve: uploads, deletes, metadata changes and folder jobs of ``regis serve --ray --enable-jobs``.

``Writer`` is the collection's one writer: a deployment of one replica running the job queue ``regis serve``
embeds (``regis.jobs.queue.LocalJobQueue`` over ``indexer.execute_job``: jobs one at a time, each publishing one
collection version through ``regis.sharding.write.CollectionWriter``, all or nothing for readers), with the
collection's own encoder (``regis.sharding.engine.collection_encoder``) for the images it embeds. Every ingress
replica reaches it through ``RayJobQueue``, so a job submitted through one replica is seen through any other, and
the routes of ``regis serve`` (POST /v1/images, DELETE and PATCH /v1/images/{id}, POST /v1/jobs/index, GET
/v1/jobs) answer as on the embedded server: the ingress stages the upload's files, the writer places and embeds
them, the ingress waits for the job and for its index watcher to serve the version the job published
(read-your-writes; the shards follow the collection record).

The ingress and the writer share the filesystem of the collection, its uploads folder and its images root (one
machine, or a shared volume: docker-compose.ray.yml, docker/ray/rayservice.yaml). With ``REGIS_REDIS_URL`` the
ingress uses the Redis queue instead and ``regis worker`` processes write, as for ``regis serve``.
"""

from __future__ import annotations

import logging
import threading

from ray import serve

from cluster.local import replica_on_loopback
from regis.jobs.model import JobInfo, JobSpec, QueueUnavailableError
from regis.jobs.queue import JobQueue
from service.settings import Settings

log = logging.getLogger("regis.cluster")


@serve.deployment(num_replicas=1)
class Writer:
    """The collection's job queue and writer (one replica; module docstring).

    Args:
        service: the service settings (``index_dir``: the collection; uploads folder, images root, batch size,
            lock timeout).
        weights: weights path overriding the manifest's ``file:`` source.
    """

    def __init__(self, service: Settings, weights: str | None = None):
        from indexer import JobContext, execute_job
        from regis.jobs.queue import LocalJobQueue

        replica_on_loopback()
        self.service, self.weights = service, weights
        self._encoder = None
        self._lock = threading.Lock()
        ctx = JobContext(index_dir=service.index_dir, uploads_dir=service.resolved_uploads_dir(),
                         images_root=service.images_root, encoder=self.encoder,
                         batch_size=service.build_batch_size, num_workers=0, lock_timeout_s=service.lock_timeout_s)
        self.queue = LocalJobQueue(lambda spec, report: execute_job(spec, ctx, report))

    def encoder(self):
        """The collection's encoder, loaded on the first job that embeds images."""
        with self._lock:
            if self._encoder is None:
                from regis.sharding.engine import collection_encoder

                self._encoder = collection_encoder(self.service.index_dir, self.weights, self.service.device)
            return self._encoder

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        """``LocalJobQueue.submit``."""
        return self.queue.submit(spec, job_id)

    def get(self, job_id: str) -> JobInfo | None:
        """``LocalJobQueue.get``."""
        return self.queue.get(job_id)

    def list(self, limit: int = 20) -> list[JobInfo]:
        """``LocalJobQueue.list``."""
        return self.queue.list(limit)


class RayJobQueue(JobQueue):
    """The ingress's job queue: the ``Writer`` deployment's, through its handle (blocking calls; the routes run
    them in the thread pool).

    Args:
        handle: the ``Writer`` deployment's handle.
        timeout_s: how long a call may take, seconds.
    """

    backend = "ray"

    def __init__(self, handle, timeout_s: float = 30.0):
        self.handle, self.timeout_s = handle, timeout_s

    def _call(self, method: str, *args):
        try:
            return getattr(self.handle, method).remote(*args).result(timeout_s=self.timeout_s)
        except Exception as exc:  # a dead replica, a timeout, ...: the routes answer 503 queue_unavailable
            log.warning("the writer deployment did not answer %s: %s", method, type(exc).__name__)
            raise QueueUnavailableError("the collection's writer (Ray Serve deployment Writer) did not answer; "
                                        "retry later") from None

    def submit(self, spec: JobSpec, job_id: str | None = None) -> JobInfo:
        return self._call("submit", spec, job_id)

    def get(self, job_id: str) -> JobInfo | None:
        return self._call("get", job_id)

    def list(self, limit: int = 20) -> list[JobInfo]:
        return self._call("list", limit)

    def ping(self) -> bool:
        try:
            self._call("list", 1)
        except QueueUnavailableError:
            return False
        return True
