"""What a client without a key (or with a limited one) can reach or grow (issue 27, items 6, 10, 12, 13): invented
HTTP methods no longer add /metrics label values, a half-written keys file no longer answers 500, /healthz says
only "ok" without a key, writes from another site's page are refused when keys are off, and keys can be limited
to named collections. Each test failed on the code before its fix."""

from __future__ import annotations

import io

import pytest
from deploy.support import TINY
from fastapi.testclient import TestClient
from PIL import Image

from regis.indexes.collections import CollectionConfig, CollectionsRoot
from service.app import create_app
from service.keys import create_key
from service.settings import Settings


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="PNG")
    return buf.getvalue()


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_invented_methods_do_not_grow_the_metrics(tmp_path):
    """5,000 invented methods used to make 5,000 label values (13.8 MB of /metrics); now they count as "other"."""
    with TestClient(create_app(Settings(index_dir=tmp_path / "none"), load=False)) as c:
        for i in range(300):
            assert c.request(f"X{i}", "/v1/images" if i % 2 else "/nope").status_code in (404, 405)
        text = c.get("/metrics").text
    methods = {line.split('method="', 1)[1].split('"', 1)[0] for line in text.splitlines() if 'method="' in line}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}, methods
    assert "other" in methods and len(text) < 20_000


@pytest.fixture
def keyed(tmp_path):
    keys = tmp_path / "keys.json"
    key, _ = create_key(keys, "read", "probe")
    app = create_app(Settings(index_dir=tmp_path / "none", api_keys_file=keys), load=False)
    with TestClient(app) as c:
        yield c, keys, key


def test_a_half_written_keys_file_keeps_the_keys_read_before(keyed):
    c, keys, key = keyed
    assert c.get("/metrics", headers=_bearer(key)).status_code == 200
    good = keys.read_text()
    keys.write_text('{"keys": [')  # half-written
    assert c.get("/metrics", headers=_bearer(key)).status_code == 200  # was 500
    assert c.get("/metrics", headers=_bearer("regis_00000000_x")).status_code == 401
    assert c.get("/metrics").status_code == 401
    keys.write_text(good)
    newer, _ = create_key(keys, "read")  # a fixed file is read again
    assert c.get("/metrics", headers=_bearer(newer)).status_code == 200


def test_a_keys_file_never_read_refuses_with_503_not_500(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_bytes(b'{"keys": [\xff')
    with TestClient(create_app(Settings(index_dir=tmp_path / "none", api_keys_file=keys), load=False)) as c:
        r = c.get("/metrics", headers=_bearer("regis_00000000_x"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "keys_unavailable", r.text
        assert c.get("/healthz").json() == {"status": "ok"}


def test_healthz_says_only_ok_without_a_key(tmp_path, lite0_index):
    keys = tmp_path / "keys.json"
    key, _ = create_key(keys, "read")
    with TestClient(create_app(Settings(index_dir=lite0_index, api_keys_file=keys))) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/healthz", headers=_bearer("regis_00000000_x")).json() == {"status": "ok"}
        full = c.get("/healthz", headers=_bearer(key)).json()
        assert full["images"] == 21 and full["index_version"] >= 1 and full["backbone"] == "efficientnet-lite0"
        assert c.get("/readyz").status_code == 200  # readiness stays open for orchestrators


@pytest.fixture(scope="module")
def open_service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("csrf")
    (tmp / "images").mkdir()
    settings = Settings(index_dir=tmp / "index", images_root=tmp / "images", enable_jobs=True,
                        cors_origins=["https://app.example"], **TINY)
    with TestClient(create_app(settings)) as c:
        c.uploads = tmp / "images" / ".uploads"
        yield c


@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"}, {"Origin": "null"},
                                     {"Origin": "http://testserver.evil.example"},
                                     {"Origin": "https://testserver"},  # another scheme is another origin
                                     {"Sec-Fetch-Site": "cross-site"}])
def test_a_cross_origin_form_upload_is_refused_when_keys_are_off(open_service, headers):
    """An HTML form on another site posting to a keyless regis (multipart, no preflight) used to get 201."""
    c = open_service
    before = c.get("/v1/images").json()["total"] if c.get("/v1/images").status_code == 200 else 0
    r = c.post("/v1/images", files=[("files", ("x.png", _png("purple")))], headers=headers)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin_refused", r.text
    for method, path in [("DELETE", "/v1/images/0"), ("PATCH", "/v1/images/0"), ("POST", "/v1/jobs/index")]:
        assert c.request(method, path, json={}, headers=headers).status_code == 403, (method, path)
    after = c.get("/v1/images").json()["total"] if c.get("/v1/images").status_code == 200 else 0
    assert after == before
    assert c.get("/healthz", headers=headers).status_code == 200  # reads stay open


@pytest.mark.parametrize("headers", [{}, {"Origin": "http://testserver"}, {"Origin": "https://app.example"},
                                     {"Sec-Fetch-Site": "same-origin"}])
def test_writes_from_the_service_s_own_pages_allowed_origins_and_non_browsers_pass(open_service, headers):
    c = open_service
    color = ["red", "green", "blue", "white"][len(headers) + (2 if "app" in str(headers) else 0)]
    r = c.post("/v1/images", files=[("files", (f"{color}.png", _png(color)))], headers=headers)
    assert r.status_code == 201, r.text


@pytest.fixture
def two_collections(tmp_path):
    root = CollectionsRoot(tmp_path / "collections")
    for name in ("shoes", "hats"):
        root.create(name, CollectionConfig(backbone="vit-tiny-reg4-test", random_init=True))
    keys = tmp_path / "keys.json"
    shoes_key, record = create_key(keys, "write", "shoe shop", collections=["shoes"])
    admin_key, _ = create_key(keys, "write", "ops")
    settings = Settings(collections_root=root.root, api_keys_file=keys, enable_jobs=True, **TINY)
    with TestClient(create_app(settings)) as c:
        yield c, shoes_key, admin_key, record


def test_a_key_limited_to_a_collection_reaches_that_collection_only(two_collections):
    c, shoes, admin, record = two_collections
    assert record.collections == ["shoes"]
    r = c.post("/v1/collections/shoes/images", files=[("files", ("s.png", _png("red")))], headers=_bearer(shoes))
    assert r.status_code == 201, r.text
    assert c.get("/v1/collections/shoes/images", headers=_bearer(shoes)).json()["total"] == 1
    assert c.get("/v1/collections/shoes", headers=_bearer(shoes)).status_code == 200
    names = [x["name"] for x in c.get("/v1/collections", headers=_bearer(shoes)).json()["collections"]]
    assert names == ["shoes"]
    for method, path in [("GET", "/v1/collections/hats/images"), ("POST", "/v1/collections/hats/images"),
                         ("DELETE", "/v1/collections/hats"), ("GET", "/v1/images"), ("GET", "/v1/jobs"),
                         ("POST", "/v1/collections"), ("GET", "/metrics"), ("GET", "/v1/collections/hats")]:
        r = c.request(method, path, headers=_bearer(shoes))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path, r.text)
    all_names = [x["name"] for x in c.get("/v1/collections", headers=_bearer(admin)).json()["collections"]]
    assert all_names == ["default", "hats", "shoes"]
    assert c.get("/v1/collections/hats/images", headers=_bearer(admin)).status_code == 200  # empty: 200 (issue 27)


def test_regis_keys_create_takes_collections(tmp_path):
    from typer.testing import CliRunner

    from cli import app
    from service.keys import read_keys

    keys = tmp_path / "keys.json"
    r = CliRunner().invoke(app, ["keys", "create", "--scope", "write", "--collection", "shoes", "--collection",
                                 "hats", "--file", str(keys)])
    assert r.exit_code == 0, r.output
    assert read_keys(keys).keys[0].collections == ["hats", "shoes"]
    listed = CliRunner().invoke(app, ["keys", "list", "--file", str(keys)])
    assert "collections hats,shoes" in listed.output
    bad = CliRunner().invoke(app, ["keys", "create", "--collection", "../x", "--file", str(keys)])
    assert bad.exit_code != 0
