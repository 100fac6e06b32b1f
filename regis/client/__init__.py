"""The Python client of the regis HTTP API: ``Client`` (httpx, blocking) and ``AsyncClient`` (asyncio).

Results are the service's own pydantic models (``regis.api.schemas``: ``SearchResponse`` with ``SearchHit``s,
``ImageInfo``, ``JobInfo``, ...); error answers raise ``RegisAPIError`` subclasses carrying the service's JSON
error (``status``, ``code``, ``message``, ``details``); 503s are retried with back-off first.

Example::

    from regis.client import Client, UnprocessableError

    with Client("http://127.0.0.1:8000", api_key="regis_...", collection="photos") as regis:
        for hit in regis.search("query.jpg", k=5).results:
            print(hit.rank, hit.score, hit.path)
        try:
            regis.search("query.jpg", filter="albun:trip")
        except UnprocessableError as err:
            print(err.code, err.details["suggestions"])   # unknown_filter_field ['album']
"""

from regis.client.aio import AsyncClient
from regis.client.calls import RetryPolicy
from regis.client.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RegisAPIError,
    ServerError,
    UnavailableError,
    UnprocessableError,
)
from regis.client.sync import Client

__all__ = ["AsyncClient", "AuthenticationError", "BadRequestError", "Client", "ConflictError", "NotFoundError",
           "PayloadTooLargeError", "PermissionDeniedError", "RegisAPIError", "RetryPolicy", "ServerError",
           "UnavailableError", "UnprocessableError"]
