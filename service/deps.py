"""FastAPI dependencies, in one place; tests replace them with ``app.dependency_overrides``."""

from __future__ import annotations

from fastapi import Request

from regis.retrieve.query import QueryEngine
from service.errors import APIError
from service.settings import Settings


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    return request.app.state.settings


def get_engine(request: Request) -> QueryEngine:
    """The query engine loaded at startup.

    Raises:
        APIError: 503 when no index is loaded.
    """
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        raise APIError(503, "index_unavailable", "no index is loaded")
    return engine
