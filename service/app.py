"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse

import regis
from regis.api.schemas import ErrorResponse
from regis.images.decode import set_max_concurrent_decodes
from service.auth import APIKeyMiddleware
from service.deps import collection_path, reject_unknown_query_params
from service.docs import install_docs
from service.errors import install_error_handlers
from service.keys import KeyStore
from service.limits import FormLimitMiddleware, JSONTooLargeMiddleware, body_limits
from service.metrics import Metrics, MetricsMiddleware
from service.openapi_security import install_security
from service.origin import OriginCheckMiddleware
from service.routes import (
    batch,
    collections,
    duplicates,
    explain,
    gallery,
    health,
    images,
    jobs,
    metrics,
    reshard,
    search,
    snapshots,
)
from service.settings import Settings

STATIC_DIR = Path(__file__).parent / "static"
COLLECTION_PREFIX = "/v1/collections/{collection}"
log = logging.getLogger("regis.service")


def load_engine(settings: Settings):
    """Open the index and its encoder (read-only serving, no live updates); queries are encoded with the
    settings' runtime and threads (this engine's, not the process's)."""
    from regis.retrieve.query import QueryEngine, set_torch_threads

    set_torch_threads(settings.resolved_torch_threads())
    return QueryEngine.open(
        settings.index_dir,
        weights=str(settings.weights) if settings.weights else None,
        device=settings.device,
        max_pixels=settings.max_pixels,
        **settings.query_encoding(),
    )


def open_live_index(settings: Settings):
    """The default collection's ``LiveIndex``, loaded (``LiveIndex.load``) with its query copy made: what the
    lifespan starts with. ``regis serve`` calls it before the server starts, so that a missing index or a
    mismatching encoder is one line on the command line, not a traceback in the server's log.

    Raises:
        IndexFormatError / IndexMismatchError / WeightsError / ConfigError: as ``LiveIndex.load``.
    """
    from service.live import LiveIndex

    live = LiveIndex(settings)
    try:
        live.load()
        if live.engine is not None:
            _ = live.engine.query_encoder  # the query copy made (and checked) now, not on the first query (ONNX: ~3 s)
    except BaseException:
        live.close()
        raise
    return live


def _start(app: FastAPI, settings: Settings, live=None) -> None:
    """Lifespan start: the live index (``live``: one opened before, by ``open_live_index``), the job queue, the
    cache and the index watcher."""
    from regis.jobs.names import RedisNames
    from service.collections import CollectionRegistry
    from service.jobs import make_job_queue
    from service.live import IndexWatcher

    metrics: Metrics = app.state.metrics

    def on_swap(version: int) -> None:
        metrics.index_swaps.inc()

    live = live if live is not None else open_live_index(settings)
    live.on_swap = on_swap
    app.state.live = live
    names = RedisNames(settings.redis_prefix)
    if settings.enable_jobs:
        app.state.jobs = make_job_queue(settings, live)
    app.state.collections = CollectionRegistry(settings, live, app.state.jobs,
                                               on_swap=lambda name, version: on_swap(version))
    if app.state.jobs is not None:
        clean_staging(app.state.collections, app.state.jobs)
    if settings.redis_url and settings.cache_ttl_s > 0:
        from regis.jobs.cache import QueryCache
        from regis.jobs.rq_queue import redis_connection

        app.state.cache = QueryCache(redis_connection(settings.redis_url, timeout_s=1.0), names,
                                     ttl_s=settings.cache_ttl_s)
    if settings.batch_max_size > 1:
        from service.batched import BatchedSearch

        app.state.batched = BatchedSearch(settings.batch_max_size, settings.batch_max_wait_ms,
                                          settings.batch_encode_workers,
                                          settings.resolved_torch_threads())
        if live.engine is not None:
            app.state.batched.warm_up(live.engine)  # ONNX Runtime: a session per batch size, made now
    app.state.watcher = IndexWatcher(app.state.collections, settings.index_poll_s, settings.redis_url,
                                     names.index_updates).start()


def clean_staging(registry, queue) -> None:
    """What a killed process left in the uploads folder of every collection (``regis.indexes.staging``): staged
    batches no job will place (an API killed between staging and queueing the job; ``registry``:
    ``CollectionRegistry``; ``queue``: the default collection's job queue: the shared Redis queue knows every
    collection's jobs; a fresh embedded queue knows none and no other process queues into it, so its batches
    are all orphans, whatever their age), uploaded files no index version lists and stale thumbnails (a job
    killed between placing its files and publishing, or between a delete and removing its files), and the
    folders of collection deletes cut short."""
    from regis.indexes.staging import clean_orphaned_staging, clean_orphaned_uploads
    from regis.jobs.model import QueueUnavailableError

    def state(batch: str) -> str | None:
        info = queue.get(batch)
        return info.state if info is not None else None

    if registry.root is not None:
        registry.root.clean_graves()
    staging = True
    for name in registry.names():
        try:
            settings = registry.settings_for(name)
            uploads_dir = settings.resolved_uploads_dir()
            if staging:
                grace = 0.0 if queue.backend == "embedded" else settings.staging_grace_s
                clean_orphaned_staging(uploads_dir, state, grace)
            clean_orphaned_uploads(uploads_dir, settings.index_dir)
        except QueueUnavailableError:
            log.warning("the job queue cannot be reached: staged uploads are checked at the next start")
            staging = False
        except Exception:  # one unreadable collection must not keep the service from starting
            log.exception("cleaning the uploads of collection %s failed", name)


def _stop(app: FastAPI) -> None:
    batched = getattr(app.state, "batched", None)
    if batched is not None:
        batched.close()
    for name in ("watcher", "collections", "jobs"):
        component = getattr(app.state, name, None)
        if component is not None:
            try:
                component.stop() if name == "watcher" else component.close()
            except Exception:
                log.exception("stopping %s", name)
    live = getattr(app.state, "live", None)
    if live is not None:
        live.close()


def create_app(settings: Settings, load: bool = True, start: Callable[[FastAPI], None] | None = None,
               live=None) -> FastAPI:
    """Build the app.

    Args:
        settings: service settings.
        load: open the index and encoder, and start the job queue and the index watcher, in the lifespan
            (tests that override ``get_engine`` pass False).
        start: replaces that start-up (called with the app in the lifespan; it sets ``app.state.live`` and what
            else it serves): ``cluster.serve`` serves a collection on Ray Serve this way, with the same routes.
        live: the default collection's live index, already opened (``open_live_index``); None: opened in the
            lifespan.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.settings = settings
        app.state.live = app.state.jobs = app.state.cache = app.state.watcher = app.state.batched = None
        app.state.collections = None
        try:
            if start is not None:
                start(app)
            elif load:
                _start(app, settings, live)
            yield
        finally:
            _stop(app)

    app = FastAPI(
        title="regis",
        version=regis.__version__,
        description="Multi-vector image retrieval: query by image, ranked by late-interaction (MaxSim) scores.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_docs(app)
    app.state.settings = settings
    app.state.metrics = Metrics()
    set_max_concurrent_decodes(settings.max_concurrent_decodes)
    app.state.keys = KeyStore(settings.api_keys_file) if settings.api_keys_file else None
    install_security(app, keys_required=app.state.keys is not None)  # the keys in the OpenAPI document
    # innermost: forms are counted while the route reads them (service.limits)
    app.add_middleware(FormLimitMiddleware, max_files=settings.max_upload_files,
                       max_file_bytes=settings.max_upload_bytes)
    if app.state.keys is not None:  # inside the metrics middleware: refused requests are counted too
        app.add_middleware(APIKeyMiddleware, store=app.state.keys, default_collection=settings.default_collection)
    else:  # no key to forge: refuse writes a page of another site makes a browser send (service.origin)
        app.add_middleware(OriginCheckMiddleware, allowed=settings.cors_origins)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_credentials=False,
                           allow_methods=["GET", "POST", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "X-API-Key", "Content-Type"], expose_headers=["ETag"])
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(JSONTooLargeMiddleware)
    install_error_handlers(app)
    limits = body_limits(settings)
    app.include_router(health.router)
    strict = Depends(reject_unknown_query_params)
    app.include_router(collections.router, max_body_size=limits["default"], dependencies=[strict])
    app.include_router(snapshots.router, max_body_size=limits["default"], dependencies=[strict])
    app.include_router(reshard.router, max_body_size=limits["default"], dependencies=[strict])
    # every collection's routes, and the default collection's (the routes without /collections/{collection})
    routers = ((search, "search"), (batch, "images"), (explain, "search"), (images, "images"), (gallery, "default"),
               (jobs, "default"), (duplicates, "default"))
    for routes, limit in routers:
        app.include_router(routes.router, prefix="/v1", max_body_size=limits[limit], dependencies=[strict])
        app.include_router(routes.router, prefix=COLLECTION_PREFIX, dependencies=[Depends(collection_path), strict],
                           max_body_size=limits[limit], responses={404: {"model": ErrorResponse}})
    app.include_router(metrics.router)

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/duplicates", include_in_schema=False)
    def duplicates_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "duplicates.html", media_type="text/html")

    @app.get("/duplicates.js", include_in_schema=False)
    def duplicates_script() -> FileResponse:
        return FileResponse(STATIC_DIR / "duplicates.js", media_type="text/javascript")

    return app
