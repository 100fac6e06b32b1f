"""``regis worker`` stops on SIGTERM / SIGINT (issue 27, item 7): idle at once; busy, once its job ends, or at
the end of its grace period (REGIS_STOP_GRACE_S) with the job stopped and put back in the queue without using
one of its retries, so ``docker compose stop`` ends it without a kill. Before, an idle worker logged "warm shut
down requested", then "Redis ... answers again: starting over" and went on; only SIGKILL stopped it, and a busy
one waited for its job however long it took. The busy cases hold the job at the pause point
``build.batch-reported`` (embedding under way, nothing committed)."""

from __future__ import annotations

import signal
import time

import pytest
from deploy.support import regis_process, wait_until

from faults.test_worker_faults import WORKER_ARGS, _done, setup  # noqa: F401 (setup: the fixture)
from regis.faults import PAUSE_ENV, RELEASE_ENV
from regis.jobs.model import JobSpec
from regis.jobs.names import RedisNames
from regis.jobs.rq_queue import RedisJobQueue

pytestmark = [pytest.mark.slow]


def _registered(redis, env) -> bool:
    from rq import Worker

    from regis.jobs.rq_queue import redis_connection

    return bool(Worker.all(connection=redis_connection(redis.url)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_idle_worker_stops_on_the_signal(setup, tmp_path, sig):  # noqa: F811
    redis, env, procs = setup
    log = tmp_path / "worker.log"
    worker = regis_process(WORKER_ARGS, env, log)
    procs.append(worker)
    wait_until(lambda: _registered(redis, env), 120, 0.1, "the worker to register")
    time.sleep(0.5)
    worker.send_signal(sig)
    assert worker.wait(timeout=15) == 0, log.read_text()[-3000:]
    assert "starting over" not in log.read_text()
    assert not _registered(redis, env)  # it said goodbye


@pytest.mark.parametrize("grace, released", [(60, True), (1, False)], ids=["job-ends-in-grace", "grace-over"])
def test_a_busy_worker_finishes_or_requeues_its_job_then_stops(setup, tmp_path, grace, released):  # noqa: F811
    """Grace 60 s, the job released 1 s after SIGTERM: it completes, then the worker exits 0. Grace 1 s, the job
    held: at 1 s the work horse is stopped and the job queued again (retries 0: the stop is not one of its tries),
    the worker exits 0, and the next worker completes the job once, all 63 images added."""
    redis, env, procs = setup
    release = tmp_path / "release"
    busy_env = {**env, PAUSE_ENV: "build.batch-reported", RELEASE_ENV: str(release), "REGIS_STOP_GRACE_S": str(grace)}
    log = tmp_path / "worker.log"
    worker = regis_process(WORKER_ARGS, busy_env, log)
    procs.append(worker)
    queue = RedisJobQueue(redis.url, RedisNames("faults"), retries=0)
    job_id = queue.submit(JobSpec(kind="index", folder="many")).id
    wait_until(lambda: (tmp_path / "release.reached").exists(), 120, 0.05, "the job to reach its pause point")
    t0 = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    if released:
        time.sleep(1.0)
        assert worker.poll() is None  # waiting for its job
        release.touch()
        assert worker.wait(timeout=120) == 0, log.read_text()[-3000:]
        info = queue.get(job_id)
        assert info.state == "done" and info.result["added"] == 63, info
        return
    assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    assert time.monotonic() - t0 < 20
    info = queue.get(job_id)
    assert info.state == "queued", info  # back in the queue, not failed (it had no retries left)
    second = regis_process(WORKER_ARGS, env, tmp_path / "worker-2.log")  # no pause point
    procs.append(second)
    info = _done(queue, job_id)
    assert info.state == "done" and info.result["added"] == 63, info
