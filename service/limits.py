"""Request body limits, enforced by the framework while the body streams in (Starlette's
``RequestBodyLimitMiddleware`` through FastAPI's ``max_body_size``): a request over its limit gets 413 as soon
as its declared length or the bytes received so far pass the limit, before the multipart parser spools the
rest to a temporary file."""

from __future__ import annotations

MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers of one file, bytes
MAX_METADATA_BYTES = 64 * 1024  # the ``metadata`` form field of POST /v1/images, bytes
DEFAULT_BODY_BYTES = 1024 * 1024  # JSON bodies (POST /v1/jobs/index) and anything else, bytes


def body_limits(settings) -> dict[str, int]:
    """Largest request body, bytes, per route group: ``search`` (one image), ``images`` (an upload batch) and
    ``default`` (the JSON body of POST /v1/jobs/index; the other routes take no body)."""
    per_file = settings.max_upload_bytes + MULTIPART_OVERHEAD
    return {
        "search": per_file,
        "images": settings.max_upload_files * per_file + MAX_METADATA_BYTES,
        "default": DEFAULT_BODY_BYTES,
    }


class JSONTooLargeMiddleware:
    """Give the framework's plain-text 413 (a declared ``Content-Length`` over the limit) the JSON error body
    every other error has (``service.errors``)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rewriting = False

        async def send_json(message):
            nonlocal rewriting
            if message["type"] == "http.response.start" and message["status"] == 413:
                headers = dict(message.get("headers") or [])
                if headers.get(b"content-type", b"").startswith(b"text/plain"):
                    rewriting = True
                    await send({"type": "http.response.start", "status": 413,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(_TOO_LARGE)).encode())]})
                    return
            if rewriting:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": _TOO_LARGE})
                return
            await send(message)

        await self.app(scope, receive, send_json)


_TOO_LARGE = (b'{"error":{"code":"payload_too_large","message":"the request body is larger than this endpoint '
              b'accepts"}}')
