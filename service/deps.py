"""FastAPI dependencies, in one place; tests replace them with ``app.dependency_overrides``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Request

from regis.indexes.collections import NAME_PATTERN
from regis.jobs.cache import QueryCache
from regis.jobs.queue import JobQueue
from regis.retrieve.query import QueryEngine
from service.errors import APIError
from service.live import LiveIndex
from service.metrics import Metrics
from service.settings import Settings


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    return request.app.state.settings


def collection_path(
    collection: Annotated[str, Path(pattern=NAME_PATTERN, max_length=63,
                                    description="collection name (GET /v1/collections lists them)")],
) -> str:
    """The ``{collection}`` path parameter of the routes under ``/v1/collections/{collection}`` (declared once
    here, for validation and the OpenAPI page)."""
    return collection


def get_collection_name(request: Request) -> str | None:
    """The collection a request is for: its ``{collection}`` path parameter, None on the default routes."""
    return request.path_params.get("collection")


def get_registry(request: Request):
    """The service's ``CollectionRegistry`` (None when the app was created with ``load=False``)."""
    return getattr(request.app.state, "collections", None)


def get_live(request: Request) -> LiveIndex | None:
    """The live index holder of the request's collection (None when the app was created with ``load=False``).

    Raises:
        APIError: 404 for an unknown collection.
    """
    name = get_collection_name(request)
    registry = get_registry(request)
    if name is None or registry is None or name == registry.default_name:
        return getattr(request.app.state, "live", None)
    return registry.live(name)


def get_engine(request: Request) -> QueryEngine:
    """The query engine over the live index version.

    Raises:
        APIError: 503 when no index version is loaded yet.
    """
    live = get_live(request)
    engine = live.engine if live is not None else getattr(request.app.state, "engine", None)
    if engine is None:
        hint = (" yet: index a folder (POST /v1/jobs/index) or upload images (POST /v1/images)"
                if getattr(request.app.state, "jobs", None) is not None else "")
        raise APIError(503, "index_unavailable", f"no index version is published{hint}")
    return engine


def get_jobs(request: Request) -> JobQueue:
    """The job queue.

    Raises:
        APIError: 403 when this service does not take jobs (``REGIS_ENABLE_JOBS`` is off).
    """
    name = get_collection_name(request)
    registry = get_registry(request)
    if name is not None and registry is not None and name != registry.default_name:
        return registry.jobs(name)
    queue = getattr(request.app.state, "jobs", None)
    if queue is None:
        raise APIError(403, "jobs_disabled", "this service is read-only: set REGIS_ENABLE_JOBS=true to index "
                                             "folders, upload and delete images")
    return queue


def get_cache(request: Request) -> QueryCache | None:
    """The query-result cache (None without Redis, or with ``REGIS_CACHE_TTL_S=0``)."""
    return getattr(request.app.state, "cache", None)


def get_metrics(request: Request) -> Metrics:
    """The app's Prometheus metrics."""
    return request.app.state.metrics
