"""API keys on every route (``service.keys``): an ASGI middleware that authenticates, and the write-scope check
the write routes' ``get_jobs`` dependency makes (``require_write``). Errors are the usual JSON body:
401 ``unauthorized`` (missing, unknown or revoked key; with ``WWW-Authenticate: Bearer``), 403 ``forbidden``
(a read key on a write route)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from service.errors import APIError, error_body
from service.keys import KeyRecord, KeyStore

# Open without a key: liveness / readiness probes, the API docs (their pages and assets hold no data) and the
# search page's HTML. Everything under /v1 and /metrics needs a key.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/"})
OPEN_PREFIXES = ("/static/docs/",)


def presented_key(headers) -> str | None:
    """The key of ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


class APIKeyMiddleware:
    """Refuse requests without a valid key (401) on every path but ``OPEN_PATHS``; put the key's record in
    ``request.state.api_key`` for ``require_write``."""

    def __init__(self, app, store: KeyStore):
        self.app = app
        self.store = store

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES) \
                or scope.get("method") == "OPTIONS":  # CORS preflights carry no credentials
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        key = presented_key(request.headers)
        record = self.store.check(key)
        if record is None:
            message = ("an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
                       "(regis keys create)") if not key else "the API key is not valid (unknown or revoked)"
            response = JSONResponse(error_body("unauthorized", message), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = record
        await self.app(scope, receive, send)


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
