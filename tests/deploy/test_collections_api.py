"""Collections over HTTP (embedded jobs): create, fill, search, list, describe and delete collections; the routes
without /collections/{name} keep answering for the default collection."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

from deploy.support import TINY, wait_until
from service.app import create_app
from service.settings import Settings


@pytest.fixture
def client(tmp_path, images_root):
    names = sorted(p.name for p in (images_root / "photos").iterdir())
    (images_root / "b").mkdir()
    for name in names[12:]:
        shutil.move(images_root / "photos" / name, images_root / "b" / name)
    settings = Settings(collections_root=tmp_path / "collections", images_root=images_root, enable_jobs=True,
                        index_poll_s=0.2, **TINY)
    with TestClient(create_app(settings)) as c:
        yield c


def _index(client, base: str, folder: str) -> dict:
    r = client.post(f"{base}/jobs/index", json={"folder": folder})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]

    def finished():
        job = client.get(f"{base}/jobs/{job_id}").json()
        return job if job["state"] in ("done", "failed") else None

    return wait_until(finished, 120, what=f"job {job_id}")


def _search(client, base: str, data: bytes, **params):
    return client.post(f"{base}/search", files={"file": ("q.png", data, "image/png")}, params=params)


def test_collections_are_created_filled_searched_and_deleted(client, images_root, one_thread):
    assert [c["name"] for c in client.get("/v1/collections").json()["collections"]] == ["default"]
    r = client.post("/v1/collections", json={"name": "alpha", "backbone": "vit-tiny-reg4-test", "random_init": True})
    assert r.status_code == 201 and r.json()["images"] == 0 and r.json()["index_version"] is None
    assert client.post("/v1/collections", json={"name": "alpha"}).status_code == 409
    assert client.post("/v1/collections", json={"name": "default"}).status_code == 409
    for bad in ({"name": "../x"}, {"name": "Big"}, {"name": "ok", "backbone": "nope"}, {"name": "ok", "x": 1}):
        assert client.post("/v1/collections", json=bad).status_code == 422, bad

    # alpha takes photos/, the default collection takes b/: neither sees the other's images
    assert _index(client, "/v1/collections/alpha", "photos")["result"]["added"] == 12
    assert _index(client, "/v1", "b")["result"]["added"] == 9
    a_photo = sorted((images_root / "photos").iterdir())[0]
    b_photo = sorted((images_root / "b").iterdir())[0]
    wait_until(lambda: _search(client, "/v1/collections/alpha", a_photo.read_bytes()).status_code == 200, 10)
    alpha = _search(client, "/v1/collections/alpha", a_photo.read_bytes(), k=30, mode="exact").json()
    assert alpha["results"][0]["path"] == f"photos/{a_photo.name}" and len(alpha["results"]) == 12
    default = _search(client, "/v1", b_photo.read_bytes(), k=30, mode="exact").json()
    assert default["results"][0]["path"] == f"b/{b_photo.name}" and len(default["results"]) == 9
    same = _search(client, "/v1/collections/default", b_photo.read_bytes(), k=30, mode="exact").json()
    assert [h["id"] for h in same["results"]] == [h["id"] for h in default["results"]]
    image_id = alpha["results"][0]["id"]
    assert client.get(f"/v1/collections/alpha/images/{image_id}").json()["path"] == f"photos/{a_photo.name}"
    assert client.get(f"/v1/collections/alpha/images/{image_id}/file").content == a_photo.read_bytes()

    # metadata: PATCH (merge patch, null removes), uploads keep their file name, filters see both
    r = client.patch(f"/v1/collections/alpha/images/{image_id}", json={"metadata": {"album": "trip", "x": 1}})
    assert r.status_code == 200 and r.json()["metadata"]["album"] == "trip", r.text
    r = client.patch(f"/v1/collections/alpha/images/{image_id}", json={"metadata": {"x": None}})
    assert set(r.json()["metadata"]) == {"album", "file"} and r.json()["index_version"] == 3
    up = client.post("/v1/collections/alpha/images", files=[("files", ("holiday.jpg", b_photo.read_bytes()))],
                     data={"metadata": '{"album": "trip"}'})
    assert up.status_code == 201, up.text
    trip = client.get("/v1/collections/alpha/images", params={"filter": "album:trip"}).json()
    assert trip["total"] == 2 and {im["metadata"]["file"]["name"] for im in trip["images"]} == {a_photo.name,
                                                                                                "holiday.jpg"}
    hits = _search(client, "/v1/collections/alpha", b_photo.read_bytes(), k=5, filter="album:trip").json()
    assert [h["metadata"]["file"]["name"] for h in hits["results"]][0] == "holiday.jpg" and len(hits["results"]) == 2
    # not in the default collection, where no image has the field: 422, or nothing with "strict": false
    assert client.get("/v1/images", params={"filter": "album:trip"}).json()["error"]["code"] == "unknown_filter_field"
    assert client.get("/v1/images", params={"filter": "album:trip,strict:false"}).json()["total"] == 0

    listed = {c["name"]: c for c in client.get("/v1/collections").json()["collections"]}
    assert set(listed) == {"alpha", "default"} and listed["alpha"]["images"] == 13
    assert listed["default"]["default"] and not listed["alpha"]["default"]
    info = client.get("/v1/collections/alpha").json()
    assert info["backbone"] == "vit-tiny-reg4-test" and info["loaded"] and info["index_version"] == 4

    for path in ("/v1/collections/nope", "/v1/collections/nope/images/0"):
        assert client.get(path).json()["error"]["code"] == "collection_not_found"
    assert client.get("/v1/collections/NOPE/images/0").status_code == 422
    assert client.delete("/v1/collections/default").status_code == 409
    assert client.delete("/v1/collections/alpha").status_code == 204
    assert client.get("/v1/collections/alpha").status_code == 404
    assert [c["name"] for c in client.get("/v1/collections").json()["collections"]] == ["default"]
    assert _search(client, "/v1", b_photo.read_bytes()).status_code == 200  # the default collection serves on


def test_a_service_without_a_collections_root_has_only_the_default(tmp_path, images_root, tiny_encoder):
    from tests.conftest import build

    build(images_root / "photos", tmp_path / "index", tiny_encoder)
    with TestClient(create_app(Settings(index_dir=tmp_path / "index"))) as c:
        assert [x["name"] for x in c.get("/v1/collections").json()["collections"]] == ["default"]
        assert c.get("/v1/collections/default").json()["images"] == 21
        r = c.post("/v1/collections", json={"name": "x"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "jobs_disabled"
        assert c.get("/v1/collections/other/images/0").json()["error"]["code"] == "collection_not_found"


def test_a_collection_created_with_a_frame_indexes_and_queries_with_it(client, tmp_path, one_thread):
    """POST /v1/collections takes frame and query_layout; the collection's index manifest records them, and its
    queries are encoded with them (issue 29). A portrait upload is indexed whole: its ROI boxes lie in its
    pixels."""
    import io

    import numpy as np
    from PIL import Image

    from regis.indexes.snapshot import IndexSnapshot

    for bad in ({"name": "f", "frame": "sideways"}, {"name": "f", "query_layout": "all"}):
        assert client.post("/v1/collections", json=bad).status_code == 422, bad
    r = client.post("/v1/collections", json={"name": "tall", "backbone": "efficientnet-lite0", "random_init": True,
                                             "frame": "aspect", "query_layout": "tokens"})
    assert r.status_code == 201, r.text
    assert r.json()["config"]["frame"] == "aspect" and r.json()["config"]["query_layout"] == "tokens"
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (600, 400, 3), dtype=np.uint8)).save(buf, "PNG")
    portrait = buf.getvalue()
    up = client.post("/v1/collections/tall/images", files=[("files", ("portrait.png", portrait))])
    assert up.status_code == 201, up.text
    snap = IndexSnapshot.open(tmp_path / "collections" / "tall")
    assert snap.manifest.encoder.frame == "aspect" and snap.manifest.encoder.query_layout == "tokens"
    found = _search(client, "/v1/collections/tall", portrait, k=1, explain="true").json()
    assert found["results"][0]["metadata"]["file"]["name"] == "portrait.png"
    assert len(found["query"]["tokens"]) == 10  # the index's layout: its 10 tokens, not the 15 of the default
    for token in found["query"]["tokens"][5:]:
        x0, y0, x1, y1 = token["box"]
        assert 0 <= x0 < x1 <= 400 and 0 <= y0 < y1 <= 600
