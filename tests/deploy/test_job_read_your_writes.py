"""GET /v1/jobs/{id} answers "done" once this server serves the version the job published (read-your-writes), even
when the job ran in another process (a Redis worker, Ray Serve's ``Writer``) and the index watcher has not polled
(CI failed on it: a folder job through Ray Serve was "done", the listing that followed missed its images)."""

from __future__ import annotations

import shutil

from fastapi.testclient import TestClient

from conftest import build
from regis.jobs.model import JobInfo
from regis.jobs.queue import JobQueue
from service.app import create_app
from service.deps import get_jobs
from service.settings import Settings


class _DoneElsewhere(JobQueue):
    """A queue whose one job was done by another process and published ``version``."""

    backend = "test"

    def __init__(self, version: int):
        self.info = JobInfo(id="j1", kind="index", state="done", result={"version": version})

    def submit(self, spec, job_id=None):
        raise NotImplementedError

    def get(self, job_id):
        return self.info if job_id == self.info.id else None

    def list(self, limit=20):
        return [self.info]


def _app(index, queue):
    app = create_app(Settings(index_dir=index, index_poll_s=3600))  # the watcher never polls during the test
    app.dependency_overrides[get_jobs] = lambda: queue
    return app


def test_a_done_job_is_answered_once_its_version_is_served(tmp_path, images_root, tiny_encoder):
    photos, index = images_root / "photos", tmp_path / "index"
    build(photos, index, tiny_encoder)  # version 1
    with TestClient(_app(index, _DoneElsewhere(version=2))) as c:
        assert c.get("/healthz").json()["index_version"] == 1
        shutil.copy(photos / "skimage-coffee.png", photos / "new.png")
        assert build(photos, index, tiny_encoder).version == 2  # the "worker" publishes; nobody told the server
        assert c.get("/healthz").json()["index_version"] == 1
        assert c.get("/v1/jobs/j1").json()["state"] == "done"
        assert c.get("/healthz").json()["index_version"] == 2
        assert "new.png" in [i["path"] for i in c.get("/v1/images", params={"limit": 100}).json()["images"]]


def test_a_done_job_whose_version_never_comes_is_answered_after_the_wait(tmp_path, images_root, tiny_encoder,
                                                                          monkeypatch):
    import service.routes.jobs as routes

    monkeypatch.setattr(routes, "_SERVED_WAIT_S", 0.3)
    index = tmp_path / "index"
    build(images_root / "photos", index, tiny_encoder)
    with TestClient(_app(index, _DoneElsewhere(version=7))) as c:
        r = c.get("/v1/jobs/j1")
        assert r.status_code == 200 and r.json()["state"] == "done" and r.json()["result"]["version"] == 7
        assert c.get("/healthz").json()["index_version"] == 1
        assert c.get("/v1/jobs/nosuch").status_code == 404
