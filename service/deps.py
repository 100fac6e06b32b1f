"""FastAPI dependencies, in one place; tests replace them with ``app.dependency_overrides``."""

from __future__ import annotations

from fastapi import Request

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


def get_live(request: Request) -> LiveIndex | None:
    """The live index holder (None when the app was created with ``load=False``)."""
    return getattr(request.app.state, "live", None)


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
