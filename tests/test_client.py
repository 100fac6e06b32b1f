"""The Python client (issue 25, item 9) against a live ``regis serve`` subprocess: every route, typed results (the
service's own models), the key header, errors carrying the JSON error; 503 retries with back-off (mock
transport). The server is a collections root without a default collection (item 2, live)."""

from __future__ import annotations

import asyncio
import io
import json
import shutil

import httpx
import pytest
from deploy.support import free_port, regis_process, stop, wait_until
from PIL import Image

from regis.api.explain import PairExplanation
from regis.api.schemas import SearchResponse
from regis.client import (
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    UnprocessableError,
)
from regis.indexes.collections import CollectionConfig, CollectionsRoot
from service.keys import create_key
from tests.conftest import build

PHOTOS = {"skimage-coffee.png": {"album": "kitchen"}, "skimage-chelsea.png": {"album": "cats", "people": []},
          "skimage-astronaut.png": {"album": "nasa", "people": ["Eileen Collins"]},
          "skimage-rocket.jpg": {"album": "nasa"}}
TINY_ENV = {"REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, photos_dir, tiny_encoder):
    """``regis serve --collections-root ROOT --enable-jobs --api-keys-file KEYS`` with collection "photos" (4
    photos with sidecar metadata) and no default collection; yields (url, read key, write key, images root)."""
    tmp = tmp_path_factory.mktemp("client")
    images = tmp / "images"
    for name, meta in PHOTOS.items():
        (images / "photos").mkdir(parents=True, exist_ok=True)
        shutil.copy(photos_dir / name, images / "photos" / name)
        (images / "photos" / f"{name}.json").write_text(json.dumps(meta))
    (images / "more").mkdir()
    for name in ("sklearn-china.jpg", "sklearn-flower.jpg"):
        shutil.copy(photos_dir / name, images / "more" / name)
    root = CollectionsRoot(tmp / "collections")
    index = root.create("photos", CollectionConfig(backbone="vit-tiny-reg4-test", random_init=True))
    build(images / "photos", index, tiny_encoder, images_root=images)
    read_key, _ = create_key(tmp / "keys.json", "read", "client test")
    write_key, _ = create_key(tmp / "keys.json", "write", "client test")
    port = free_port()
    log = tmp / "serve.log"
    proc = regis_process(["serve", "--collections-root", str(root.root), "--enable-jobs", "--images-root",
                          str(images), "--api-keys-file", str(tmp / "keys.json"), "--port", str(port)], TINY_ENV, log)
    url = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 180, 0.2, what="regis serve")
        yield url, read_key, write_key, images
    finally:
        stop(proc)


def _png(photo) -> bytes:
    return photo.read_bytes()


def test_keys_and_errors_carry_the_services_json_error(served):
    url, read_key, _, images = served
    coffee = images / "photos" / "skimage-coffee.png"
    with Client(url) as anonymous, pytest.raises(AuthenticationError) as info:
        anonymous.search(coffee, collection="photos")
    assert info.value.status == 401 and info.value.code == "unauthorized"
    with Client(url, api_key=read_key) as regis:
        with pytest.raises(NotFoundError) as info:  # no default collection: its name is in the error
            regis.search(coffee)
        assert info.value.code == "no_default_collection" and info.value.details["collections"] == ["photos"]
        with pytest.raises(UnprocessableError) as info:
            regis.search(coffee, filter="albun:nasa", collection="photos")
        assert info.value.code == "unknown_filter_field" and info.value.details["suggestions"][0] == "album"
        with pytest.raises(BadRequestError) as info:
            regis.search(b"not an image", collection="photos")
        assert info.value.code == "invalid_image"
        with pytest.raises(PermissionDeniedError):  # a read key cannot upload
            regis.upload([coffee], collection="photos")


def test_search_by_path_bytes_file_and_pil_image_with_filters_and_paging(served):
    url, read_key, _, images = served
    coffee = images / "photos" / "skimage-coffee.png"
    with Client(url, api_key=read_key, collection="photos") as regis:
        by_path = regis.search(coffee, k=4)
        assert isinstance(by_path, SearchResponse) and by_path.results[0].path == "photos/skimage-coffee.png"
        with open(coffee, "rb") as f:
            by_file = regis.search(f, k=4)
        by_bytes = regis.search(coffee.read_bytes(), k=4)
        by_pil = regis.search(Image.open(coffee), k=4)
        for other in (by_file, by_bytes, by_pil):
            assert [h.id for h in other.results] == [h.id for h in by_path.results]
        nasa = regis.search(coffee, k=10, filter={"album": "nasa"})
        assert {h.path for h in nasa.results} == {"photos/skimage-astronaut.png", "photos/skimage-rocket.jpg"}
        people = regis.search(coffee, filter={"people": {"contains": "Eileen Collins"}})
        assert [h.path for h in people.results] == ["photos/skimage-astronaut.png"]
        page = regis.search(coffee, k=2, offset=2)
        assert [h.id for h in page.results] == [h.id for h in by_path.results[2:4]]
        assert [h.rank for h in page.results] == [3, 4]
        explained = regis.search(coffee, k=1, explain=True)
        assert explained.results[0].explanation is not None and explained.query is not None
        top = by_path.results[0].id
        assert regis.similar(top, k=1).results[0].id == top
        batch = regis.search_batch([coffee, images / "photos" / "skimage-rocket.jpg"], k=1)
        assert [r.results[0].path for r in batch.results] == ["photos/skimage-coffee.png", "photos/skimage-rocket.jpg"]
        pair = regis.explain(coffee, top)
        assert isinstance(pair, PairExplanation) and pair.heatmap is not None


def test_images_files_thumbnails_listing_and_metadata(served):
    url, read_key, write_key, images = served
    with Client(url, api_key=write_key, collection="photos") as regis:
        listed = regis.images(filter="album:nasa")
        assert listed.total == 2 and {im.path for im in listed.images} == {"photos/skimage-astronaut.png",
                                                                           "photos/skimage-rocket.jpg"}
        rows = list(regis.iter_images(page_size=2))
        assert [r.id for r in rows] == sorted(r.id for r in rows) and len(rows) >= 4
        assert len(list(regis.iter_images({"album": "nasa"}, page_size=1))) == 2
        rocket = next(r for r in rows if r.path == "photos/skimage-rocket.jpg")
        info = regis.image(rocket.id)
        assert info.metadata["album"] == "nasa" and info.width > 0
        assert regis.image_file(rocket.id) == (images / "photos" / "skimage-rocket.jpg").read_bytes()
        thumb = Image.open(io.BytesIO(regis.thumbnail(rocket.id, 64)))
        assert max(thumb.size) == 64
        patched = regis.update_metadata(rocket.id, {"album": "launch", "year": 2019})
        assert patched.state == "done" and patched.metadata["album"] == "launch"
        assert regis.images(filter={"year": {"gte": 2019}}).total == 1


def test_uploads_deletes_jobs_and_collections(served):
    url, _, write_key, _ = served
    with Client(url, api_key=write_key, collection="photos") as regis:
        png = io.BytesIO()
        Image.new("RGB", (80, 60), "teal").save(png, format="PNG")
        up = regis.upload([png.getvalue()], metadata={"album": "uploads"})
        assert up.state == "done" and up.images[0].status == "added"
        new_id = up.images[0].id
        assert regis.images(filter="album:uploads").total == 1
        gone = regis.delete_image(new_id)
        assert gone.deleted and gone.state == "done"
        job = regis.index_folder("more")
        done = regis.wait_for_job(job.id, timeout_s=240)
        assert done.state == "done" and done.result["added"] == 2, done
        assert job.id in [j.id for j in regis.jobs().jobs]
        created = regis.create_collection("scratch", "vit-tiny-reg4-test", random_init=True)
        assert created.name == "scratch" and created.images == 0
        assert {c.name for c in regis.collections().collections} >= {"photos", "scratch"}
        assert regis.collection_info("photos").images == 6
        regis.delete_collection("scratch")
        with pytest.raises(NotFoundError):
            regis.collection_info("scratch")


def test_the_async_client_does_the_same(served):
    url, read_key, _, images = served

    async def main():
        async with AsyncClient(url, api_key=read_key, collection="photos") as regis:
            a, b = await asyncio.gather(regis.search(images / "photos" / "skimage-coffee.png", k=1),
                                        regis.search(images / "photos" / "skimage-rocket.jpg", k=1))
            rows = [row async for row in regis.iter_images(page_size=2)]
            health = await regis.health()
            with pytest.raises(UnprocessableError):
                await regis.images(filter="albun:x")
            return a, b, rows, health

    a, b, rows, health = asyncio.run(main())
    assert a.results[0].path == "photos/skimage-coffee.png" and b.results[0].path == "photos/skimage-rocket.jpg"
    assert len(rows) >= 4 and health.status == "ok"


def test_create_collection_asks_for_a_layout(served):
    """``create_collection(layout="compact")``, sync and async: the service records it (collection.json,
    ``CollectionInfo.layout``); no layout: "default"; a layout not offered: the 422 as ``UnprocessableError``
    naming layout, nothing created."""
    url, _, write_key, images = served
    root = images.parent / "collections"  # the fixture's collections root
    tiny = {"backbone": "vit-tiny-reg4-test", "random_init": True}

    def recorded(name: str) -> str:
        return json.loads((root / name / "collection.json").read_text())["layout"]

    with Client(url, api_key=write_key) as regis:
        assert regis.create_collection("small", **tiny, layout="compact").layout == "compact"
        assert regis.create_collection("plain", **tiny).layout == "default"
        assert regis.collection_info("small").layout == "compact" and recorded("small") == "compact"
        assert recorded("plain") == "default"
        with pytest.raises(UnprocessableError) as info:
            regis.create_collection("odd", **tiny, layout="tiny")
        assert (info.value.status, info.value.code) == (422, "invalid_request") and "layout" in info.value.message
        assert not (root / "odd").exists()

    async def main():
        async with AsyncClient(url, api_key=write_key) as regis:
            made = await regis.create_collection("asmall", **tiny, layout="compact")
            with pytest.raises(UnprocessableError) as info:
                await regis.create_collection("aodd", **tiny, layout="Compact")
            return made, info.value

    made, refused = asyncio.run(main())
    assert made.layout == "compact" and recorded("asmall") == "compact"
    assert refused.status == 422 and "layout" in refused.message and not (root / "aodd").exists()
    with Client(url, api_key=write_key) as regis:
        for name in ("small", "plain", "asmall"):
            regis.delete_collection(name)


def test_create_collection_asks_for_a_frame_and_query_layout(served):
    """``create_collection(frame=..., query_layout=...)``, sync and async: the service records them
    (collection.json, ``CollectionInfo.config``); a frame not offered: the server's 422 as ``UnprocessableError``
    naming frame, nothing created."""
    url, _, write_key, images = served
    root = images.parent / "collections"  # the fixture's collections root
    tiny = {"backbone": "vit-tiny-reg4-test", "random_init": True}
    asked = {"frame": "center-crop", "query_layout": "tokens"}

    def recorded(name: str) -> dict:
        config = json.loads((root / name / "collection.json").read_text())
        return {"frame": config["frame"], "query_layout": config["query_layout"]}

    with Client(url, api_key=write_key) as regis:
        made = regis.create_collection("framed", **tiny, **asked)
        info = regis.collection_info("framed")
        assert {k: made.config[k] for k in asked} == {k: info.config[k] for k in asked} == asked
        assert recorded("framed") == asked
        plain = regis.create_collection("unframed", **tiny)
        assert (plain.config["frame"], plain.config["query_layout"]) == (None, None)
        with pytest.raises(UnprocessableError) as refused:
            regis.create_collection("oddframe", **tiny, frame="crop")
        assert (refused.value.status, refused.value.code) == (422, "invalid_request")
        assert "frame" in refused.value.message and not (root / "oddframe").exists()

    async def main():
        async with AsyncClient(url, api_key=write_key) as regis:
            made = await regis.create_collection("aframed", **tiny, **asked)
            info = await regis.collection_info("aframed")
            with pytest.raises(UnprocessableError) as refused:
                await regis.create_collection("aoddframe", **tiny, frame="Center-Crop")
            return made, info, refused.value

    made, info, refused = asyncio.run(main())
    assert {k: made.config[k] for k in asked} == {k: info.config[k] for k in asked} == asked
    assert recorded("aframed") == asked
    assert refused.status == 422 and "frame" in refused.message and not (root / "aoddframe").exists()
    with Client(url, api_key=write_key) as regis:
        for name in ("framed", "unframed", "aframed"):
            regis.delete_collection(name)


def test_create_collection_sends_a_layout_only_when_given():
    """Servers from before layouts (or frames) refuse unknown fields: no ``layout``, ``frame`` or ``query_layout``
    key unless one is asked for."""
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(201, json={"name": bodies[-1]["name"], "default": False, "loaded": False,
                                         "index_version": None, "images": 0, "backbone": None})

    with Client("http://regis.test", transport=httpx.MockTransport(handler)) as regis:
        assert regis.create_collection("old").layout == "default"  # an old server's answer has no layout
        regis.create_collection("new", layout="compact")
        regis.create_collection("framed", frame="pad", query_layout="tokens")
    assert not {"layout", "frame", "query_layout"} & set(bodies[0]) and bodies[1]["layout"] == "compact"
    assert "frame" not in bodies[1] and "query_layout" not in bodies[1] and "layout" not in bodies[2]
    assert (bodies[2]["frame"], bodies[2]["query_layout"]) == ("pad", "tokens")


def _flaky(statuses: list[int], body: dict | None = None, headers: dict | None = None):
    """A mock transport answering ``statuses`` in turn (503s with a JSON error), then the collection list."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        status = statuses[min(len(calls) - 1, len(statuses) - 1)]
        if status == 200:
            return httpx.Response(200, json=body or {"collections": []})
        return httpx.Response(status, json={"error": {"code": "index_unavailable", "message": "not yet"}},
                              headers=headers)

    return calls, handler


def test_503_is_retried_with_back_off_then_raised():
    calls, handler = _flaky([503, 503, 200])
    waits: list[float] = []
    with Client("http://regis.test", api_key="k", transport=httpx.MockTransport(handler),
                sleep=waits.append) as regis:
        assert regis.collections().collections == []
    assert waits == [0.5, 1.0] and len(calls) == 3
    assert calls[0].headers["authorization"] == "Bearer k"

    calls, handler = _flaky([503], headers={"Retry-After": "2"})
    waits = []
    with Client("http://regis.test", transport=httpx.MockTransport(handler), sleep=waits.append,
                retries=2) as regis, pytest.raises(UnavailableError) as info:
        regis.collections()
    assert waits == [2.0, 2.0] and len(calls) == 3
    assert (info.value.status, info.value.code, info.value.message) == (503, "index_unavailable", "not yet")

    async def run_async():
        calls, handler = _flaky([503, 200])
        waits = []

        async def sleep(s):
            waits.append(s)

        async with AsyncClient("http://regis.test", transport=httpx.MockTransport(handler), sleep=sleep) as regis:
            await regis.collections()
        return waits, len(calls)

    assert asyncio.run(run_async()) == ([0.5], 2)
    with Client("http://regis.test", transport=httpx.MockTransport(lambda r: httpx.Response(500, text="oops")),
                retries=0) as regis, pytest.raises(Exception) as info:
        regis.health()
    assert info.value.status == 500 and info.value.code == "http_error" and info.value.message == "oops"
