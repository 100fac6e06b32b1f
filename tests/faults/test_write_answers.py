"""A write whose job is queued already when the queue goes away is answered 202 with its job id, never 503 (the
soak run of issue 14 found deletes answered 503 that the worker then ran: the client was told its write was
refused). The failure is injected in that window: after ``submit``, while the request waits for the job."""

from __future__ import annotations

import io

import pytest
from deploy.support import wait_until
from fastapi.testclient import TestClient
from PIL import Image

from regis.jobs.model import QueueUnavailableError
from service.app import create_app
from service.settings import Settings


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (72, 60), color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def client(tmp_path):
    (tmp_path / "root").mkdir()
    settings = Settings(index_dir=tmp_path / "index", images_root=tmp_path / "root", enable_jobs=True,
                        backbone="vit-tiny-reg4-test", random_init=True, write_wait_s=30, index_poll_s=3600)
    with TestClient(create_app(settings)) as c:
        yield c


def _queue_goes_away_after_submit(monkeypatch, queue) -> list[str]:
    """From now on the queue accepts a job, then cannot be reached while the request waits for it."""
    submitted = []
    real_submit = queue.submit

    def submit(spec, job_id=None):
        info = real_submit(spec, job_id)
        submitted.append(info.id)
        return info

    def unreachable(job_id):
        raise QueueUnavailableError("the job queue cannot be reached")

    monkeypatch.setattr(queue, "submit", submit)
    monkeypatch.setattr(queue, "get", unreachable)
    return submitted


def _done(c, job_id):
    return c.get(f"/v1/jobs/{job_id}").json()["state"] == "done"


def test_an_upload_queued_before_the_queue_went_away_is_answered_202(client, monkeypatch):
    queue = client.app.state.jobs
    submitted = _queue_goes_away_after_submit(monkeypatch, queue)
    r = client.post("/v1/images", files={"files": ("red.png", _png("red"))})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["job_id"] == submitted[0] and body["images"][0]["status"] == "pending"
    assert r.headers["location"] == f"/v1/jobs/{submitted[0]}"
    monkeypatch.undo()  # the queue is back: the job ran (or runs) and the image is there, once
    wait_until(lambda: _done(client, body["job_id"]), 60, what="the upload's job")
    wait_until(lambda: client.get("/healthz").json()["images"] == 1, 10, what="the image served")


def test_a_delete_queued_before_the_queue_went_away_is_answered_202(client, monkeypatch):
    r = client.post("/v1/images", files={"files": ("red.png", _png("red"))})
    assert r.status_code == 201, r.text
    image_id = r.json()["images"][0]["id"]
    queue = client.app.state.jobs
    submitted = _queue_goes_away_after_submit(monkeypatch, queue)
    r = client.delete(f"/v1/images/{image_id}")
    assert r.status_code == 202, r.text
    assert r.json()["job_id"] == submitted[0] and r.json()["deleted"] is False
    assert r.headers["location"] == f"/v1/jobs/{submitted[0]}"
    monkeypatch.undo()
    wait_until(lambda: _done(client, submitted[0]), 60, what="the delete's job")
    wait_until(lambda: client.get(f"/v1/images/{image_id}").status_code == 404, 10, what="the image gone")
