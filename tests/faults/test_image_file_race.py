"""GET /v1/images/{id}/file while a delete of the image removes its file (issue 27's soak found the same window on
thumbnails): the answer is the image's bytes or 404 ``file_unavailable``, never 500."""

from __future__ import annotations

import threading

import pytest
from deploy.support import TINY, noise_png, wait_until
from fastapi.testclient import TestClient

from regis.faults import PAUSE_ENV, RELEASE_ENV
from service.app import create_app
from service.settings import Settings


@pytest.fixture
def client(tmp_path):
    settings = Settings(index_dir=tmp_path / "index", images_root=tmp_path / "images", enable_jobs=True, **TINY)
    (tmp_path / "images").mkdir()
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _held_get(client, tmp_path, monkeypatch, url: str, act) -> object:
    """GET ``url`` held at the pause point ``image-file.found`` while ``act()`` runs; the answer."""
    release = tmp_path / "release"
    monkeypatch.setenv(PAUSE_ENV, "image-file.found")
    monkeypatch.setenv(RELEASE_ENV, str(release))
    answer = {}
    t = threading.Thread(target=lambda: answer.update(r=client.get(url)))
    t.start()
    try:
        wait_until(lambda: (tmp_path / "release.reached").exists(), 60, 0.02, "the file route's pause point")
        act()
    finally:
        release.touch()
        t.join(60)
    return answer["r"]


def test_a_file_whose_image_is_deleted_after_it_was_found_is_404_not_500(client, tmp_path, monkeypatch):
    """The request is held after the route found the uploaded file and before it opens it; the image is deleted
    (its file removed) meanwhile. Before the fix Starlette's FileResponse raised (500)."""
    image_id = client.post("/v1/images", files={"files": ("a.png", noise_png(1, 256))}).json()["images"][0]["id"]

    def delete():
        r = client.delete(f"/v1/images/{image_id}")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text

    r = _held_get(client, tmp_path, monkeypatch, f"/v1/images/{image_id}/file", delete)
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_unavailable", r.text
    assert client.get(f"/v1/images/{image_id}/file").status_code == 404


def test_the_file_route_streams_the_exact_bytes_with_their_length_and_type(client):
    data = noise_png(2, 256)
    image_id = client.post("/v1/images", files={"files": ("b.png", data)}).json()["images"][0]["id"]
    r = client.get(f"/v1/images/{image_id}/file")
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "image/png" and r.headers["content-length"] == str(len(data))
    assert r.headers["etag"] and r.headers["last-modified"].endswith("GMT")
