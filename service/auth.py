"""API keys on every route (``service.keys``): an ASGI middleware that authenticates and keeps keys limited to
named collections inside them, and the write-scope check the write routes' ``get_jobs`` dependency makes
(``require_write``). Errors are the usual JSON body: 401 ``unauthorized`` (missing, unknown or revoked key; with
``WWW-Authenticate: Bearer``), 403 ``forbidden`` (a read key on a write route, a key used outside its
collections), 503 ``keys_unavailable`` (the keys file has never been readable)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from service.errors import APIError, error_body
from service.keys import KeyRecord, KeyStore, KeysUnavailableError

# Open without a key: liveness / readiness probes, the API docs (their pages and assets hold no data) and the
# search and duplicates pages' HTML and script. Everything under /v1 and /metrics needs a key.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/",
                        "/duplicates", "/duplicates.js"})
OPEN_PREFIXES = ("/static/docs/",)


def presented_key(headers) -> str | None:
    """The key of ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


def collection_of(path: str, default: str) -> str | None:
    """The collection a request path is about: ``NAME`` under ``/v1/collections/NAME``, the default collection
    on the other ``/v1`` routes, None for paths about no one collection (``/v1/collections``, ``/metrics``)."""
    parts = path.split("/")
    if len(parts) < 3 or parts[1] != "v1":
        return None
    if parts[2] == "collections":
        return parts[3] if len(parts) > 3 and parts[3] else None
    return default


def allowed(record: KeyRecord, method: str, path: str, default: str) -> bool:
    """Whether a key may make this request, as far as collections go: an unrestricted key may go anywhere; a key
    limited to collections (``regis keys create --collection NAME``) may use their routes (the default routes when
    the default collection is one of them) and list collections (``GET /v1/collections``, which then shows only
    its own), and nothing else (creating collections, ``/metrics``)."""
    if not record.restricted:
        return True
    collection = collection_of(path, default)
    if collection is not None:
        return record.allows(collection)
    return method in ("GET", "HEAD") and path.rstrip("/") == "/v1/collections"


class APIKeyMiddleware:
    """Refuse requests without a valid key (401) on every path but ``OPEN_PATHS``, and requests outside a limited
    key's collections (403); put the key's record in ``request.state.api_key`` for ``require_write``.

    Args:
        app: the ASGI app.
        store: the keys.
        default_collection: the collection the routes without ``/collections/{name}`` answer for.
    """

    def __init__(self, app, store: KeyStore, default_collection: str = "default"):
        self.app = app
        self.store = store
        self.default_collection = default_collection

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES) \
                or scope.get("method") == "OPTIONS":  # CORS preflights carry no credentials
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        key = presented_key(request.headers)
        try:
            record = self.store.check(key)
        except KeysUnavailableError:
            response = JSONResponse(error_body("keys_unavailable", "the service cannot read its API keys; see its "
                                                                   "log"), status_code=503)
            await response(scope, receive, send)
            return
        if record is None:
            message = ("an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
                       "(regis keys create)") if not key else "the API key is not valid (unknown or revoked)"
            response = JSONResponse(error_body("unauthorized", message), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        if not allowed(record, scope.get("method", "GET"), scope["path"], self.default_collection):
            response = JSONResponse(error_body("forbidden", "this API key is limited to the collections "
                                                            f"{', '.join(record.collections)}"), status_code=403)
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = record
        await self.app(scope, receive, send)


def request_key(request) -> KeyRecord | None:
    """The API key record of an authenticated request (None when keys are off)."""
    return getattr(request.state, "api_key", None)


def require_write(request) -> None:
    """Refuse (403) a request authenticated with a read key, where keys are configured.

    Raises:
        APIError: 403 ``forbidden``.
    """
    if getattr(request.app.state, "keys", None) is None:
        return
    record: KeyRecord | None = getattr(request.state, "api_key", None)
    if record is None or record.scope != "write":
        raise APIError(403, "forbidden", "this route needs an API key with write scope (regis keys create --scope "
                                         "write)")
