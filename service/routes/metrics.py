"""GET /metrics: Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from regis.jobs.model import QueueUnavailableError
from service.deps import get_live, get_metrics

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    """Request counts and latencies per route, search stage times, cache hits, index size and version,
    jobs per state (see ``service.metrics``)."""
    m = get_metrics(request)
    live = get_live(request)
    engine = live.engine if live is not None else None
    m.index_version.set(engine.snapshot.version if engine is not None else 0)
    m.index_images.set(len(engine.snapshot) if engine is not None else 0)
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is not None:
        try:
            for state, n in (await run_in_threadpool(jobs.counts)).items():
                m.jobs.labels(state=state).set(n)
            if jobs.backend == "redis":
                m.redis_up.set(1)
        except QueueUnavailableError:
            m.redis_up.set(0)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
