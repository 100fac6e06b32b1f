"""``regis serve`` (embedded) on a sharded collection: the service's own routes over the in-process fan-out
(``regis.sharding.engine``) answer like the unsharded index of the same images, explanations included (each
result explained by its shard), and so do uploads, deletes and metadata changes (every shard written through
``CollectionWriter``); a missing shard is a 503 or, when asked for, a flagged
partial answer. Tiny random encoder, the 21 bundled photos."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from conftest import assert_same_json, build
from regis.errors import ShardsUnavailableError
from regis.sharding.write import split_index
from service.app import create_app
from service.settings import Settings

SHARDS = 3


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, photos_dir, tiny_encoder):
    """(the unsharded index, the same images split into 3 shards)."""
    root = tmp_path_factory.mktemp("sharded-service")
    build(photos_dir, root / "index", tiny_encoder)
    split_index(root / "index", root / "collection", SHARDS)
    return root / "index", root / "collection"


@pytest.fixture(scope="module")
def clients(indexes):
    index, collection = indexes
    with TestClient(create_app(Settings(index_dir=index))) as plain, \
            TestClient(create_app(Settings(index_dir=collection))) as sharded:
        yield plain, sharded


def _post(client, path, data, **params):
    return client.post(path, files={"file": ("q.png", data, "image/png")}, params=params)


def _ranking(body):
    return [h["id"] for h in body["results"]], [h["score"] for h in body["results"]]


def test_search_equals_the_unsharded_index(clients, photos_dir):
    plain, sharded = clients
    photos = sorted(photos_dir.iterdir())
    for photo in photos[:3]:
        data = photo.read_bytes()
        for params in ({"k": 21, "mode": "exact"}, {"k": 5, "offset": 3, "mode": "exact"},
                       {"k": 10, "mode": "exact", "filter": json.dumps({"file.ext": "jpg"})},
                       {"k": 10, "mode": "exact", "score_threshold": 0.5}):
            want, got = _post(plain, "/v1/search", data, **params), _post(sharded, "/v1/search", data, **params)
            assert want.status_code == got.status_code == 200, got.text
            (want_ids, want_scores), (got_ids, got_scores) = _ranking(want.json()), _ranking(got.json())
            assert got_ids == want_ids, params
            np.testing.assert_allclose(got_scores, want_scores, rtol=0, atol=1e-4)
            assert [h["path"] for h in got.json()["results"]] == [h["path"] for h in want.json()["results"]]
            assert "partial" not in got.json()  # only present on a partial answer
        ann = _post(sharded, "/v1/search", data, k=5).json()
        assert ann["results"][0]["path"] == photo.name and ann["num_candidates"] >= 5
    bad = _post(sharded, "/v1/search", b"not an image")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_image"
    assert _post(sharded, "/v1/search", data, k=9999).status_code == 422
    unknown = _post(sharded, "/v1/search", data, kk=3)
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_parameter"


def test_images_similar_health_and_metrics_equal_the_unsharded_index(clients):
    plain, sharded = clients
    for params in ({"limit": 5, "offset": 3}, {"limit": 100}, {"filter": "file.ext:png", "limit": 4, "offset": 2}):
        want, got = plain.get("/v1/images", params=params).json(), sharded.get("/v1/images", params=params).json()
        assert got["total"] == want["total"] and got["images"] == want["images"], params
    for image_id in (0, 7, 20):
        want, got = plain.get(f"/v1/images/{image_id}").json(), sharded.get(f"/v1/images/{image_id}").json()
        assert {**got, "index_version": 0} == {**want, "index_version": 0}
        assert sharded.get(f"/v1/images/{image_id}/file").content == plain.get(f"/v1/images/{image_id}/file").content
        assert sharded.get(f"/v1/images/{image_id}/thumbnail", params={"size": 32}).status_code == 200
        want = plain.get(f"/v1/images/{image_id}/similar", params={"k": 6, "mode": "exact"}).json()
        got = sharded.get(f"/v1/images/{image_id}/similar", params={"k": 6, "mode": "exact"}).json()
        assert _ranking(got)[0] == _ranking(want)[0] and got["results"][0]["id"] == image_id
    missing = sharded.get("/v1/images/9999")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "image_not_found"
    assert sharded.get("/v1/images/9999/similar").status_code == 404
    health = sharded.get("/healthz").json()
    assert health["images"] == 21 and health["index_version"] == 1  # the collection record's: one write (the split)
    ready = sharded.get("/readyz")
    assert ready.status_code == 200 and ready.json()["images"] == 21
    assert [(s["shard"], s["version"], s["state"]) for s in ready.json()["shards"]] == [(0, 1, "ok"), (1, 1, "ok"),
                                                                                      (2, 1, "ok")]
    assert sum(s["images"] for s in ready.json()["shards"]) == 21 and plain.get("/readyz").json()["images"] == 21
    assert "regis_index_images 21.0" in sharded.get("/metrics").text
    (described,) = sharded.get("/v1/collections").json()["collections"]
    assert described["images"] == 21 and described["index_version"] == 1 and described["default"]


def test_explanations_equal_the_unsharded_index(clients, photos_dir):
    """Each result is explained by its own shard: the same query block, and per result the same matched pairs,
    similarities, contributions, shares and ROI boxes as the unsharded index of the same images."""
    plain, sharded = clients
    photos = sorted(photos_dir.iterdir())
    for photo in photos[:2]:
        data = photo.read_bytes()
        for params in ({"k": 21, "mode": "exact"}, {"k": 4, "offset": 2, "mode": "exact"},
                       {"k": 6, "mode": "exact", "filter": json.dumps({"file.ext": "jpg"})}):
            want = _post(plain, "/v1/search", data, explain="true", **params)
            got = _post(sharded, "/v1/search", data, explain="true", **params)
            assert want.status_code == got.status_code == 200, got.text
            assert all(h["explanation"]["matches"] for h in got.json()["results"])
            assert {h["id"] % SHARDS for h in got.json()["results"]} == set(range(SHARDS)) or params.get("offset")
            assert_same_json(got.json(), want.json())
    for image_id in (0, 7, 20):
        params = {"k": 5, "mode": "exact", "explain": "true"}
        want = plain.get(f"/v1/images/{image_id}/similar", params=params)
        got = sharded.get(f"/v1/images/{image_id}/similar", params=params)
        assert want.status_code == got.status_code == 200, got.text
        assert_same_json(got.json(), want.json())
        pair = {"files": {"file": ("q.png", photos[0].read_bytes(), "image/png")}, "data": {"id": str(image_id)}}
        want, got = plain.post("/v1/explain", **pair), sharded.post("/v1/explain", **pair)
        assert want.status_code == got.status_code == 200, got.text
        assert_same_json(got.json(), want.json())
    files = [("files", (p.name, p.read_bytes(), "image/png")) for p in photos[:2]]
    want = plain.post("/v1/search/batch", files=files, params={"k": 5, "mode": "exact", "explain": "true"})
    got = sharded.post("/v1/search/batch", files=files, params={"k": 5, "mode": "exact", "explain": "true"})
    assert want.status_code == got.status_code == 200, got.text
    assert_same_json(got.json(), want.json())
    missing = sharded.post("/v1/explain", files={"file": ("q.png", data, "image/png")}, data={"id": "9999"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "image_not_found"
    assert sharded.get("/v1/images/9999/similar", params={"explain": "true"}).status_code == 404


def _flipped_png(photo) -> bytes:
    """A new image (the photo mirrored), as PNG bytes."""
    import io

    from PIL import Image, ImageOps

    out = io.BytesIO()
    ImageOps.mirror(Image.open(photo).convert("RGB")).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture()
def writable(tmp_path, indexes):
    """(the unsharded index, the same images in 3 shards), fresh copies, each served with jobs enabled."""
    import shutil

    index, _ = indexes
    shutil.copytree(index, tmp_path / "index")
    split_index(index, tmp_path / "collection", SHARDS)
    with TestClient(create_app(Settings(index_dir=tmp_path / "index", enable_jobs=True))) as plain, \
            TestClient(create_app(Settings(index_dir=tmp_path / "collection", enable_jobs=True))) as sharded:
        yield plain, sharded


def test_uploads_deletes_and_metadata_changes_equal_the_unsharded_index(writable, photos_dir):
    """The same writes on both: the same ids and statuses, then the same searches, rows and explanations; each
    write publishes one new collection version that the next request already sees (read-your-writes)."""
    plain, sharded = writable
    photos = sorted(photos_dir.iterdir())
    new = [_flipped_png(photos[0]), _flipped_png(photos[1])]
    files = [("files", (f"new{n}.png", data, "image/png")) for n, data in enumerate(new)]
    meta = json.dumps([{"album": "mirror"}, {}])
    want = plain.post("/v1/images", files=files, data={"metadata": meta})
    got = sharded.post("/v1/images", files=files, data={"metadata": meta})
    assert want.status_code == got.status_code == 201, got.text
    assert [i["id"] for i in got.json()["images"]] == [i["id"] for i in want.json()["images"]] == [21, 22]
    assert_same_json(got.json()["images"], want.json()["images"])
    assert {21 % SHARDS, 22 % SHARDS} == {0, 1}  # two shards written in one job
    version = got.json()["index_version"]
    again = sharded.post("/v1/images", files=files[:1])
    assert again.status_code == 201, again.text
    assert again.json()["images"][0] == {**got.json()["images"][0], "status": "exists"}
    assert again.json()["index_version"] == version  # nothing changed: no new version
    for client in (plain, sharded):
        r = client.patch("/v1/images/22", json={"metadata": {"album": "mirror"}})
        assert r.status_code == 200, r.text
        r = client.delete("/v1/images/4")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
    assert sharded.get("/healthz").json()["index_version"] == version + 2
    for data in (new[0], photos[4].read_bytes()):
        params = {"k": 23, "mode": "exact", "explain": "true"}
        want = _post(plain, "/v1/search", data, **params).json()
        got = _post(sharded, "/v1/search", data, **params).json()
        assert_same_json(got, want)
        assert 4 not in [h["id"] for h in got["results"]] and len(got["results"]) == 22
    assert _post(sharded, "/v1/search", new[0], k=1, mode="exact").json()["results"][0]["id"] == 21
    for image_id in (21, 22):
        want, got = plain.get(f"/v1/images/{image_id}").json(), sharded.get(f"/v1/images/{image_id}").json()
        assert_same_json({**got, "mtime": 0}, {**want, "mtime": 0})  # the upload's time
        assert got["metadata"]["album"] == "mirror"
        assert sharded.get(f"/v1/images/{image_id}/file").content == new[image_id - 21]
    assert sharded.get("/v1/images/4").status_code == 404
    assert sharded.delete("/v1/images/4").status_code == plain.delete("/v1/images/4").status_code == 404


def _run_job(client, folder: str) -> dict:
    import time

    r = client.post("/v1/jobs/index", json={"folder": folder})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while (info := client.get(f"/v1/jobs/{r.json()['id']}").json())["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    assert info["state"] == "done", info
    return info["result"]


def test_folder_jobs_on_a_sharded_collection_equal_the_unsharded_index(tmp_path, photos_dir, tiny_encoder):
    """POST /v1/jobs/index on a collection of 3 shards, built in the job's process through its
    ``CollectionWriter``: the same ids, rows, searches and job results as the unsharded index, one collection
    version per job. The first job widens the images root from the folder the collection was built from to its
    parent (every shard's paths prefixed), adds a second folder; the second one adds, changes and deletes."""
    import shutil

    photos = sorted(photos_dir.iterdir())
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for photo in photos[:8]:
        shutil.copy2(photo, root / "a" / photo.name)
    build(root / "a", tmp_path / "index", tiny_encoder)
    split_index(tmp_path / "index", tmp_path / "collection", SHARDS)
    for photo in photos[8:14]:
        shutil.copy2(photo, root / "b" / photo.name)
    settings = {"enable_jobs": True, "images_root": root}
    with TestClient(create_app(Settings(index_dir=tmp_path / "index", **settings))) as plain, \
            TestClient(create_app(Settings(index_dir=tmp_path / "collection", **settings))) as sharded:
        for step in range(2):
            if step == 1:
                before = sharded.get("/v1/images/8").json()
                assert before["path"] == f"b/{photos[8].name}"
                (root / "a" / photos[0].name).unlink()
                (root / "b" / photos[8].name).write_bytes(_flipped_png(photos[8]))  # changed: keeps its id
                shutil.copy2(photos[14], root / "b" / photos[14].name)
            want, got = _run_job(plain, "."), _run_job(sharded, ".")
            keys = ("scanned", "added", "updated", "deleted", "unchanged", "skipped_count")
            assert {k: got[k] for k in keys} == {k: want[k] for k in keys}, (got, want)
            assert got["version"] == 2 + step  # one collection version per job
            listing = [sorted((i["id"], i["path"], i["sha256"]) for i in c.get("/v1/images", params={"limit": 100})
                              .json()["images"]) for c in (plain, sharded)]
            assert listing[0] == listing[1] and len(listing[1]) == 14  # 8 + 6, then - 1 + 1
            assert {p.startswith(("a/", "b/")) for _, p, _ in listing[1]} == {True}
            for photo in (photos[3], photos[10]):
                params = {"k": 20, "mode": "exact"}
                want_r = _post(plain, "/v1/search", photo.read_bytes(), **params).json()
                got_r = _post(sharded, "/v1/search", photo.read_bytes(), **params).json()
                assert _ranking(got_r)[0] == _ranking(want_r)[0]
        assert sharded.get("/v1/images/0").status_code == 404  # photos[0] deleted from the folder
        changed = sharded.get("/v1/images/8").json()
        assert changed["path"] == before["path"] and changed["sha256"] != before["sha256"]


def test_a_worker_writes_a_collection_with_its_own_encoder(indexes):
    """``regis worker`` and the service build the encoder with ``encoder_for``: a collection's is its shards'."""
    from regis.index_encoder import encoder_for
    from regis.sharding.layout import collection_manifest

    encoder = encoder_for(indexes[1], None, None, False, None, None, "cpu")
    manifest = collection_manifest(indexes[1])
    assert encoder.config == manifest.encoder and encoder.weights_info.sha256 == manifest.weights.sha256


class _DeadShard:
    """A shard client whose every call fails as an unreachable remote shard does."""

    def __init__(self, shard: int):
        self.shard = shard

    def call(self, method, *args, ref):
        from regis.sharding.engine import _Done

        def fail():
            raise ShardsUnavailableError(f"shard {self.shard} did not answer", [self.shard])

        return _Done(fail)


def _engine_with_dead_shard(collection, on_missing):
    from regis.sharding.engine import LocalShards, ShardedQueryEngine
    from regis.sharding.layout import collection_manifest

    local = ShardedQueryEngine.open(collection)
    shards = [LocalShards(collection) for _ in range(SHARDS)]  # one client per shard: shard s asks shards[s]
    shards[1] = _DeadShard(1)
    return ShardedQueryEngine(local.encoder, shards, collection, collection_manifest(collection),
                              on_missing=on_missing, refresh=False)


@pytest.mark.parametrize("on_missing", ["error", "partial"])
def test_a_missing_shard_is_a_503_or_a_flagged_partial_answer(indexes, photos_dir, on_missing):
    _, collection = indexes
    app = create_app(Settings(index_dir=collection), load=False)
    app.state.engine = _engine_with_dead_shard(collection, on_missing)
    data = sorted(photos_dir.iterdir())[0].read_bytes()
    with TestClient(app) as client:
        r = _post(client, "/v1/search", data, k=21, mode="exact")
        if on_missing == "error":
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["error"] == {"code": "shards_unavailable", "message": "shards [1] of 3 did not answer; "
                                         "the ranking would be incomplete: retry later"}
            assert client.get("/v1/images/1").status_code == 503  # its row lives on the dead shard
        else:
            body = r.json()
            assert r.status_code == 200 and body["partial"] is True and body["missing_shards"] == [1]
            assert len(body["results"]) == 14 and all(h["id"] % SHARDS != 1 for h in body["results"])
        assert client.get("/v1/images/0").status_code == 200  # the other shards still answer


def test_the_service_follows_each_shards_new_version(tmp_path, indexes, tiny_encoder):
    from regis.sharding.write import ShardedWriter
    from service.live import LiveIndex

    index, _ = indexes
    split_index(index, tmp_path / "c", SHARDS)
    live = LiveIndex(Settings(index_dir=tmp_path / "c"))
    live.load()
    try:
        before = live.engine.snapshot.version
        assert live.engine.snapshot.table.get(4) is not None and not live.refresh()
        with ShardedWriter(tmp_path / "c", SHARDS, tiny_encoder.config, tiny_encoder.weights_info) as w:
            w.delete([4])  # shard 1 gets a new version
            w.commit()
        assert live.refresh() and live.engine.snapshot.version == before + 1
        assert live.engine.snapshot.table.get(4) is None and len(live.engine.snapshot) == 20
        with pytest.raises(KeyError):
            live.engine.search_id(4)
    finally:
        live.close()
