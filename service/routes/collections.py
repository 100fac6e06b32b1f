"""POST /v1/collections (create), GET /v1/collections (list), GET /v1/collections/{collection} (describe),
DELETE /v1/collections/{collection}. Each collection's images, search and jobs are under
/v1/collections/{collection}/... (the same routes as /v1/..., which answer for the default collection)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import CollectionCreate, CollectionInfo, CollectionList, ErrorResponse
from regis.indexes.collections import CollectionConfig
from service.collections import CollectionRegistry
from service.deps import collection_path, get_jobs, get_registry
from service.errors import APIError

router = APIRouter(prefix="/v1/collections", tags=["collections"])
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 403, 404, 409, 422, 503)}


def _registry(registry: Annotated[CollectionRegistry | None, Depends(get_registry)]) -> CollectionRegistry:
    if registry is None:
        raise APIError(503, "index_unavailable", "the service has not loaded its collections")
    return registry


Registry = Annotated[CollectionRegistry, Depends(_registry)]


@router.get("", response_model=CollectionList, responses=_ERRORS)
async def list_collections(request: Request, registry: Registry) -> dict:
    """Every collection: name, images, index version, backbone, whether it is loaded (with a key limited to
    collections: those only)."""
    from service.auth import request_key

    key = request_key(request)
    names = [n for n in await run_in_threadpool(registry.names) if key is None or key.allows(n)]
    return {"collections": [await run_in_threadpool(registry.describe, n) for n in names]}


@router.post("", response_model=CollectionInfo, status_code=201, responses=_ERRORS,
             dependencies=[Depends(get_jobs)])
async def create_collection(body: CollectionCreate, registry: Registry) -> dict:
    """Create an empty collection that embeds with ``backbone`` (a registered one, default
    efficientnet-lite0-regis), ``frame`` and ``query_layout`` (the encoder's; its index records them), stored in
    ``layout`` (default, or compact: ~1.1-1.2 KB per image instead of ~4 KB, lower recall); fill it with
    POST /v1/collections/{name}/images or /v1/collections/{name}/jobs/index. Needs a service that takes writes
    (REGIS_ENABLE_JOBS) and a collections root (REGIS_COLLECTIONS_ROOT)."""
    from regis.models.registry import list_backbones

    known = {spec.name for spec in list_backbones()}
    if body.backbone is not None and body.backbone not in known:
        raise APIError(422, "invalid_parameter", f"unknown backbone {body.backbone[:80]!r}; known: "
                                                 f"{', '.join(sorted(known))}")
    config = CollectionConfig(backbone=body.backbone, random_init=body.random_init, frame=body.frame,
                              query_layout=body.query_layout, description=body.description, layout=body.layout)
    return await run_in_threadpool(registry.create, body.name, config)


@router.get("/{collection}", response_model=CollectionInfo, responses=_ERRORS)
async def describe_collection(collection: Annotated[str, Depends(collection_path)], registry: Registry) -> dict:
    """A collection's index version, image count, backbone and config."""
    return await run_in_threadpool(registry.describe, collection)


@router.delete("/{collection}", status_code=204, responses=_ERRORS, dependencies=[Depends(get_jobs)])
async def delete_collection(collection: Annotated[str, Depends(collection_path)], registry: Registry) -> None:
    """Delete a collection with its index (not the default one). Its uploaded files go with it."""
    await run_in_threadpool(registry.delete, collection)
