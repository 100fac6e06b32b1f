"""Request body limits, enforced while the body streams in.

- The total: the framework's (Starlette's ``RequestBodyLimitMiddleware`` through FastAPI's ``max_body_size``): a
  request over its route group's limit gets 413 as soon as its declared length or the bytes received so far pass
  the limit, before the multipart parser spools the rest to a temporary file.
- The parts of a form (``FormLimitMiddleware``): files per request (``REGIS_MAX_UPLOAD_FILES``), bytes per file
  (``REGIS_MAX_UPLOAD_BYTES``), text fields and their bytes, counted as each chunk arrives and
  refused (413) at the first part past a limit, before the framework's parser spools it. The route group's
  total alone let a search with a read key send 600 parts of 1 MB (each spooled in memory: +1.7 GB of RSS for
  3 requests) or one file part of 600 MB before the route's own checks ran (issue 27, item 5).
- Text fields must be UTF-8 (422 ``invalid_form_text``): Starlette decodes a text field that is not as Latin-1,
  so the bytes of a lone surrogate in an upload's ``metadata`` were stored as other characters, answered 201
  (found by scripts/soak.py; a PATCH of the same bytes is a 422).
"""

from __future__ import annotations

import codecs

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

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


MAX_FORM_FIELDS = 8  # text fields of a form (the routes take at most two: metadata, id)
MAX_FIELD_BYTES = 4 * MAX_METADATA_BYTES  # one text field (the routes check their own, smaller, limits)


class FormLimitExceeded(HTTPException):
    """A form past one of ``FormLimitMiddleware``'s limits (413; 422 for a text field that is not UTF-8;
    ``code`` for the JSON error). An ``HTTPException``, so that it leaves the framework's form parsing as
    itself."""

    def __init__(self, code: str, message: str, status_code: int = 413):
        super().__init__(status_code, message)
        self.code = code


class _FormCounter:
    """Counts the parts of one multipart body as its chunks arrive (python-multipart's parser, callbacks only:
    nothing is kept but counters and the current part's headers)."""

    def __init__(self, boundary: bytes, max_files: int, max_file_bytes: int):
        from python_multipart.multipart import MultipartParser

        self.max_files, self.max_file_bytes = max_files, max_file_bytes
        self.files = self.fields = 0
        self.part_bytes = 0
        self.is_file = False
        self.header_name = self.disposition = b""
        self.field_name = ""
        self.text = codecs.getincrementaldecoder("utf-8")()  # a text field's bytes must be UTF-8
        self.broken = False  # malformed: the framework's parser answers for it
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_part_data": self._part_data, "on_part_end": self._part_end,
            "on_header_field": self._header_field, "on_header_value": self._header_value,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_finished,
        })

    def feed(self, chunk: bytes) -> None:
        if self.broken or not chunk:
            return
        try:
            self.parser.write(chunk)
        except FormLimitExceeded:
            raise
        except Exception:  # not multipart after all: leave the answer to the framework's parser
            self.broken = True

    def _part_begin(self) -> None:  # (python-multipart bounds a part's headers itself)
        self.part_bytes = 0
        self.is_file = False
        self.header_name = self.disposition = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition += data[start:end]

    def _header_end(self) -> None:
        self.header_name = b""

    def _headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self.disposition)
        self.is_file = b"filename" in options
        self.field_name = options.get(b"name", b"").decode("utf-8", "replace")[:80]
        self.text.reset()
        if self.is_file:
            self.files += 1
            if self.files > self.max_files:
                raise FormLimitExceeded("too_many_files", f"at most {self.max_files} files per request")
        else:
            self.fields += 1
            if self.fields > MAX_FORM_FIELDS:
                raise FormLimitExceeded("payload_too_large", f"at most {MAX_FORM_FIELDS} form fields per request")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self.part_bytes += end - start
        if self.is_file and self.part_bytes > self.max_file_bytes:
            raise FormLimitExceeded("payload_too_large", f"file {self.files} is larger than the limit of "
                                                         f"{self.max_file_bytes:,} bytes")
        if not self.is_file and self.part_bytes > MAX_FIELD_BYTES:
            raise FormLimitExceeded("payload_too_large", f"a form field is larger than {MAX_FIELD_BYTES:,} bytes")
        if not self.is_file:
            self._check_text(data[start:end], final=False)

    def _part_end(self) -> None:
        if not self.is_file:
            self._check_text(b"", final=True)

    def _check_text(self, data: bytes, final: bool) -> None:
        try:
            self.text.decode(data, final)
        except UnicodeDecodeError:
            raise FormLimitExceeded("invalid_form_text", f"form field {self.field_name!r} is not UTF-8 text (a "
                                                         "lone surrogate, or another encoding)", 422) from None


class FormLimitMiddleware:
    """Refuse (413) a form body at the first part past a limit, while it streams (module docstring): a multipart
    body's files, bytes per file and text fields are counted chunk by chunk; a URL-encoded form
    may hold ``DEFAULT_BODY_BYTES`` in all (no route takes one).

    Args:
        app: the ASGI app.
        max_files: files per request (``REGIS_MAX_UPLOAD_FILES``).
        max_file_bytes: bytes per file (``REGIS_MAX_UPLOAD_BYTES``).
    """

    def __init__(self, app, max_files: int, max_file_bytes: int):
        self.app = app
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        count = self._counter(Headers(scope=scope).get("content-type", ""))
        if count is None:
            await self.app(scope, receive, send)
            return

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request":
                count(message.get("body", b""))
            return message

        await self.app(scope, counted_receive, send)

    def _counter(self, content_type: str):
        """A function counting one body's chunks (raising ``FormLimitExceeded``), None for bodies not forms."""
        from python_multipart.multipart import parse_options_header

        kind, options = parse_options_header(content_type)
        if kind == b"multipart/form-data" and options.get(b"boundary"):
            return _FormCounter(options[b"boundary"], self.max_files, self.max_file_bytes).feed
        if kind == b"application/x-www-form-urlencoded":
            total = 0

            def count(chunk: bytes) -> None:
                nonlocal total
                total += len(chunk)
                if total > DEFAULT_BODY_BYTES:
                    raise FormLimitExceeded("payload_too_large", f"a URL-encoded form is larger than "
                                                                 f"{DEFAULT_BODY_BYTES:,} bytes")

            return count
        return None
