"""API keys over HTTP: missing -> 401, a read key on a write route -> 403, a revoked key stops working at once;
keys are stored hashed; `regis keys` creates, lists and revokes them."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.keys import create_key, read_keys, revoke_key
from service.settings import Settings


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, lite0_index):
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    read_key, _ = create_key(keys_file, "read", "search page")
    write_key, write_rec = create_key(keys_file, "write", "ops")
    settings = Settings(index_dir=lite0_index, api_keys_file=keys_file, cors_origins=["https://app.example"])
    with TestClient(create_app(settings)) as c:
        yield c, keys_file, read_key, write_key, write_rec


def _bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_every_data_route_needs_a_key(keyed, photos_dir):
    c, _, read_key, _, _ = keyed
    coffee = (photos_dir / "skimage-coffee.png").read_bytes()
    for method, path in [("GET", "/v1/images/0"), ("GET", "/v1/images"), ("GET", "/v1/collections"),
                         ("GET", "/v1/collections/default/images/0/thumbnail"), ("GET", "/metrics"),
                         ("DELETE", "/v1/images/0"), ("GET", "/v1/jobs")]:
        r = c.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (method, path)
        assert r.headers["www-authenticate"] == "Bearer"
    r = c.post("/v1/search", files={"file": ("q.png", coffee)})
    assert r.status_code == 401
    r = c.get("/v1/images/0", headers=_bearer("regis_00000000_not-a-key"))
    assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
    assert c.post("/v1/search", files={"file": ("q.png", coffee)}, headers=_bearer(read_key)).status_code == 200
    assert c.get("/v1/images/0", headers={"X-API-Key": read_key}).status_code == 200
    for open_path in ("/healthz", "/openapi.json", "/docs"):
        assert c.get(open_path).status_code == 200, open_path


def test_a_read_key_on_a_write_route_is_403(keyed):
    c, _, read_key, write_key, _ = keyed
    for method, path, body in [("DELETE", "/v1/images/0", None), ("POST", "/v1/jobs/index", {"folder": "x"}),
                               ("PATCH", "/v1/images/0", {"metadata": {"a": 1}}), ("GET", "/v1/jobs", None),
                               ("POST", "/v1/collections", {"name": "x"}), ("DELETE", "/v1/collections/x", None)]:
        r = c.request(method, path, json=body, headers=_bearer(read_key))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path, r.text)
    # a write key passes the key check (this read-only service then says it takes no jobs)
    r = c.get("/v1/jobs", headers=_bearer(write_key))
    assert r.status_code == 403 and r.json()["error"]["code"] == "jobs_disabled"


def test_a_revoked_key_stops_working_and_keys_are_stored_hashed(keyed):
    c, keys_file, read_key, write_key, write_rec = keyed
    text = keys_file.read_text()
    assert read_key not in text and write_key not in text and (keys_file.stat().st_mode & 0o777) == 0o600
    assert c.get("/v1/images/0", headers=_bearer(write_key)).status_code == 200
    revoke_key(keys_file, write_rec.id)
    r = c.get("/v1/images/0", headers=_bearer(write_key))
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert c.get("/v1/images/0", headers=_bearer(read_key)).status_code == 200  # the other key still works
    assert [k.revoked_at is not None for k in read_keys(keys_file).keys] == [False, True]


def test_cors_is_off_unless_configured(keyed, lite0_index):
    c = keyed[0]
    r = c.options("/v1/images/0", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"})
    assert r.headers.get("access-control-allow-origin") == "https://app.example"
    r = c.options("/v1/images/0", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers
    with TestClient(create_app(Settings(index_dir=lite0_index))) as plain:
        r = plain.get("/v1/images/0", headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_regis_keys_cli(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    keys_file = tmp_path / "k.json"
    out = runner.invoke(app, ["keys", "create", "--scope", "write", "--name", "ci", "--file", str(keys_file)])
    assert out.exit_code == 0, out.output
    key = out.stdout.strip().splitlines()[0]
    assert key.startswith("regis_") and key not in keys_file.read_text()
    key_id = json.loads(keys_file.read_text())["keys"][0]["id"]
    listed = runner.invoke(app, ["keys", "list", "--file", str(keys_file)]).stdout
    assert key_id in listed and "write" in listed and "active" in listed
    assert runner.invoke(app, ["keys", "revoke", key_id, "--file", str(keys_file)]).exit_code == 0
    assert "revoked" in runner.invoke(app, ["keys", "list", "--file", str(keys_file)]).stdout
