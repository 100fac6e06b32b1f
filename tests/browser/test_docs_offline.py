"""/docs (Swagger UI) and /redoc render in a real headless Chromium with every request outside the server
blocked: their assets come from the fastapi-offline wheel, not a CDN."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deploy.support import ServerThread

from service.app import create_app
from service.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(index_dir=tmp_path_factory.mktemp("docs") / "index")
    with ServerThread(create_app(settings, load=False)) as srv:
        yield srv


def _offline_page(browser, base_url: str):
    """A page whose requests outside ``base_url`` are aborted (and recorded), as on a machine without internet."""
    page = browser.new_page()
    outside: list[str] = []

    def route(r):
        if r.request.url.startswith(base_url):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return page, outside


def test_swagger_ui_renders_offline(browser, server):
    page, outside = _offline_page(browser, server.url)
    page.goto(f"{server.url}/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/search" in paths and "/v1/collections/{collection}/images" in paths
    assert page.locator(".info .title").inner_text().startswith("regis")
    if os.environ.get("REGIS_SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(os.environ["REGIS_SCREENSHOT_DIR"]) / "docs-offline.png"))
    assert outside == []
    page.close()


def test_redoc_renders_offline(browser, server):
    page, outside = _offline_page(browser, server.url)
    page.goto(f"{server.url}/redoc")
    page.wait_for_selector("[data-section-id]", timeout=30_000)  # ReDoc's rendered operation sections
    if os.environ.get("REGIS_SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(os.environ["REGIS_SCREENSHOT_DIR"]) / "redoc-offline.png"))
    text = page.inner_text("body")
    assert "Download OpenAPI specification" in text and "collections" in text and "Healthz" in text, text[:2000]
    # ReDoc's footer ("API docs by Redocly") links its logo from cdn.redoc.ly; nothing else may leave the server
    assert [u for u in outside if not u.startswith("https://cdn.redoc.ly/redoc/logo")] == []
    page.close()
