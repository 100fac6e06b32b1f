"""FastAPI dependencies, in one place; tests replace them with ``app.dependency_overrides``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from regis.faults import pause_point
from regis.indexes.collections import NAME_PATTERN
from regis.jobs.cache import QueryCache
from regis.jobs.model import JobInfo, JobSpec
from regis.jobs.queue import JobQueue
from regis.retrieve.query import QueryEngine
from service import uploads
from service.errors import APIError
from service.jobs import await_job
from service.live import LiveIndex
from service.metrics import Metrics
from service.settings import Settings

_OPEN_TRIES = 3  # opens of a published version a request tries before 503 (each after a fresh look at CURRENT)


def get_settings(request: Request) -> Settings:
    """The app's settings, as the request's collection sees them (its index directory, uploads folder and
    encoder; ``service.collections``).

    Raises:
        APIError: 404 for an unknown collection.
    """
    name = request.path_params.get("collection")
    registry = getattr(request.app.state, "collections", None)
    if name is None or registry is None or name == registry.default_name:
        return request.app.state.settings
    return registry.settings_for(name)


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


def check_collection_exists(request: Request) -> None:
    """Refuse (404) a request whose collection is gone (deleted while the request ran).

    Raises:
        APIError: 404 ``collection_not_found``.
    """
    name = get_collection_name(request)
    registry = get_registry(request)
    if name is not None and registry is not None and not registry.exists(name):
        raise APIError(404, "collection_not_found", f"no collection named {name!r} (it was deleted)")


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


def get_engine_or_empty(request: Request) -> QueryEngine | None:
    """The query engine over the live index version, or None when the request's collection exists and has no
    published version yet (created, nothing written to it): its search and list routes then answer 200 with no
    results (``service.searching.empty_search``), as a search of an empty collection does in other vector stores.

    A version published by another process (the worker) and not swapped in yet is opened here, at once.

    Raises:
        APIError: 404 ``no_default_collection`` on a default route when the service's collections root has no
            default collection (no config and no index under its name; the message and ``collections`` name those
            that can be searched); 404 ``collection_not_found`` for a collection deleted meanwhile, also when it
            is deleted while its version is being opened (before, 503: found by scripts/soak.py); 503
            ``index_unavailable`` when a published version of a collection that still exists cannot be opened
            (``_OPEN_TRIES`` looks at CURRENT; the message says why), for a sharded collection without a served
            version, or for an app created without an index (``load=False``). A collection deleted and created
            again while its version was being opened has none: None (empty), as above.
    """
    live = get_live(request)
    engine = live.engine if live is not None else getattr(request.app.state, "engine", None)
    if engine is not None:
        return engine
    registry = get_registry(request)
    if registry is not None and get_collection_name(request) in (None, registry.default_name) \
            and registry.default_missing() and not registry.default_created():
        raise registry.no_default_error()
    if live is None:
        raise APIError(503, "index_unavailable", "no index version is loaded")
    for _ in range(_OPEN_TRIES):
        if not live.published():
            check_collection_exists(request)  # deleted meanwhile (a tombstone has no CURRENT either): 404, not empty
            return None
        pause_point("engine.version-unopened")
        live.refresh()  # CURRENT names a version the watcher has not swapped in yet (or one that cannot be opened)
        if live.engine is not None:
            return live.engine
        # the open failed: the collection may have been deleted (or deleted and created again, empty) under it, or
        # a newer version published and the one read removed; look again before calling the version unreadable
        check_collection_exists(request)
    why = f": {live.last_error}" if live.last_error else ""
    raise APIError(503, "index_unavailable", f"the published index version cannot be opened{why}")


def get_engine(request: Request) -> QueryEngine:
    """The query engine over the live index version, for the routes that need one (an image by id, explain,
    duplicates).

    Raises:
        APIError: as ``get_engine_or_empty``, and 503 ``index_unavailable`` when the collection has no published
            version yet.
    """
    engine = get_engine_or_empty(request)
    if engine is None:
        hint = (" yet: index a folder (POST /v1/jobs/index) or upload images (POST /v1/images)"
                if getattr(request.app.state, "jobs", None) is not None else "")
        raise APIError(503, "index_unavailable", f"no index version is published{hint}")
    return engine


def get_jobs(request: Request) -> JobQueue:
    """The job queue.

    Raises:
        APIError: 403 when this service does not take jobs (``REGIS_ENABLE_JOBS`` is off), or the request's API
            key has read scope only.
    """
    from service.auth import require_write

    require_write(request)
    name = get_collection_name(request)
    registry = get_registry(request)
    if name is not None and registry is not None and name != registry.default_name:
        return registry.jobs(name)
    queue = getattr(request.app.state, "jobs", None)
    if queue is None:
        raise APIError(403, "jobs_disabled", "this service is read-only: set REGIS_ENABLE_JOBS=true to index "
                                             "folders, upload and delete images")
    if queue.backend == "redis":  # the shared queue, seen from the default collection: its jobs only
        from service.jobs import CollectionJobQueue

        return CollectionJobQueue(queue, None, owns=False)
    return queue


class ImageWrite:
    """The dependencies of a route that changes one indexed image through an index job (PATCH and DELETE
    /v1/images/{id}), resolved in this order: the job queue (``get_jobs``: 403 first), the engine (None: no
    version yet), the settings and the live index; ``run`` submits the job and answers for it."""

    def __init__(
        self,
        response: Response,
        queue: Annotated[JobQueue, Depends(get_jobs)],
        engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
        settings: Annotated[Settings, Depends(get_settings)],
        live: Annotated[LiveIndex, Depends(get_live)],
    ):
        self.response = response
        self.queue = queue
        self.engine = engine
        self.settings = settings
        self.live = live

    async def run(self, spec: JobSpec, image_id: int, wait: bool) -> tuple[JobInfo, dict]:
        """Submit ``spec``, wait for it (with ``wait``, up to REGIS_WRITE_WAIT_S seconds), and return its last
        state and the answer's common fields {"id", "job_id", "state", "index_version"}; a job not done by then
        makes the answer a 202 with ``Location: /v1/jobs/{job id}``.

        Raises:
            APIError: the job failed (``uploads.job_failure``).
        """
        info = await run_in_threadpool(self.queue.submit, spec)
        if wait and self.settings.write_wait_s > 0:
            info = await await_job(self.queue, self.live, info.id, self.settings.write_wait_s) or info
        if info.state == "failed":
            raise uploads.job_failure(info)
        body = {"id": image_id, "job_id": info.id, "state": info.state, "index_version": self.live.version}
        if info.state != "done":
            self.response.status_code = 202
            self.response.headers["Location"] = f"/v1/jobs/{info.id}"
        return info, body


def get_cache(request: Request) -> QueryCache | None:
    """The query-result cache (None without Redis, or with ``REGIS_CACHE_TTL_S=0``)."""
    return getattr(request.app.state, "cache", None)


def get_metrics(request: Request) -> Metrics:
    """The app's Prometheus metrics."""
    return request.app.state.metrics


def search_size(settings: Settings, k: int | None, depth: int | None) -> tuple[int, int | None]:
    """A search's (k, depth): the settings' defaults for those not given, checked against their maxima. Called
    by the search routes with their own ``k`` and ``depth`` query parameters (each route describes them in its
    own words, so they are not declared here).

    Raises:
        APIError: 422 ``invalid_parameter`` for k > REGIS_MAX_K or depth > REGIS_MAX_DEPTH (k first).
    """
    k = k or settings.default_k
    depth = depth or settings.default_depth
    if k > settings.max_k:
        raise APIError(422, "invalid_parameter", f"k must be <= {settings.max_k}")
    if depth is not None and depth > settings.max_depth:
        raise APIError(422, "invalid_parameter", f"depth must be <= {settings.max_depth}")
    return k, depth


def search_extras(
    filter: Annotated[str | None, Query(
        max_length=8192, description='metadata filter: JSON such as {"album": "trip", "year": {"gte": 2020}}, '
                                     'or the key:value[,key:value] shorthand (regis.indexes.filters)')] = None,
    offset: Annotated[int, Query(ge=0, le=999, description="skip the best `offset` results (paging)")] = 0,
    score_threshold: Annotated[float | None, Query(allow_inf_nan=False,
                                                   description="drop results scoring below this MaxSim score "
                                                               "(a finite number)")] = None,
) -> dict:
    """The search options besides k / depth / mode, checked: {"where", "offset", "score_threshold"} (only those
    given).

    Raises:
        APIError: 422 for a malformed filter (the message says what is wrong).
    """
    from regis.errors import ConfigError
    from regis.indexes.filters import compile_filter, filter_options, parse_filter

    out: dict = {}
    try:
        where = parse_filter(filter)
        if where is not None and filter_options(where)[0] is not None:  # {"strict": false} alone: no filter
            compile_filter(where)  # refuse a bad filter before any work
            out["where"] = where
    except ConfigError as exc:
        raise APIError(422, "invalid_filter", str(exc)) from None
    if offset:
        out["offset"] = offset
    if score_threshold is not None:
        out["score_threshold"] = score_threshold
    return out


_KNOWN_QUERY: dict = {}  # id(route) -> the query parameter names it declares (routes live as long as the app)


def _query_names(dependant) -> set[str]:
    """Query parameter names of a route's dependency tree."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def reject_unknown_query_params(request: Request) -> None:
    """Refuse (422) query parameters the route does not declare (``?filtr=...`` must not be silently ignored).

    Raises:
        APIError: 422 naming the unknown parameters.
    """
    route = request.scope.get("route")
    known = _KNOWN_QUERY.get(id(route))
    if known is None:
        dependant = getattr(route, "dependant", None)
        if dependant is None:
            return
        known = _KNOWN_QUERY[id(route)] = frozenset(_query_names(dependant))
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        names = ", ".join(repr(n[:40]) for n in unknown[:5])
        raise APIError(422, "unknown_parameter", f"unknown query parameter(s) {names}; this route takes: "
                                                 f"{', '.join(sorted(known)) or 'none'}")
