"""The FastAPI application factory."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

import regis
from service.errors import install_error_handlers
from service.routes import health, images, search
from service.settings import Settings

STATIC_DIR = Path(__file__).parent / "static"


def load_engine(settings: Settings):
    """Open the index and its encoder (what the lifespan runs once at startup)."""
    from regis.retrieve.query import QueryEngine, set_torch_threads

    set_torch_threads(settings.torch_threads)
    return QueryEngine.open(
        settings.index_dir,
        weights=str(settings.weights) if settings.weights else None,
        device=settings.device,
        max_pixels=settings.max_pixels,
    )


def create_app(settings: Settings, load: bool = True) -> FastAPI:
    """Build the app.

    Args:
        settings: service settings.
        load: open the index and encoder in the lifespan (tests that override ``get_engine`` pass False).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.settings = settings
        app.state.engine = load_engine(settings) if load else None
        try:
            yield
        finally:
            if app.state.engine is not None:
                app.state.engine.close()

    app = FastAPI(
        title="regis",
        version=regis.__version__,
        description="Multi-vector image retrieval: query by image, ranked by late-interaction (MaxSim) scores.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(search.router)
    app.include_router(images.router)

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    return app
