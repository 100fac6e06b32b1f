"""The docker-compose topology as processes on loopback: redis-server, ``regis serve`` and ``regis worker``,
driven over HTTP; then workers killed in the middle of jobs."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from deploy.support import free_port, kill, regis_process, stop, wait_until
from regis.indexes.layout import SEGMENTS_DIR, TMP_PREFIX, VERSIONS_DIR, read_current
from regis.jobs.model import JobSpec
from regis.jobs.names import RedisNames
from regis.jobs.rq_queue import RedisJobQueue, redis_connection

pytestmark = pytest.mark.slow
WORKER_ARGS = ["worker", "--job-monitoring-interval", "1", "--heartbeat-grace", "2", "--maintenance-interval", "1",
               "--log-level", "warning"]


def _copies(photos_dir, folder, n):
    """``n`` distinct files per bundled photo (the same pixels, a few bytes appended after the image data)."""
    folder.mkdir(parents=True)
    for src in sorted(photos_dir.iterdir()):
        data = src.read_bytes()
        for i in range(n):
            (folder / f"{src.stem}-{i}{src.suffix}").write_bytes(data + f"copy {folder.name} {i}".encode())


def _kill_worker_and_its_job(worker, redis_url, job_id):
    """SIGKILL the worker and the work horse running ``job_id`` (as a container stop past its grace would)."""
    job = Job.fetch(job_id, connection=redis_connection(redis_url), serializer=JSONSerializer)
    horse = int(job.meta["worker_pid"])
    kill(worker)
    try:
        os.kill(horse, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.heavy  # API, worker and Redis as processes: the slowest deploy test (~100 s at load 17, 23 s of CPU)
def test_compose_topology_as_processes(tmp_path, images_root, photos_dir, redis_url, prefix):
    _copies(photos_dir, images_root / "many", 6)
    _copies(photos_dir, images_root / "more", 6)
    index, port = tmp_path / "index", free_port()
    env = {
        "REGIS_REDIS_URL": redis_url, "REGIS_REDIS_PREFIX": prefix, "REGIS_INDEX_DIR": str(index),
        "REGIS_IMAGES_ROOT": str(images_root), "REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true",
        "REGIS_ENABLE_JOBS": "true", "REGIS_JOB_RETRIES": "1", "REGIS_BUILD_BATCH_SIZE": "4",
        "REGIS_BUILD_WORKERS": "0", "REGIS_TORCH_THREADS": "1",
        "REGIS_INDEX_POLL_S": "600",  # swaps must come from the worker's pub/sub notice (or a write's own wait)
    }
    procs = [regis_process(["serve", "--port", str(port), "--log-level", "warning"], env, tmp_path / "api.log"),
             regis_process(WORKER_ARGS, env, tmp_path / "worker-1.log")]
    api, worker = procs
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def up():
        try:
            return http.get("/healthz").status_code == 200
        except httpx.TransportError:
            assert api.poll() is None, (tmp_path / "api.log").read_text()[-3000:]
            return False

    def follow(job_id, until=("done", "failed"), timeout_s=120):
        return wait_until(lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["state"] in until and j,
                          timeout_s, 0.05, f"job {job_id} to be {until}")

    def search(data, **params):
        r = http.post("/v1/search", files={"file": ("q", data)}, params=params)
        assert r.status_code == 200, r.text
        return r.json()

    try:
        wait_until(up, 120, 0.2, "the API")
        assert http.get("/readyz").status_code == 503
        coffee = (images_root / "photos" / "skimage-coffee.png").read_bytes()
        empty = search(coffee)  # nothing indexed yet: no results, not an error (issue 27)
        assert empty["results"] == [] and empty["index_version"] == 0, empty

        # index a folder through the worker; the API swaps when told on pub/sub
        job = follow(http.post("/v1/jobs/index", json={"folder": "photos"}).json()["id"])
        assert job["state"] == "done" and job["result"]["added"] == 21 and job["result"]["version"] == 1, job
        assert job["progress"]["done"] == job["progress"]["total"] == 21 and job["progress"]["images_per_s"] > 0
        wait_until(lambda: http.get("/readyz").status_code == 200, 10, 0.05, "the swap to version 1")
        found = search(coffee, k=3)
        assert found["index_version"] == 1 and found["results"][0]["path"] == "photos/skimage-coffee.png"

        # upload, search, delete, search again
        moon = (images_root / "photos" / "skimage-moon.png").read_bytes()
        up_r = http.post("/v1/images", files=[("files", ("moon.png", moon))], data={"metadata": '{"n": 1}'})
        assert up_r.status_code == 201, up_r.text
        moon_id = up_r.json()["images"][0]["id"]
        assert up_r.json()["index_version"] == 2 and moon_id == 21
        hits = search(moon, k=2)
        assert hits["index_version"] == 2 and moon_id in [h["id"] for h in hits["results"]]
        assert http.get(f"/v1/images/{moon_id}/file").content == moon
        gone = http.delete(f"/v1/images/{moon_id}")
        assert gone.status_code == 200 and gone.json()["deleted"] and gone.json()["index_version"] == 3
        hits = search(moon, k=30, mode="exact")
        assert hits["index_version"] == 3 and moon_id not in [h["id"] for h in hits["results"]]
        assert len(hits["results"]) == 21
        assert [j["kind"] for j in http.get("/v1/jobs").json()["jobs"]] == ["delete", "add", "index"]

        # kill the worker in the middle of a job: it is retried by the next worker and completes once
        job_id = http.post("/v1/jobs/index", json={"folder": "many"}).json()["id"]
        job = follow(job_id, until=("running",), timeout_s=60)
        wait_until(lambda: http.get(f"/v1/jobs/{job_id}").json()["progress"]["done"] >= 8, 60, 0.02,
                   "embedding to be under way")
        _kill_worker_and_its_job(worker, redis_url, job_id)
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "running"  # until its heartbeat is late
        assert read_current(index) == "v000003" and search(coffee)["index_version"] == 3  # nothing half-applied
        worker = regis_process(WORKER_ARGS, env, tmp_path / "worker-2.log")
        procs.append(worker)
        job = follow(job_id)
        assert job["state"] == "done" and job["attempts"] == 2, job
        assert job["result"]["added"] == 126 and job["result"]["version"] == 4
        wait_until(lambda: http.get("/healthz").json()["index_version"] == 4, 10, 0.05, "the swap to version 4")
        assert http.get("/healthz").json()["images"] == 21 + 126
        leftovers = [p.name for d in (VERSIONS_DIR, SEGMENTS_DIR) for p in (index / d).iterdir()
                     if p.name.startswith(TMP_PREFIX)]
        assert leftovers == []

        # a job without retries whose worker is killed is marked failed, with its reason
        queue = RedisJobQueue(redis_url, RedisNames(prefix), retries=0)
        job_id = queue.submit(JobSpec(kind="index", folder="more")).id
        wait_until(lambda: http.get(f"/v1/jobs/{job_id}").json()["progress"]["done"] >= 8, 60, 0.02,
                   "embedding to be under way")
        _kill_worker_and_its_job(worker, redis_url, job_id)
        worker = regis_process(WORKER_ARGS, env, tmp_path / "worker-3.log")
        procs.append(worker)
        job = follow(job_id)
        assert job["state"] == "failed" and job["error"]["code"] == "worker_lost", job
        assert "no retries left" in job["error"]["message"] and job["attempts"] == 1
        assert read_current(index) == "v000004" and search(coffee)["index_version"] == 4

        # the worker checks folders again: a job naming a folder outside the root is refused, not retried
        job = follow(queue.submit(JobSpec(kind="index", folder="../..")).id)
        assert job["state"] == "failed" and job["error"]["code"] == "invalid_job" and job["attempts"] == 1, job
        assert "'..'" in job["error"]["message"]
        counts = {line.split()[0]: float(line.split()[1]) for line in http.get("/metrics").text.splitlines()
                  if line.startswith("regis_jobs{")}
        assert counts == {'regis_jobs{state="done"}': 4.0, 'regis_jobs{state="failed"}': 2.0,
                          'regis_jobs{state="queued"}': 0.0, 'regis_jobs{state="running"}': 0.0}
        time.sleep(0.2)
        assert api.poll() is None and worker.poll() is None
    finally:
        http.close()
        for proc in procs:
            stop(proc)
