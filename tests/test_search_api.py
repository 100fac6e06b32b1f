"""The search API on real photos (EfficientNet-Lite0): search by id equals search by the image's bytes, batch
search equals one-by-one, offset / score_threshold / filter, unknown parameters refused, image listing and
thumbnails."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.settings import Settings

NAMES = ("skimage-coffee.png", "sklearn-china.jpg", "skimage-rocket.jpg", "matplotlib-grace_hopper.jpg")


@pytest.fixture(scope="module")
def client(lite0_index):
    with TestClient(create_app(Settings(index_dir=lite0_index))) as c:
        yield c


def _search(client, data: bytes, **params):
    r = client.post("/v1/search", files={"file": ("q.img", data)}, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _ids_scores(body):
    return [h["id"] for h in body["results"]], [h["score"] for h in body["results"]]


def test_search_by_id_equals_search_by_the_images_bytes(client, photos_dir):
    """Search by id queries with the image's 10 stored tokens: a search by its bytes with the 10 indexed tokens of
    the query (the default CNN's queries get 5 more, ``query_layout``, which the index does not store)."""
    engine = client.app.state.live.engine
    for name in NAMES:
        data = (photos_dir / name).read_bytes()
        assert _search(client, data, k=1)["results"][0]["path"] == name
        tokens, _ = engine.encode_bytes(data)
        assert tokens.shape[0] == 15
        by_bytes = engine.search_tokens(tokens[:10], k=8, mode="exact")
        image_id = by_bytes["results"][0]["id"]
        assert by_bytes["results"][0]["path"] == name
        r = client.get(f"/v1/images/{image_id}/similar", params={"k": 8, "mode": "exact"})
        assert r.status_code == 200, r.text
        ids, scores = _ids_scores(r.json())
        want_ids, want_scores = _ids_scores(by_bytes)
        assert ids == want_ids
        assert scores == pytest.approx(want_scores, abs=0.02)  # stored tokens are float16
        ann = client.get(f"/v1/images/{image_id}/similar", params={"k": 3}).json()
        assert ann["results"][0]["id"] == image_id and ann["timings_ms"]["encode"] == 0.0
    assert client.get("/v1/images/999999/similar").json()["error"]["code"] == "image_not_found"


def test_batch_search_equals_one_by_one(client, photos_dir):
    datas = [(photos_dir / n).read_bytes() for n in NAMES]
    r = client.post("/v1/search/batch", files=[("files", (f"q{i}", d)) for i, d in enumerate(datas)],
                    params={"k": 5})
    assert r.status_code == 200, r.text
    batch = r.json()["results"]
    assert len(batch) == len(NAMES)
    for data, got in zip(datas, batch, strict=True):
        alone = _search(client, data, k=5)
        assert _ids_scores(got)[0] == _ids_scores(alone)[0]
        assert _ids_scores(got)[1] == pytest.approx(_ids_scores(alone)[1], abs=1e-3)
    bad = client.post("/v1/search/batch", files=[("files", ("a", datas[0])), ("files", ("b", b"not an image"))])
    assert bad.status_code == 400 and "image 2" in bad.json()["error"]["message"]


def test_batch_search_explains_each_query_as_a_single_search_does(client, photos_dir):
    datas = [(photos_dir / n).read_bytes() for n in NAMES[:2]]
    r = client.post("/v1/search/batch", files=[("files", (f"q{i}", d)) for i, d in enumerate(datas)],
                    params={"k": 3, "explain": "true"})
    assert r.status_code == 200, r.text
    batch = r.json()["results"]
    assert len(batch) == 2
    for data, got in zip(datas, batch, strict=True):
        alone = client.post("/v1/search", files={"file": ("q", data)}, params={"k": 3, "explain": "true"}).json()
        assert got["query"] == alone["query"] and len(got["query"]["tokens"]) == 15  # the CNN's query layout
        assert _ids_scores(got)[0] == _ids_scores(alone)[0]
        assert _ids_scores(got)[1] == pytest.approx(_ids_scores(alone)[1], abs=1e-4)
        for g, a in zip(got["results"], alone["results"], strict=True):
            def pairs(hit):
                return [(m["query_token"], m["result_box"]) for m in hit["explanation"]["matches"]]
            assert pairs(g) == pairs(a)
            for mg, ma in zip(g["explanation"]["matches"], a["explanation"]["matches"], strict=True):
                assert mg["similarity"] == pytest.approx(ma["similarity"], abs=1e-4)
                # two ROI tokens on the same buddy patch are the same vector: either may be the best match
                assert mg["result_token"] == ma["result_token"] or mg["result_box"] is not None
            assert g["explanation"]["score"] == pytest.approx(g["score"], abs=1e-4)
    plain = client.post("/v1/search/batch", files=[("files", ("q0", datas[0]))], params={"k": 3}).json()
    assert plain["results"][0].get("query") is None
    bad = client.post("/v1/search/batch", files=[("files", ("a", datas[0])), ("files", ("b", b"not an image"))],
                      params={"explain": "true"})
    assert bad.status_code == 400 and "image 2" in bad.json()["error"]["message"]


def test_offset_threshold_and_filter_on_search(client, photos_dir):
    data = (photos_dir / "skimage-coffee.png").read_bytes()
    full = _search(client, data, k=10, mode="exact")
    page = _search(client, data, k=4, offset=3, mode="exact")
    assert [h["id"] for h in page["results"]] == [h["id"] for h in full["results"][3:7]]
    assert [h["rank"] for h in page["results"]] == [4, 5, 6, 7]
    # Between the 5th and 6th scores: returned scores are rounded, so the 5th score itself may sit a hair above
    # the unrounded one that the threshold is compared with.
    fifth, sixth = full["results"][4]["score"], full["results"][5]["score"]
    assert fifth > sixth
    cut = (fifth + sixth) / 2
    above = _search(client, data, k=10, mode="exact", score_threshold=cut)
    assert [h["id"] for h in above["results"]] == [h["id"] for h in full["results"][:5]]
    jpgs = _search(client, data, k=3, filter='{"file.ext": "jpg"}')
    assert len(jpgs["results"]) == 3 and all(h["path"].endswith(".jpg") for h in jpgs["results"])
    one = _search(client, data, k=5, filter="file.name:sklearn-china.jpg")
    assert [h["path"] for h in one["results"]] == ["sklearn-china.jpg"]


@pytest.mark.parametrize("path, params", [
    ("/v1/images", {"filtr": "a:b"}), ("/v1/images", {"filter": "{bad"}), ("/v1/images/0", {"x": "1"}),
    ("/v1/images", {"filter": '{"a": {"like": 1}}'}), ("/v1/images/0/thumbnail", {"size": 5000}),
])
def test_unknown_or_bad_query_parameters_are_422(client, path, params):
    r = client.get(path, params=params)
    assert r.status_code == 422 and r.json()["error"]["code"] in ("unknown_parameter", "invalid_filter",
                                                                  "invalid_request")


def test_search_refuses_unknown_parameters(client, photos_dir):
    r = client.post("/v1/search", files={"file": ("q", (photos_dir / NAMES[0]).read_bytes())}, params={"top": 3})
    assert r.status_code == 422 and "'top'" in r.json()["error"]["message"]


def test_listing_pages_through_every_image_and_filters(client):
    first = client.get("/v1/images", params={"limit": 8}).json()
    second = client.get("/v1/images", params={"limit": 8, "offset": 8}).json()
    third = client.get("/v1/images", params={"limit": 8, "offset": 16}).json()
    ids = [im["id"] for page in (first, second, third) for im in page["images"]]
    assert first["total"] == 21 and ids == sorted(ids) and len(set(ids)) == 21
    pngs = client.get("/v1/images", params={"filter": '{"file.ext": "png"}', "limit": 100}).json()
    assert pngs["total"] == len(pngs["images"]) > 0 and all(im["path"].endswith(".png") for im in pngs["images"])


def test_thumbnails_are_small_cached_and_revalidated(client, lite0_index):
    r = client.get("/v1/images/0/thumbnail", params={"size": 128})
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert r.headers["cache-control"].startswith("private, max-age=") and r.headers["etag"]
    img = Image.open(io.BytesIO(r.content))
    assert max(img.size) == 128
    again = client.get("/v1/images/0/thumbnail", params={"size": 128}, headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert any((lite0_index / "thumbnails").rglob("*-128.jpg"))
    webp = client.get("/v1/images/0/thumbnail", params={"format": "webp"})
    assert webp.headers["content-type"] == "image/webp" and Image.open(io.BytesIO(webp.content)).format == "WEBP"
