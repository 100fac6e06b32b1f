"""The worker under faults (issue 14, faults 8 and 9): Redis dying in the middle of a job no longer ends the
worker, and killing only the worker process no longer leaves its work horse running the job while another
attempt starts. Each job completes exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from deploy.support import REDIS_SERVER, free_port, kill, regis_process, stop, wait_until
from rq.job import Job
from rq.serializers import JSONSerializer

from regis.faults import PAUSE_ENV, RELEASE_ENV
from regis.jobs.model import JobSpec
from regis.jobs.names import RedisNames
from regis.jobs.rq_queue import RedisJobQueue, redis_connection

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REDIS_SERVER is None,
                                                   reason="needs redis-server (make system-deps installs it)")]
WORKER_ARGS = ["worker", "--job-monitoring-interval", "1", "--heartbeat-grace", "2", "--maintenance-interval", "1",
               "--log-level", "info"]
LOCK_KEY = f"rq:clean_registries:{RedisNames('faults').queue}"  # RQ's registry-cleaning lock of the queue


class DurableRedis:
    """A redis-server of this test with an append-only file (jobs survive its restart, as with compose's)."""

    def __init__(self, workdir):
        self.workdir, self.port, self.proc = workdir, free_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> DurableRedis:
        self.proc = subprocess.Popen([REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        conn = redis_connection(self.url, timeout_s=0.5)
        try:
            wait_until(lambda: _pings(conn), 10, 0.05, "redis-server")
        except AssertionError:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def _pings(conn) -> bool:
    try:
        return bool(conn.ping())
    except Exception:
        return False


@pytest.fixture
def setup(tmp_path, photos_dir):
    root = tmp_path / "root"
    (root / "many").mkdir(parents=True)
    for src in sorted(photos_dir.iterdir()):
        for i in range(3):
            (root / "many" / f"{src.stem}-{i}{src.suffix}").write_bytes(src.read_bytes() + f"copy {i}".encode())
    redis = DurableRedis(tmp_path).start()
    env = {"REGIS_REDIS_URL": redis.url, "REGIS_REDIS_PREFIX": "faults", "REGIS_INDEX_DIR": str(tmp_path / "index"),
           "REGIS_IMAGES_ROOT": str(root), "REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true",
           "REGIS_BUILD_BATCH_SIZE": "2", "REGIS_BUILD_WORKERS": "0", "REGIS_TORCH_THREADS": "1"}
    procs: list = []
    yield redis, env, procs
    for proc in procs:
        stop(proc, 10)
    if redis.proc.poll() is None:
        redis.kill()


def _job(redis, job_id) -> Job:
    return Job.fetch(job_id, connection=redis_connection(redis.url), serializer=JSONSerializer)


def _under_way(queue, job_id, at_least: int = 6):
    wait_until(lambda: (info := queue.get(job_id)) and info.progress.done >= at_least, 120, 0.05,
               "embedding to be under way")


def _done(queue, job_id, timeout_s: float = 180):
    return wait_until(lambda: (info := queue.get(job_id)) and info.state in ("done", "failed") and info,
                      timeout_s, 0.1, f"job {job_id}")


def test_redis_dying_mid_job_does_not_end_the_worker(setup, tmp_path):
    """Redis dies while the job is held at the pause point ``build.batch-reported`` (embedding under way,
    nothing committed), stays down 3 s, comes back, then the job goes on: it completes once, with all 63 images
    added by its one run. (Before the pause point the test killed Redis once progress reached 6 images and
    hoped the job was still running; on a faster machine the whole job finished inside the 3 s, was run again
    after its acknowledgement was lost, and reported added 0.)"""
    redis, env, procs = setup
    release = tmp_path / "release"
    env = {**env, PAUSE_ENV: "build.batch-reported", RELEASE_ENV: str(release)}
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker.log")
    procs.append(worker)
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=2)
    job_id = queue.submit(JobSpec(kind="index", folder="many")).id
    wait_until(lambda: (tmp_path / "release.reached").exists(), 120, 0.05, "the job to reach its pause point")
    assert queue.get(job_id).state == "running"
    redis.kill()
    time.sleep(3)
    assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]  # it waits for Redis
    redis.start()
    release.touch()
    info = _done(RedisJobQueue(redis.url, RedisNames("faults")), job_id)
    assert info.state == "done" and info.result["added"] == 63, info
    assert worker.poll() is None
    queue = RedisJobQueue(redis.url, RedisNames("faults"))
    again = _done(queue, queue.submit(JobSpec(kind="index", folder="many")).id)  # and it takes new jobs
    assert again.state == "done" and again.result["version"] is None  # nothing changed: no new version


def test_killing_only_the_worker_process_takes_its_job_down_with_it(setup, tmp_path):
    redis, env, procs = setup
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker-1.log")
    procs.append(worker)
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=2)
    job_id = queue.submit(JobSpec(kind="index", folder="many")).id
    _under_way(queue, job_id)
    horse = int(_job(redis, job_id).meta["worker_pid"])
    os.kill(worker.pid, signal.SIGKILL)  # the worker process only: its horse is in its own process group
    worker.wait(timeout=10)

    def horse_gone() -> bool:
        try:
            os.kill(horse, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(horse_gone, 5, 0.05, "the work horse to die with its worker")
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker-2.log")
    procs.append(worker)
    info = _done(queue, job_id)
    assert info.state == "done" and info.attempts == 2, info
    assert info.result["added"] == 63 and info.result["version"] == 1  # one complete execution, reported once
    kill(worker)


def test_a_job_killed_after_placing_its_uploads_is_retried_and_adds_each_image_once(setup, tmp_path):
    """The work horse SIGKILLs itself between placing the uploaded files and writing the index
    (``REGIS_CRASH_AT=job.placed``, once): the retry adds both images exactly once; nothing stays staged."""
    import io

    from PIL import Image

    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.uploads import STAGING_DIR, new_staging_batch, stage_upload
    from regis.jobs.model import UploadItem

    redis, env, procs = setup
    env = {**env, "REGIS_CRASH_AT": "job.placed", "REGIS_CRASH_ONCE": str(tmp_path / "crashed-once")}
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker.log")
    procs.append(worker)
    uploads = tmp_path / "root" / ".uploads"
    batch = new_staging_batch()
    items = []
    for n, color in enumerate(("red", "navy")):
        buf = io.BytesIO()
        Image.new("RGB", (70, 50), color).save(buf, format="PNG")
        staged, path, sha = stage_upload(uploads, batch, n, buf.getvalue(), "PNG")
        items.append(UploadItem(path=path, staged=staged, sha256=sha, filename=f"{color}.png"))
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=2)
    info = _done(queue, queue.submit(JobSpec(kind="add", uploads=items), batch).id)
    assert (tmp_path / "crashed-once").exists()  # the window was hit (RQ re-saves the attempt counter of a
    assert info.state == "done", info  # horse that dies, so the counter does not tell; the marker file does)
    assert sorted(im["status"] for im in info.result["images"]) == ["added", "added"]
    snap = IndexSnapshot.open(tmp_path / "index")
    try:
        assert sorted(r.path for r in snap.table.iter_all()) == sorted(it.path for it in items)
    finally:
        snap.close()
    assert not (uploads / STAGING_DIR / batch).exists() or not any((uploads / STAGING_DIR / batch).iterdir())


def test_a_job_killed_after_it_published_is_retried_and_reports_its_first_run(setup, tmp_path):
    """The work horse SIGKILLs itself after its add job's version went live, before the job is reported done
    (``REGIS_CRASH_AT=job.published``, once): the retry does not add again and reports the first run's result,
    marked replayed (it used to report both images as "exists"); nothing stays staged."""
    import io

    from PIL import Image

    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.uploads import STAGING_DIR, new_staging_batch, stage_upload
    from regis.jobs.model import UploadItem

    redis, env, procs = setup
    env = {**env, "REGIS_CRASH_AT": "job.published", "REGIS_CRASH_ONCE": str(tmp_path / "crashed-once")}
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker.log")
    procs.append(worker)
    uploads = tmp_path / "root" / ".uploads"
    batch = new_staging_batch()
    items = []
    for n, color in enumerate(("teal", "olive")):
        buf = io.BytesIO()
        Image.new("RGB", (60, 80), color).save(buf, format="PNG")
        staged, path, sha = stage_upload(uploads, batch, n, buf.getvalue(), "PNG")
        items.append(UploadItem(path=path, staged=staged, sha256=sha, filename=f"{color}.png"))
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=2)
    info = _done(queue, queue.submit(JobSpec(kind="add", uploads=items), batch).id)
    assert (tmp_path / "crashed-once").exists()  # the window was hit
    assert info.state == "done", info
    assert info.result["replayed"] is True and info.result["version"] == 1, info.result
    assert [im["status"] for im in info.result["images"]] == ["added", "added"] and info.result["added"] == 2
    snap = IndexSnapshot.open(tmp_path / "index")
    try:
        assert sorted(r.path for r in snap.table.iter_all()) == sorted(it.path for it in items)
    finally:
        snap.close()
    assert not (uploads / STAGING_DIR / batch).exists() or not any((uploads / STAGING_DIR / batch).iterdir())


def _rows(index_dir) -> list:
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index_dir)
    try:
        return list(snap.table.iter_all())
    finally:
        snap.close()


def _killed_mid_job_then_rerun(redis, env, procs, tmp_path, bound_s: float = 45):
    """Submit an index job, SIGKILL its worker (the process group: worker and work horse, as the soak does) once
    embedding is under way, start a fresh worker, and check the abandoned job goes back to the queue within
    ``bound_s`` seconds of the kill and completes once: 63 images, each once."""
    worker = regis_process(WORKER_ARGS, env, tmp_path / "worker-busy.log")
    procs.append(worker)
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=2)
    job_id = queue.submit(JobSpec(kind="index", folder="many")).id
    _under_way(queue, job_id)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    killed_at = time.monotonic()
    procs.append(regis_process(WORKER_ARGS, env, tmp_path / "worker-next.log"))
    wait_until(lambda: (info := queue.get(job_id)) and (info.attempts >= 2 or info.state in ("done", "failed")),
               bound_s, 0.1, f"the abandoned job to be taken again within {bound_s:.0f} s of its worker's kill")
    rerun_after_s = time.monotonic() - killed_at
    info = _done(queue, job_id)
    assert info.state == "done" and info.attempts == 2, info
    assert info.result["added"] == 63 and info.result["version"] == 1, info.result
    rows = _rows(tmp_path / "index")
    assert len(rows) == 63 and len({r.sha256 for r in rows}) == 63  # none lost, none twice
    return rerun_after_s


def test_a_worker_killed_holding_the_cleaning_lock_does_not_strand_abandoned_jobs(setup, tmp_path):
    """A worker SIGKILLs itself right after taking its queue's registry-cleaning lock
    (``REGIS_CRASH_AT=worker.maintenance-locked``, once). RQ's lock lasted 899 s, so for 15 minutes no worker
    re-queued the job of a worker killed later (the Redis soak's ``settled: false``: a job "running" 300 s after
    the load). Now the lock lapses after ``maintenance_lock_s`` (10 s here) and the job is taken again within
    the bound, and completes once."""
    redis, env, procs = setup
    marker = tmp_path / "crashed-once"
    crashing = regis_process(WORKER_ARGS, {**env, "REGIS_CRASH_AT": "worker.maintenance-locked",
                                           "REGIS_CRASH_ONCE": str(marker)}, tmp_path / "worker-crash.log")
    procs.append(crashing)
    assert crashing.wait(timeout=120) == -signal.SIGKILL and marker.exists()  # the window was hit
    assert redis_connection(redis.url).ttl(LOCK_KEY) > 0  # and the lock left behind
    _killed_mid_job_then_rerun(redis, env, procs, tmp_path)


def test_redis_killed_while_a_worker_holds_the_cleaning_lock_does_not_strand_abandoned_jobs(setup, tmp_path):
    """Redis is killed while the worker is held right after taking the registry-cleaning lock
    (``REGIS_PAUSE_AT=worker.maintenance-locked``) and restarted from its append-only file, which keeps the lock;
    the worker never deletes it. A job whose worker is killed later is still taken again within the bound."""
    redis, env, procs = setup
    release = tmp_path / "release"
    paused = regis_process(WORKER_ARGS, {**env, PAUSE_ENV: "worker.maintenance-locked", RELEASE_ENV: str(release)},
                           tmp_path / "worker-paused.log")
    procs.append(paused)
    wait_until(lambda: (tmp_path / "release.reached").exists(), 120, 0.05, "the worker to take the lock")
    redis.kill()
    release.touch()  # the cleaning fails on the dead connection: the lock is never deleted
    time.sleep(3)
    redis.start()
    assert redis_connection(redis.url).ttl(LOCK_KEY) > 0  # the lock survived the restart
    stop(paused, 20)
    _killed_mid_job_then_rerun(redis, env, procs, tmp_path)
