"""GET /healthz (liveness) and GET /readyz (readiness)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import Health, Readiness
from service.deps import get_live
from service.errors import error_body

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, response_model_exclude_unset=True)
async def healthz(request: Request) -> dict:
    """Liveness: the process answers. Where API keys are on, a request without a valid key gets only
    ``{"status": "ok"}``; with one (or with keys off) it also says which index version is served, its image count
    and backbone. Runs on the event loop (no blocking call in it), so busy worker threads never delay the
    container's healthcheck."""
    if not _may_see_details(request):
        return {"status": "ok"}
    live = get_live(request)
    engine = live.engine if live is not None else None
    if engine is None:
        return {"status": "ok", "index_version": None, "images": None, "backbone": None}
    snap = engine.snapshot
    return {
        "status": "ok", "index_version": snap.version, "images": len(snap), "backbone": snap.manifest.encoder.backbone,
    }


def _may_see_details(request: Request) -> bool:
    """Keys off, or a valid key presented (a keys file that cannot be read shows nothing)."""
    from service.auth import presented_key
    from service.keys import KeysUnavailableError

    store = getattr(request.app.state, "keys", None)
    if store is None:
        return True
    try:
        return store.check(presented_key(request.headers)) is not None
    except KeysUnavailableError:
        return False


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request):
    """Readiness: an index version is loaded (every shard answers, for a sharded collection), and Redis answers
    when one is configured. 503 otherwise, with what is missing. Also (keys off, or a valid key presented) the
    image count served and, for a sharded collection, each shard's version, image count and state."""
    live = get_live(request)
    checks = {"index": "ok" if live is not None and live.engine is not None else "no index version loaded yet"}
    more = getattr(live, "readiness", None)  # e.g. Ray Serve's shards (cluster.serve.RayLive)
    if more is not None:
        checks.update(await run_in_threadpool(more))
    settings = request.app.state.settings
    if settings.redis_url:
        jobs = getattr(request.app.state, "jobs", None)
        if jobs is not None and jobs.backend == "redis":
            up = await run_in_threadpool(jobs.ping)
        else:
            up = await run_in_threadpool(_ping, settings.redis_url)
        checks["redis"] = "ok" if up else "unreachable"
    ready = all(v == "ok" for v in checks.values())
    body = {"ready": ready, "index_version": live.version if live is not None else None, "checks": checks}
    if live is not None and _may_see_details(request):  # as /healthz: the counts need a key when keys are on
        body.update(live.served())
    if ready:
        return body
    problems = "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return JSONResponse({**body, **error_body("not_ready", problems)}, status_code=503)


def _ping(url: str) -> bool:
    import redis

    from regis.jobs.rq_queue import redis_connection

    conn = redis_connection(url, timeout_s=1.0)
    try:
        return bool(conn.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        conn.close()
