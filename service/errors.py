"""JSON error responses: ``{"error": {"code": ..., "message": ...}}``, never an exception's raw text for
unexpected failures."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from regis.errors import (
    ConfigError,
    ImageDecodeError,
    ImageTooLargeError,
    IndexFormatError,
    NotSupportedError,
    UnavailableError,
)
from regis.indexes.filters import UnknownFieldError
from regis.jobs.model import QueueClosedError, QueueUnavailableError

log = logging.getLogger("regis.service")


class APIError(Exception):
    """An error with an HTTP status, a stable machine-readable code and a message for the client (``extra``: more
    fields of the error object, e.g. the ``path`` of a bad JSON value)."""

    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def error_body(code: str, message: str, **extra) -> dict:
    """The JSON body of every error response."""
    return {"error": {"code": code, "message": message, **extra}}


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405: the methods the OpenAPI schema documents for the request's path."""
    import re

    paths = request.app.openapi().get("paths", {})
    path = request.url.path
    matching = [(template.count("{"), item) for template, item in paths.items()
                if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), path)]
    # The most literal template wins, as in routing: /v1/collections/{collection}/jobs/index over
    # /v1/collections/{collection}/jobs/{job_id}.
    fewest = min((n for n, _ in matching), default=0)
    return ", ".join(sorted({m.upper() for n, item in matching if n == fewest for m in item if m in _HTTP_METHODS}))


_HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def install_error_handlers(app: FastAPI) -> None:
    """Map regis and framework exceptions to JSON responses."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return JSONResponse(error_body(exc.code, exc.message, **exc.extra), status_code=exc.status)

    @app.exception_handler(ImageTooLargeError)
    async def _too_large(_: Request, exc: ImageTooLargeError):
        return JSONResponse(error_body("image_too_large", str(exc)), status_code=413)

    @app.exception_handler(ImageDecodeError)
    async def _bad_image(_: Request, exc: ImageDecodeError):
        return JSONResponse(error_body("invalid_image", str(exc)), status_code=400)

    @app.exception_handler(UnknownFieldError)
    async def _unknown_field(_: Request, exc: UnknownFieldError):
        return JSONResponse(error_body("unknown_filter_field", str(exc), fields=exc.fields,
                                       suggestions=exc.suggestions), status_code=422)

    @app.exception_handler(ConfigError)
    async def _bad_param(_: Request, exc: ConfigError):
        return JSONResponse(error_body("invalid_parameter", str(exc)), status_code=422)

    @app.exception_handler(IndexFormatError)
    async def _no_index(_: Request, exc: IndexFormatError):
        log.error("index unavailable: %s", exc)
        return JSONResponse(error_body("index_unavailable", "the index cannot be read"), status_code=503)

    @app.exception_handler(NotSupportedError)
    async def _not_supported(_: Request, exc: NotSupportedError):
        return JSONResponse(error_body("not_supported", str(exc)), status_code=501)

    @app.exception_handler(UnavailableError)
    async def _unavailable(_: Request, exc: UnavailableError):  # a shard or the remote encoder: retry later
        return JSONResponse(error_body(exc.code, str(exc)), status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(QueueClosedError)
    async def _queue_closed(_: Request, exc: QueueClosedError):  # a deleted collection's queue, or shutting down
        if exc.code == "collection_deleted":
            return JSONResponse(error_body("collection_not_found", str(exc)), status_code=404)
        return JSONResponse(error_body("queue_unavailable", str(exc)), status_code=503)

    @app.exception_handler(QueueUnavailableError)
    async def _queue_down(_: Request, exc: QueueUnavailableError):
        return JSONResponse(error_body("queue_unavailable", str(exc)), status_code=503)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        details = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")} for e in exc.errors()
        ]
        message = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
        return JSONResponse(error_body("invalid_request", message, details=details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's answer to a JSON body that does not parse: a request error like any other (422).
            return JSONResponse(error_body("invalid_request", "the request body is not valid JSON"),
                                status_code=422)
        code = getattr(exc, "code", None) or {404: "not_found", 405: "method_not_allowed",
                                              413: "payload_too_large"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # RFC 9110: say every method the path allows, not only the first route's
            headers["Allow"] = allowed_methods(request)
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal", "internal server error"), status_code=500)
