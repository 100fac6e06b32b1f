"""GET /v1/duplicates: near-duplicate groups of the index (also under /v1/collections/{collection})."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import ErrorResponse
from regis.errors import ConfigError
from regis.retrieve.query import QueryEngine
from service.deps import get_engine, get_settings
from service.errors import APIError
from service.schemas_duplicates import DuplicatesPending, DuplicatesResponse
from service.settings import Settings

router = APIRouter(tags=["duplicates"])  # mounted at /v1 and /v1/collections/{collection} (service.app)
MAX_WAIT_S = 60.0


def _runs(request: Request):
    from service.duplicates import DuplicateRuns

    runs = getattr(request.app.state, "duplicate_runs", None)
    if runs is None:
        runs = request.app.state.duplicate_runs = DuplicateRuns()
    return runs


def _overrides(thresholds: str | None) -> dict:
    if not thresholds:
        return {}
    try:
        value = json.loads(thresholds)
    except json.JSONDecodeError:
        raise APIError(422, "invalid_parameter", "thresholds must be a JSON object, e.g. {\"floor\": 0.5}") from None
    if not isinstance(value, dict):
        raise APIError(422, "invalid_parameter", "thresholds must be a JSON object, e.g. {\"floor\": 0.5}")
    return value


_RESPONSES = {202: {"model": DuplicatesPending}, **{c: {"model": ErrorResponse} for c in (404, 422, 500, 501, 503)}}


@router.get("/duplicates", response_model=DuplicatesResponse, responses=_RESPONSES)
async def duplicates(
    request: Request,
    engine: Annotated[QueryEngine, Depends(get_engine)],
    settings: Annotated[Settings, Depends(get_settings)],
    offset: Annotated[int, Query(ge=0, le=10**9, description="skip the first groups (paging)")] = 0,
    limit: Annotated[int, Query(ge=1, le=500, description="groups per page")] = 20,
    explain: Annotated[bool, Query(description="add each pair's token explanation, both ways")] = False,
    merge: Annotated[list[Literal["crop", "same_scene"]] | None, Query(
        description="also join groups through crops or other shots (repeat the parameter for both); by default "
                    "groups are exact and edited copies only")] = None,
    relation: Annotated[list[Literal["exact", "edited_copy", "crop", "same_scene"]] | None, Query(
        description="report only these relations (repeatable)")] = None,
    thresholds: Annotated[str | None, Query(max_length=2000, description="JSON object overriding the index's "
                                                                        "thresholds for this call, e.g. "
                                                                        "{\"floor\": 0.5, \"edited_min_cover\": 0.9} "
                                                                        "(regis duplicates --show-config lists "
                                                                        "them)")] = None,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for pairs still being "
                                                                  "computed before answering 202")] = 10.0,
) -> dict | JSONResponse:
    """Groups of near-duplicate images: exact copies, edited copies (resized, recompressed, recoloured, slightly
    cropped or rotated, text or border added), with the crops (which image contains which) and other shots of the
    same scene beside them. Every pair has its relation in words, its MaxSim scores both ways and, when verified,
    where each image's frame lies in the other. The pairs are computed once per index version and stored with it
    (after uploads only the new images are searched); while they are computed the answer is 202 with the
    progress."""
    from regis.duplicates.api import find_duplicates, index_config
    from regis.duplicates.finder import index_file_resolver, stored_pairs
    from regis.indexes.snapshot import IndexSnapshot

    snapshot = engine.snapshot
    if not isinstance(snapshot, IndexSnapshot):
        raise APIError(501, "not_supported", "duplicates work on unsharded indexes and collections for now")
    try:
        config = (await run_in_threadpool(index_config, snapshot)).with_overrides(_overrides(thresholds))
    except ConfigError as exc:
        raise APIError(422, "invalid_parameter", str(exc)) from None
    resolve = index_file_resolver(snapshot, settings.resolved_uploads_dir(), settings.images_root)
    if await run_in_threadpool(stored_pairs, snapshot, config) is None:
        state = _runs(request).start(snapshot, config, resolve)
        await asyncio.to_thread(state.done.wait, wait)
        if not state.done.is_set():
            body = {"state": "running", "index_version": state.version, "stage": state.stage,
                    "done": state.done_count, "total": state.total}
            return JSONResponse(body, status_code=202, headers={"Retry-After": "2"})
        if state.error is not None:
            raise APIError(500, "duplicates_failed", "finding duplicates failed; the server log says why")
    out = await run_in_threadpool(find_duplicates, snapshot, _overrides(thresholds), resolve, offset, limit, explain,
                                  tuple(merge or ()), tuple(relation) if relation else None)
    return out
