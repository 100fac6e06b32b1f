"""The API keys in the OpenAPI document: ``securitySchemes`` for ``Authorization: Bearer <key>`` and ``X-API-Key``,
and, when the service requires keys, a ``security`` requirement (either scheme) and the 401 answer on every
operation that needs one. Keys are checked by ``service.auth.APIKeyMiddleware``; this only describes them, so
that Swagger UI offers "Authorize" and generated clients know where the key goes."""

from __future__ import annotations

from fastapi import FastAPI

from service.auth import OPEN_PATHS, OPEN_PREFIXES

BEARER = "bearerAuth"
API_KEY_HEADER = "apiKeyHeader"
SCHEMES = {
    BEARER: {"type": "http", "scheme": "bearer", "bearerFormat": "regis_<id>_<secret>",
             "description": "An API key (regis keys create) as `Authorization: Bearer <key>`."},
    API_KEY_HEADER: {"type": "apiKey", "in": "header", "name": "X-API-Key",
                     "description": "The same key in the `X-API-Key` header."},
}
REQUIREMENT = [{BEARER: []}, {API_KEY_HEADER: []}]  # either one
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def needs_key(path: str) -> bool:
    """Whether requests to ``path`` (an OpenAPI path template) need a key when keys are on."""
    return path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES)


def add_security(schema: dict, keys_required: bool) -> dict:
    """``schema`` (an OpenAPI document) with the key schemes declared and, if ``keys_required``, required (with
    a 401 response) on every operation of a path that ``needs_key``. Changes and returns ``schema``."""
    schema.setdefault("components", {}).setdefault("securitySchemes", {}).update(SCHEMES)
    if not keys_required:
        return schema
    for path, item in schema.get("paths", {}).items():
        if not needs_key(path):
            continue
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            operation["security"] = REQUIREMENT
            operation.setdefault("responses", {}).setdefault("401", {
                "description": "No valid API key (missing, unknown or revoked)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
    return schema


def install_security(app: FastAPI, keys_required: bool) -> None:
    """Make ``app.openapi()`` declare the API keys (``add_security``); built once, then cached as FastAPI does."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = add_security(build(), keys_required)
        return app.openapi_schema

    app.openapi = openapi
