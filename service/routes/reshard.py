"""POST /v1/collections/{collection}/reshard: re-shard a sharded collection while it is served
(``regis.sharding.reshard``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import ErrorResponse
from service.deps import collection_path, get_jobs, get_registry
from service.errors import APIError

router = APIRouter(prefix="/v1/collections/{collection}", tags=["collections"])
_ERRORS = {code: {"model": ErrorResponse} for code in (403, 404, 409, 422, 503)}


class ReshardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shards: int = Field(ge=1, le=4096, description="the new number of shards S")


class ReshardResponse(BaseModel):
    """What the re-sharding did: shards before and after, the collection version it published (None: it had
    that many shards already), images moved, seconds."""

    shards_before: int
    shards_after: int
    version: int | None
    images: int
    seconds: float


@router.post("/reshard", response_model=ReshardResponse, responses=_ERRORS, dependencies=[Depends(get_jobs)])
async def reshard_collection(request: Request, collection: Annotated[str, Depends(collection_path)],
                             body: ReshardRequest) -> dict:
    """Re-shard a sharded collection into ``shards`` shards while it keeps answering: the new layout is written
    beside the old one and published in one step (the same ids and results; writes wait for it). Answers once
    the service serves the new layout. 409 ``not_sharded`` for an unsharded index."""
    from regis.errors import IndexFormatError
    from regis.sharding.layout import is_sharded
    from regis.sharding.reshard import reshard

    registry = get_registry(request)
    if registry is None or not registry.exists(collection):
        raise APIError(404, "collection_not_found", f"no collection named {collection!r}")
    settings = registry.settings_for(collection)
    if not is_sharded(settings.index_dir):
        raise APIError(409, "not_sharded", f"collection {collection!r} is not sharded; build a sharded collection "
                                           "with `regis index build --ray --shards S`")
    try:
        report = await run_in_threadpool(reshard, settings.index_dir, body.shards, settings.lock_timeout_s)
    except IndexFormatError:
        raise APIError(409, "nothing_to_reshard", f"collection {collection!r} has no published version yet") from None
    live = registry.live(collection)
    await run_in_threadpool(live.refresh)  # read-your-writes: served from now on
    return report.to_json()
