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
