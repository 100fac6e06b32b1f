"""The REST API on real photos, bad uploads included; the server keeps serving after every error."""

import io

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from regis.data.augment import edit_mixed
from service.app import create_app
from service.settings import Settings


@pytest.fixture(scope="module")
def client(lite0_index):
    app = create_app(Settings(index_dir=lite0_index, max_upload_bytes=2_000_000, max_pixels=20_000_000))
    with TestClient(app) as c:
        yield c


def _upload(data: bytes, name="q.jpg"):
    return {"file": (name, data, "application/octet-stream")}


def test_augmented_copy_finds_its_original_first(client, photos_dir):
    rng = np.random.default_rng(0)
    for name in ("skimage-chelsea.png", "skimage-rocket.jpg", "sklearn-china.jpg", "matplotlib-grace_hopper.jpg"):
        query = edit_mixed(Image.open(photos_dir / name).convert("RGB"), rng)
        r = client.post("/v1/search", files=_upload(query), params={"k": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["results"][0]["path"] == name
        assert [h["rank"] for h in body["results"]] == [1, 2, 3, 4, 5]
        scores = [h["score"] for h in body["results"]]
        assert scores == sorted(scores, reverse=True) and scores[0] <= 15.0 + 1e-3  # one per query token
        assert set(body["timings_ms"]) == {"decode", "encode", "candidates", "rerank", "total"}
        assert body["index_version"] == 1


def test_exact_mode_agrees_on_the_top_result(client, photos_dir):
    data = (photos_dir / "skimage-coffee.png").read_bytes()
    ann = client.post("/v1/search", files=_upload(data, "q.png"), params={"k": 3}).json()
    exact = client.post("/v1/search", files=_upload(data, "q.png"), params={"k": 3, "mode": "exact"}).json()
    assert exact["num_candidates"] == 21
    assert ann["results"][0]["id"] == exact["results"][0]["id"]
    assert ann["results"][0]["score"] == pytest.approx(exact["results"][0]["score"], abs=1e-4)


@pytest.mark.parametrize("mode", ["ann", "exact"])
def test_search_score_is_maxsim_of_the_15_query_tokens_over_the_stored_10(client, lite0_index, lite0_encoder,
                                                                           photos_dir, mode):
    """The default encoder's queries get 15 tokens (``query_layout``: the 10 indexed ones plus the 5 cues of its
    160 px ROI pass) and the index stores 10 per image: every score is MaxSim of those 15 over the stored 10."""
    import torch

    from regis.images.decode import decode_image
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.transforms import eval_transform

    data = (photos_dir / "skimage-coffee.png").read_bytes()
    body = client.post("/v1/search", files=_upload(data, "q.png"), params={"k": 5, "mode": mode}).json()
    pixels = eval_transform(lite0_encoder.config)(decode_image(data).image)
    query = lite0_encoder.encode_query(pixels[None])[0].numpy()
    assert query.shape == (15, 1280)
    snap = IndexSnapshot.open(lite0_index)
    try:
        assert snap.manifest.tokens_per_image == 10 and snap.manifest.encoder.query_layout == "tokens+roi-cues"
        docs = snap.store.get(np.array([h["id"] for h in body["results"]])).astype(np.float32)
    finally:
        snap.close()
    want = np.einsum("md,nkd->nmk", query, docs).max(axis=2).sum(axis=1)
    got = np.array([h["score"] for h in body["results"]])
    np.testing.assert_allclose(got, want, atol=2e-3)  # the service encodes with the inference copy
    # the photo itself: its 10 indexed tokens match themselves (10.0), the 5 others add their best cosines
    assert body["results"][0]["path"] == "skimage-coffee.png" and 10.0 < got[0] < 15.0
    assert got[0] == pytest.approx(10.0 + float(torch.tensor(query[10:] @ docs[0].T).max(1).values.sum()),
                                   abs=2e-3)


def _png(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "payload, status, code",
    [
        (b"", 400, "invalid_image"),
        (b"GIF89a but not really", 400, "invalid_image"),
        (b"%PDF-1.4 a document", 400, "invalid_image"),
        (None, 400, "invalid_image"),  # truncated JPEG, filled in below
        ("bomb", 413, "image_too_large"),
        (b"\xff" * 2_100_000, 413, "payload_too_large"),
    ],
)
def test_bad_uploads_get_json_errors_and_the_server_keeps_serving(client, photos_dir, payload, status, code):
    if payload is None:
        full = (photos_dir / "sklearn-flower.jpg").read_bytes()
        payload = full[: len(full) // 2]
    elif payload == "bomb":
        payload = _png(Image.new("L", (6000, 6000)))  # 36 Mpx in a few kB
    r = client.post("/v1/search", files=_upload(payload))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert "Traceback" not in r.text
    ok = client.post("/v1/search", files=_upload((photos_dir / "skimage-moon.png").read_bytes(), "m.png"))
    assert ok.status_code == 200 and ok.json()["results"][0]["path"] == "skimage-moon.png"


def test_missing_file_and_bad_parameters(client, photos_dir):
    r = client.post("/v1/search")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    data = (photos_dir / "skimage-moon.png").read_bytes()
    for params in ({"k": 0}, {"k": 5000}, {"depth": 0}, {"mode": "fuzzy"}, {"k": "ten"}):
        r = client.post("/v1/search", files=_upload(data), params=params)
        assert r.status_code == 422, params
        assert r.json()["error"]["message"]
    r = client.post("/v1/search", files=_upload(data), params={"k": 500})  # over max_k = 100
    assert r.status_code == 422 and "k must be" in r.json()["error"]["message"]


def test_every_search_route_checks_k_and_depth_against_the_settings(client, photos_dir):
    data = (photos_dir / "skimage-moon.png").read_bytes()
    routes = {"search": lambda p: client.post("/v1/search", files=_upload(data), params=p),
              "batch": lambda p: client.post("/v1/search/batch", files={"files": ("q.png", data)}, params=p),
              "similar": lambda p: client.get("/v1/images/0/similar", params=p)}
    for name, send in routes.items():  # max_k = 100, max_depth = 1024 (the defaults); k is checked first
        for params, message in (({"k": 500}, "k must be <= 100"), ({"depth": 2000}, "depth must be <= 1024"),
                                ({"k": 500, "depth": 2000}, "k must be <= 100")):
            r = send(params)
            assert r.status_code == 422, (name, params, r.text)
            assert r.json()["error"]["code"] == "invalid_parameter", (name, params)
            assert r.json()["error"]["message"] == message, (name, params)
        assert send({"k": 100, "depth": 1024}).status_code == 200, name


def test_image_metadata_and_file(client, photos_dir):
    hit = client.post("/v1/search", files=_upload((photos_dir / "skimage-astronaut.png").read_bytes())).json()
    image_id = hit["results"][0]["id"]
    info = client.get(f"/v1/images/{image_id}").json()
    assert info["path"] == "skimage-astronaut.png" and (info["width"], info["height"]) == (512, 512)
    assert len(info["sha256"]) == 64 and info["bytes"] == (photos_dir / "skimage-astronaut.png").stat().st_size
    f = client.get(f"/v1/images/{image_id}/file")
    assert f.status_code == 200 and f.headers["content-type"] == "image/png"
    assert f.content == (photos_dir / "skimage-astronaut.png").read_bytes()
    missing = client.get("/v1/images/99999")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "image_not_found"
    assert client.get("/v1/images/abc").status_code == 422
    assert client.get("/v1/images/99999/file").status_code == 404


def test_health_openapi_and_home_page(client):
    h = client.get("/healthz").json()
    assert h == {"status": "ok", "index_version": 1, "images": 21, "backbone": "efficientnet-lite0"}
    spec = client.get("/openapi.json").json()
    assert {"/v1/search", "/v1/images/{image_id}", "/v1/images/{image_id}/file", "/healthz"} <= set(spec["paths"])
    assert client.get("/docs").status_code == 200
    home = client.get("/")
    assert home.status_code == 200 and "/v1/search" in home.text
    assert client.get("/nope").json()["error"]["code"] == "not_found"


def test_settings_refuse_bad_values(tmp_path):
    from pydantic import ValidationError

    for bad in ({"default_k": 0}, {"device": "tpu"}, {"max_k": 5, "default_k": 10}, {"max_upload_bytes": 1}):
        with pytest.raises(ValidationError):
            Settings(index_dir=tmp_path, **bad)


def test_service_refuses_an_index_of_another_encoder(tmp_path, photos_dir, tiny_encoder):
    from safetensors.torch import save_file

    from conftest import build
    from regis.errors import IndexFormatError, IndexMismatchError
    from regis.models.encoder import build_encoder

    build(photos_dir, tmp_path / "index", tiny_encoder)
    other = build_encoder("vit-tiny-reg4-test", random_init=True, seed=7)
    weights = tmp_path / "other.safetensors"
    save_file({k: v.contiguous() for k, v in other.backbone.state_dict().items()}, str(weights))
    with pytest.raises(IndexMismatchError, match="differ"):
        with TestClient(create_app(Settings(index_dir=tmp_path / "index", weights=weights))):
            pass
    with pytest.raises(IndexFormatError, match="no index"):
        with TestClient(create_app(Settings(index_dir=tmp_path))):
            pass
