"""The exceptions of ``regis.client``: one per kind of HTTP error, each carrying the service's JSON error
(``{"error": {"code", "message", ...}}``)."""

from __future__ import annotations


class RegisAPIError(Exception):
    """The service answered with an error.

    Attributes:
        status: the HTTP status (e.g. 422).
        code: the service's machine-readable code (e.g. "unknown_filter_field"; "http_error" when the body is not
            regis's JSON error).
        message: the service's message for people.
        body: the whole JSON body ({} when there was none), e.g. ``body["error"]["suggestions"]``.
        details: the error object without code and message (e.g. {"fields": [...], "suggestions": [...]}).
    """

    def __init__(self, status: int, code: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body or {}
        error = self.body.get("error") if isinstance(self.body.get("error"), dict) else {}
        self.details = {k: v for k, v in error.items() if k not in ("code", "message")}


class BadRequestError(RegisAPIError):
    """400: the request could not be used (e.g. ``invalid_image``: not a decodable image)."""


class AuthenticationError(RegisAPIError):
    """401: no valid API key (``Client(api_key=...)``)."""


class PermissionDeniedError(RegisAPIError):
    """403: the key may not do this (a read key on a write route, another collection), or the service is
    read-only (``jobs_disabled``)."""


class NotFoundError(RegisAPIError):
    """404: no such image, job or collection (``no_default_collection`` names the collections in
    ``details["collections"]``)."""


class ConflictError(RegisAPIError):
    """409: e.g. the collection exists already."""


class PayloadTooLargeError(RegisAPIError):
    """413: an upload or image over the service's limits."""


class UnprocessableError(RegisAPIError):
    """422: a parameter or filter the service refuses (e.g. ``unknown_filter_field``, with ``details["fields"]``
    and ``details["suggestions"]``)."""


class UnavailableError(RegisAPIError):
    """503: not ready (no index version yet, a shard or Redis down); raised once the client's retries are spent."""


class ServerError(RegisAPIError):
    """Any other 5xx."""


_BY_STATUS = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
              409: ConflictError, 413: PayloadTooLargeError, 422: UnprocessableError, 503: UnavailableError}


def error_for(status: int, body: object, text: str = "") -> RegisAPIError:
    """The exception of an error response: its class by ``status``, code and message from regis's JSON error
    ``body`` (or the response ``text`` when the body is something else)."""
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else RegisAPIError)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "code" in error:
        return cls(status, str(error["code"]), str(error.get("message", "")), body)
    return cls(status, "http_error", text[:500] or f"HTTP {status}", body if isinstance(body, dict) else None)
