"""A service of collections without a default collection (issue 25, item 2): it starts with or without jobs, the
routes without /collections/{name} answer 404 naming the collections that can be searched (not 503), and the
empty default collection is not offered for searching."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

from regis.indexes.collections import CollectionConfig, CollectionsRoot
from service.app import create_app
from service.settings import Settings
from tests.conftest import build


@pytest.fixture(scope="module")
def root(tmp_path_factory, photos_dir, tiny_encoder):
    """A collections root with "photos" (3 images) and an empty "later"; no default collection."""
    root = tmp_path_factory.mktemp("collections")
    folder = tmp_path_factory.mktemp("three")
    for name in ("skimage-coffee.png", "skimage-chelsea.png", "skimage-rocket.jpg"):
        shutil.copy(photos_dir / name, folder / name)
    collections = CollectionsRoot(root)
    config = CollectionConfig(backbone="vit-tiny-reg4-test", random_init=True)
    build(folder, collections.create("photos", config), tiny_encoder)
    collections.create("later", config)
    return root, folder


@pytest.mark.parametrize("jobs", [False, True])
def test_a_root_without_a_default_collection_serves_its_collections(root, jobs):
    root, folder = root
    settings = Settings(collections_root=root, enable_jobs=jobs, backbone="vit-tiny-reg4-test", random_init=True)
    with TestClient(create_app(settings)) as client:
        query = {"file": ("q.png", (folder / "skimage-coffee.png").read_bytes())}
        r = client.post("/v1/search", files=query)
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "no_default_collection" and error["collections"] == ["photos"]
        assert "photos" in error["message"] and "/v1/collections/{name}/search" in error["message"]
        assert client.get("/v1/images").status_code == 404
        named = client.post("/v1/collections/default/search", files=query)  # by its name too
        assert named.status_code == 404 and named.json()["error"]["code"] == "no_default_collection"
        r = client.post("/v1/collections/photos/search", files=query, params={"k": 1})
        assert r.status_code == 200 and r.json()["results"][0]["path"] == "skimage-coffee.png"
        listed = {c["name"]: c["images"] for c in client.get("/v1/collections").json()["collections"]}
        # read-only, the empty default collection is nothing to offer; with jobs it can be written to
        assert listed == ({"photos": 3, "later": 0} | ({"default": 0} if jobs else {}))
        assert client.get("/healthz").status_code == 200


def _manifest(index):
    """(FaissInfo.codec, TokenStoreInfo.spec, TokenStoreInfo.rule) of an index's live version."""
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    try:
        return snap.manifest.faiss.codec, snap.manifest.token_store.spec, snap.manifest.token_store.rule
    finally:
        snap.close()


def test_a_compact_collection_over_rest_writes_the_compact_layout(tmp_path, photos_dir, one_thread):
    """POST /v1/collections with layout "compact": uploads write the index as ``regis index build --compact``
    does (FAISS codec PQ{D/8}x4fsr, the compact store rule), its searches answer; a default collection records
    neither; a collection's existing index keeps its manifest's layout; a layout not offered is a 422."""
    import json

    settings = Settings(collections_root=tmp_path, enable_jobs=True, backbone="vit-tiny-reg4-test", random_init=True)
    tiny = {"backbone": "vit-tiny-reg4-test", "random_init": True}
    photos = [photos_dir / n for n in ("skimage-coffee.png", "skimage-chelsea.png", "skimage-rocket.jpg")]
    with TestClient(create_app(settings)) as client:
        bad = client.post("/v1/collections", json={"name": "bad", "layout": "tiny", **tiny})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
        assert "layout" in bad.json()["error"]["message"] and not (tmp_path / "bad").exists()
        made = client.post("/v1/collections", json={"name": "small", "layout": "compact", **tiny})
        assert made.status_code == 201 and made.json()["layout"] == made.json()["config"]["layout"] == "compact"
        assert client.post("/v1/collections", json={"name": "plain", **tiny}).json()["layout"] == "default"
        for name in ("small", "plain"):
            up = client.post(f"/v1/collections/{name}/images",
                             files=[("files", (p.name, p.read_bytes())) for p in photos[:2]])
            assert up.status_code == 201, up.text
        # a 32-wide test ViT: 4 x 4-bit FAISS codes; 20 token vectors: the SQ4 store, re-picked by size
        assert _manifest(tmp_path / "small") == ("PQ4x4fsr", "SQ4", "compact")
        assert _manifest(tmp_path / "plain")[0::2] == (None, None)
        listed = {c["name"]: c["layout"] for c in client.get("/v1/collections").json()["collections"]}
        assert listed == {"small": "compact", "plain": "default", "default": "default"}
        # an index that exists keeps its manifest's layout: plain's config now says compact, its index stays
        config = tmp_path / "plain" / "collection.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "layout": "compact"}))
        for name in ("small", "plain"):
            up = client.post(f"/v1/collections/{name}/images", files=[("files", (photos[2].name,
                                                                                 photos[2].read_bytes()))])
            assert up.status_code == 201 and up.json()["index_version"] == 2, up.text
        assert _manifest(tmp_path / "small") == ("PQ4x4fsr", "SQ4", "compact")
        assert _manifest(tmp_path / "plain")[0::2] == (None, None)
        for photo in photos:
            found = client.post("/v1/collections/small/search", params={"k": 3},
                                files={"file": (photo.name, photo.read_bytes())})
            assert found.status_code == 200, found.text
            assert found.json()["results"][0]["metadata"]["file"]["name"] == photo.name
