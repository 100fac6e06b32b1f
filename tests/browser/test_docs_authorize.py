"""The API keys in the OpenAPI document (issue 25, item 8): bearer and X-API-Key security schemes, required on
every route that needs a key (not on the probes, the docs or the pages); Swagger UI's "Authorize" takes a key and
"Try it out" then gets 200 where it got 401."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deploy.support import ServerThread
from fastapi.testclient import TestClient

from service.app import create_app
from service.keys import create_key
from service.openapi_security import API_KEY_HEADER, BEARER
from service.settings import Settings
from tests.conftest import build


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, photos_dir, tiny_encoder):
    tmp = tmp_path_factory.mktemp("authorize")
    folder = tmp / "photos"
    folder.mkdir()
    (folder / "coffee.png").write_bytes((photos_dir / "skimage-coffee.png").read_bytes())
    build(folder, tmp / "index", tiny_encoder)
    key, _ = create_key(tmp / "keys.json", "read", "docs test")
    return Settings(index_dir=tmp / "index", api_keys_file=tmp / "keys.json"), key


def test_the_openapi_document_declares_the_keys_where_they_are_needed(keyed):
    settings, _ = keyed
    with TestClient(create_app(settings, load=False)) as client:
        schema = client.get("/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes[BEARER] == {**schemes[BEARER], "type": "http", "scheme": "bearer"}
    assert schemes[API_KEY_HEADER] == {**schemes[API_KEY_HEADER], "type": "apiKey", "in": "header",
                                       "name": "X-API-Key"}
    operations = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]
    assert len(operations) > 20
    for path, method, op in operations:
        if path in ("/healthz", "/readyz"):
            assert "security" not in op, path
        else:
            assert op["security"] == [{BEARER: []}, {API_KEY_HEADER: []}], (method, path)
            assert "401" in op["responses"], (method, path)
    with TestClient(create_app(settings.model_copy(update={"api_keys_file": None}), load=False)) as client:
        open_schema = client.get("/openapi.json").json()
    assert set(open_schema["components"]["securitySchemes"]) == {BEARER, API_KEY_HEADER}  # Authorize still offered
    assert not any("security" in op for item in open_schema["paths"].values() for op in item.values())


@pytest.mark.slow
@pytest.mark.heavy  # a browser over its own server: 6.1 s of make test at load 5.6-7.5 (make test-heavy runs it)
def test_swagger_ui_authorize_makes_try_it_out_work(browser, keyed):
    settings, key = keyed
    with ServerThread(create_app(settings)) as server:
        page = browser.new_page()
        page.goto(f"{server.url}/docs")
        page.wait_for_selector(".opblock", timeout=30_000)

        def try_list_collections() -> str:
            block = page.locator(".opblock-get", has=page.locator('[data-path="/v1/collections"]')).first
            if not block.locator(".try-out__btn").count():
                block.locator(".opblock-summary").click()
            if block.locator(".try-out__btn", has_text="Try it out").count():
                block.locator(".try-out__btn").click()
            block.locator(".execute").click()
            status = block.locator(".live-responses-table tr.response .response-col_status").first
            status.wait_for(timeout=30_000)
            return status.inner_text().strip()

        assert try_list_collections().startswith("401")
        page.locator(".auth-wrapper .authorize").click()
        dialog = page.locator(".dialog-ux")
        dialog.wait_for()
        assert "X-API-Key" in dialog.inner_text() and "bearer" in dialog.inner_text().lower()
        form = dialog.locator(".auth-container", has_text="X-API-Key")
        form.locator("input").fill(key)
        form.locator("button.authorize").click()
        if os.environ.get("REGIS_SCREENSHOT_DIR"):
            page.screenshot(path=str(Path(os.environ["REGIS_SCREENSHOT_DIR"]) / "docs-authorize.png"))
        dialog.locator("button.btn-done").first.click()
        page.locator(".opblock-get", has=page.locator('[data-path="/v1/collections"]')).first.locator(
            ".btn-clear").click()
        assert try_list_collections().startswith("200")
        page.close()
