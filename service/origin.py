"""Cross-site request forgery guard for a service without API keys.

With keys off, a web page on any site could make a visitor's browser POST an HTML form to a regis on their
machine or network (``<form action="http://127.0.0.1:8000/v1/images" method="post" enctype="multipart/form-data">``
needs no CORS preflight): the upload, delete or job would run (issue 27, item 10). Browsers send ``Origin`` with
every such request, so a write (any method but GET, HEAD and OPTIONS) whose ``Origin`` is neither the service's
own (the scheme and ``Host`` of the request) nor one of ``REGIS_CORS_ORIGINS`` is refused with 403
``cross_origin_refused``; so is ``Origin: null`` (sandboxed frames, ``file:`` pages) and, without ``Origin``,
``Sec-Fetch-Site: cross-site``. Clients outside a browser (curl, the Python client) send no ``Origin`` and pass.
With keys on there is nothing to forge: a form cannot set the ``Authorization`` header.

Behind a proxy that rewrites ``Host``, add the public origin to ``REGIS_CORS_ORIGINS``.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from service.errors import error_body

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def same_origin(origin: str, scope) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) is the origin the request was sent to."""
    host = Headers(scope=scope).get("host")
    return host is not None and origin.lower() == f"{scope.get('scheme', 'http')}://{host}".lower()


class OriginCheckMiddleware:
    """Refuse (403) writes from a browser page of another origin (module docstring).

    Args:
        app: the ASGI app.
        allowed: origins besides the service's own that may write (``REGIS_CORS_ORIGINS``).
    """

    def __init__(self, app, allowed: list[str]):
        self.app = app
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method", "GET") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            refused = headers.get("sec-fetch-site") == "cross-site"
        else:
            refused = origin == "null" or not (origin.rstrip("/").lower() in self.allowed
                                               or same_origin(origin, scope))
        if not refused:
            await self.app(scope, receive, send)
            return
        shown = (origin or "another site")[:100]
        response = JSONResponse(error_body(
            "cross_origin_refused", f"a write from {shown!r} is refused: this service takes writes from its own "
                                    "pages, from REGIS_CORS_ORIGINS, and from clients outside a browser (or turn on "
                                    "API keys)"), status_code=403)
        await response(scope, receive, send)
