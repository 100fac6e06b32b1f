"""The API docs (/docs: Swagger UI, /redoc: ReDoc) served from the assets bundled in the ``fastapi-offline``
wheel, so they work without internet (FastAPI's defaults load them from a CDN)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/static/docs"


def assets_dir() -> Path:
    """The folder holding swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js and favicon.png."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve /docs, /docs/oauth2-redirect and /redoc with local assets (the app is created with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} API",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS_URL}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc():
        return get_redoc_html(openapi_url=app.openapi_url, title=f"{app.title} API",
                              redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS_URL}/favicon.png", with_google_fonts=False)
