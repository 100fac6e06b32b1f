"""Running a search for a request: the query-result cache (when configured) and the per-stage metrics."""

from __future__ import annotations

import hashlib
import time

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from regis.jobs.cache import params_key
from regis.retrieve.query import QueryEngine


async def _search(request: Request, engine: QueryEngine, data: bytes, params: dict) -> dict:
    """One search: through the dynamic batcher when the app has one (``service.batched``), else alone."""
    batched = getattr(request.app.state, "batched", None)
    if batched is not None and isinstance(engine, QueryEngine):
        return await batched.search_bytes(engine, data, **params)
    return await run_in_threadpool(engine.search_bytes, data, **params)


async def run_search(request: Request, response: Response, engine: QueryEngine, data: bytes, **params) -> dict:
    """``engine.search_bytes(data, **params)``, through the cache when there is one, and through the dynamic
    batcher when batching is on (``REGIS_BATCH_MAX_SIZE`` > 1).

    A hit is keyed by the query bytes' SHA-256, the index version served now and ``params``; its stage
    timings read 0 and ``total`` is the lookup time (ms). The ``X-Regis-Cache`` header says hit or miss.
    """
    metrics = request.app.state.metrics
    cache = getattr(request.app.state, "cache", None)
    if cache is None:
        result = await _search(request, engine, data, params)
        metrics.observe_search(result["timings_ms"])
        return result
    t0 = time.perf_counter()
    sha = hashlib.sha256(data).hexdigest()
    pkey = params_key(**params, index=str(engine.snapshot.index_dir))  # one cache per collection
    hit, failed = await run_in_threadpool(cache.get, engine.snapshot.version, sha, pkey)
    if hit is not None:
        metrics.cache.labels(result="hit").inc()
        response.headers["X-Regis-Cache"] = "hit"
        hit["timings_ms"] = {**dict.fromkeys(hit.get("timings_ms", {}), 0.0),
                             "total": (time.perf_counter() - t0) * 1e3}
        return hit
    metrics.cache.labels(result="error" if failed else "miss").inc()
    response.headers["X-Regis-Cache"] = "miss"
    result = await _search(request, engine, data, params)
    metrics.observe_search(result["timings_ms"])
    if not failed:
        await run_in_threadpool(cache.put, result["index_version"], sha, pkey, result)
    return result
