"""The write API without Redis (the embedded default): jobs run in a thread of the API, same endpoints."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from deploy.support import TINY, wait_until
from service.app import create_app
from service.settings import Settings


def _settings(tmp_path, images_root, **kw) -> Settings:
    return Settings(index_dir=tmp_path / "index", images_root=images_root, enable_jobs=True, index_poll_s=0.2,
                    **TINY, **kw)


def _follow(client, job_id, timeout_s=60) -> dict:
    def finished():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ("done", "failed") else None

    return wait_until(finished, timeout_s, what=f"job {job_id}")


def _search(client, data: bytes, **params):
    return client.post("/v1/search", files={"file": ("q.png", data, "application/octet-stream")}, params=params)


@pytest.fixture
def client(tmp_path, images_root):
    (images_root / "photos" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    outside = tmp_path / "outside"
    outside.mkdir()
    (images_root / "escape").symlink_to(outside)
    with TestClient(create_app(_settings(tmp_path, images_root))) as c:
        yield c


def test_starts_without_an_index_then_indexes_a_folder(client, images_root):
    assert client.get("/healthz").json()["index_version"] is None
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["index"] != "ok"
    coffee = (images_root / "photos" / "skimage-coffee.png").read_bytes()
    r = _search(client, coffee)  # nothing indexed yet: no results, not an error (issue 27)
    assert r.status_code == 200 and r.json()["results"] == [] and r.json()["index_version"] == 0, r.text
    assert client.get("/v1/images").json()["total"] == 0

    for folder, status, code in [("..", 403, "folder_forbidden"), ("/etc", 403, "folder_forbidden"),
                                 ("escape", 403, "folder_forbidden"), ("photos/../..", 403, "folder_forbidden"),
                                 ("missing", 404, "folder_not_found"), (".uploads", 422, "invalid_folder")]:
        r = client.post("/v1/jobs/index", json={"folder": folder})
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), folder
    assert client.post("/v1/jobs/index", json={"folder": 3}).status_code == 422

    r = client.post("/v1/jobs/index", json={"folder": "photos"})
    assert r.status_code == 202 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    job = _follow(client, r.json()["id"])
    assert job["state"] == "done", job
    assert job["attempts"] == 1 and job["progress"]["total"] == 22 and job["progress"]["skipped"] == 1
    assert job["progress"]["images_per_s"] > 0
    assert job["result"]["version"] == 1 and job["result"]["added"] == 21
    assert [s["path"] for s in job["result"]["skipped"]] == ["photos/broken.jpg"]

    wait_until(lambda: client.get("/readyz").status_code == 200, 10, what="readiness")
    r = _search(client, coffee, k=3)
    assert r.status_code == 200 and r.json()["index_version"] == 1
    assert r.json()["results"][0]["path"] == "photos/skimage-coffee.png"
    listed = client.get("/v1/jobs").json()["jobs"]
    assert listed[0]["id"] == job["id"] and client.get("/v1/jobs", params={"limit": 0}).status_code == 422
    assert client.get("/v1/jobs/" + "0" * 32).json()["error"]["code"] == "job_not_found"
    assert client.get("/v1/jobs/not-an-id").status_code == 404


def test_uploads_deletes_and_rescans(client, images_root):
    job = _follow(client, client.post("/v1/jobs/index", json={"folder": ""}).json()["id"])
    assert job["state"] == "done" and job["result"]["version"] == 1
    moon = (images_root / "photos" / "skimage-moon.png").read_bytes()
    china = (images_root / "photos" / "sklearn-china.jpg").read_bytes()
    meta = json.dumps([{"title": "moon"}, {"title": "china"}])
    r = client.post("/v1/images", files=[("files", ("m.png", moon)), ("files", ("c.jpg", china))],
                    data={"metadata": meta})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["index_version"] == 2 and [im["status"] for im in body["images"]] == ["added", "added"]
    moon_id, china_id = (im["id"] for im in body["images"])
    info = client.get(f"/v1/images/{china_id}").json()
    assert info["path"].startswith(".uploads/")  # the original file name is kept in the file facts
    assert info["metadata"] == {"title": "china", "file": {"name": "c.jpg", "uploaded": True, "folder": ".uploads/"
                                                         + info["path"].split("/")[1], "ext": "jpg"}}
    f = client.get(f"/v1/images/{china_id}/file")
    assert f.status_code == 200 and f.content == china and f.headers["content-type"] == "image/jpeg"
    assert (images_root / ".uploads").is_dir() and not any((images_root / ".uploads" / ".staging").iterdir())

    # the same bytes again: the same image; read-your-writes: the response's version already answers
    r = client.post("/v1/images", files=[("files", ("again.png", moon))])
    again = r.json()["images"][0]
    assert r.status_code == 201 and (again["id"], again["status"]) == (moon_id, "exists")
    hits = _search(client, china, k=2).json()  # the folder copy and the upload: the same bytes, score 10
    assert hits["index_version"] == 2
    assert {h["path"].split("/")[0] for h in hits["results"]} == {"photos", ".uploads"}
    assert all(h["score"] == pytest.approx(10.0, abs=1e-2) for h in hits["results"])

    # bad uploads change nothing
    for files, data, status, code in [
        ([("files", ("x.jpg", b"not an image"))], None, 400, "invalid_image"),
        ([("files", ("m.png", moon)), ("files", ("x.gif", b"GIF89a..."))], None, 400, "invalid_image"),
        ([("files", ("m.png", moon))], {"metadata": "{not json"}, 422, "invalid_metadata"),
        ([("files", ("m.png", moon))], {"metadata": "[1, 2]"}, 422, "invalid_metadata"),
        ([("files", ("m.png", moon))] * 40, None, 413, "too_many_files"),
    ]:
        r = client.post("/v1/images", files=files, data=data)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert "file 2" in client.post("/v1/images", files=[("files", ("m.png", moon)),
                                                        ("files", ("x.gif", b"GIF89a..."))]).json()["error"]["message"]
    assert client.get("/healthz").json()["index_version"] == 2

    # a re-scan of the whole root keeps the uploads (they live in the hidden .uploads folder)
    rescan = _follow(client, client.post("/v1/jobs/index", json={"folder": "."}).json()["id"])
    assert rescan["state"] == "done" and rescan["result"]["deleted"] == 0 and rescan["result"]["added"] == 0
    assert rescan["result"]["version"] is None
    assert client.get(f"/v1/images/{china_id}").status_code == 200

    r = client.delete(f"/v1/images/{china_id}")
    assert r.status_code == 200 and r.json()["deleted"] is True and r.json()["index_version"] == 3
    assert client.get(f"/v1/images/{china_id}").status_code == 404
    assert client.get(f"/v1/images/{china_id}/file").status_code == 404
    assert china_id not in [h["id"] for h in _search(client, china, k=30).json()["results"]]
    assert client.delete(f"/v1/images/{china_id}").json()["error"]["code"] == "image_not_found"

    # not waiting: 202 with the job to follow
    r = client.post("/v1/images", params={"wait": "false"}, files=[("files", ("c.jpg", china))])
    assert r.status_code == 202 and r.json()["images"][0]["status"] == "pending"
    job = _follow(client, r.json()["job_id"])
    assert job["kind"] == "add" and job["result"]["images"][0]["status"] == "added"

    text = client.get("/metrics").text
    assert 'regis_http_requests_total{method="POST",route="/v1/images",status="201"}' in text
    assert 'regis_http_requests_total{method="DELETE",route="/v1/images/{image_id}",status="200"} 1.0' in text
    assert 'regis_search_stage_seconds_count{stage="rerank"}' in text
    assert 'regis_jobs{state="done"}' in text and "regis_index_version 4.0" in text
    assert "regis_index_images 23.0" in text


def test_a_read_only_service_refuses_writes(tmp_path, images_root, tiny_encoder):
    from conftest import build

    build(images_root, tmp_path / "index", tiny_encoder)
    settings = Settings(index_dir=tmp_path / "index", images_root=images_root)
    with TestClient(create_app(settings)) as c:
        for method, url in [("post", "/v1/jobs/index"), ("get", "/v1/jobs"), ("get", "/v1/jobs/" + "0" * 32),
                            ("delete", "/v1/images/0")]:
            r = getattr(c, method)(url, **({"json": {"folder": ""}} if method == "post" else {}))
            assert (r.status_code, r.json()["error"]["code"]) == (403, "jobs_disabled"), url
        r = c.post("/v1/images", files=[("files", ("m.png", b"x"))])
        assert r.status_code == 403
        assert c.get("/readyz").status_code == 200 and c.get("/healthz").json()["index_version"] == 1


def test_folder_jobs_need_an_images_root(tmp_path):
    settings = Settings(index_dir=tmp_path / "index", enable_jobs=True, **TINY)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/jobs/index", json={"folder": ""})
        assert (r.status_code, r.json()["error"]["code"]) == (403, "folder_jobs_disabled")


def test_settings_refuse_bad_deploy_values(tmp_path):
    from pydantic import ValidationError

    for bad in ({"redis_url": "http://x"}, {"redis_prefix": "a b"}, {"job_retries": -1}, {"cache_ttl_s": -1},
                {"random_init": True, "weights": tmp_path / "w.safetensors"}, {"max_upload_files": 0}):
        with pytest.raises(ValidationError):
            Settings(index_dir=tmp_path, **bad)
