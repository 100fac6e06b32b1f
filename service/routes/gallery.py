"""GET /v1/images (list, paged and filtered), GET /v1/images/{id}/similar ("more like this"), PATCH
/v1/images/{id} (metadata), GET /v1/images/{id}/thumbnail; also under /v1/collections/{collection}."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import ErrorResponse, ImageList, MetadataPatchResponse, SearchResponse
from regis.faults import pause_point
from regis.jobs.model import JobSpec
from regis.retrieve.query import QueryEngine
from service import thumbnails, uploads
from service.deps import ImageWrite, get_engine_or_empty, get_settings, search_extras, search_size
from service.errors import APIError
from service.params import ImageId
from service.routes.images import image_path
from service.searching import EMPTY_VERSION, run_search_id
from service.settings import Settings

router = APIRouter(prefix="/images", tags=["images"])  # under /v1 and /v1/collections/{collection}
_ERRORS = {code: {"model": ErrorResponse} for code in (403, 404, 409, 422, 503)}


@router.get("", response_model=ImageList, responses=_ERRORS)
async def list_images(
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    extras: Annotated[dict, Depends(search_extras)],
    limit: Annotated[int, Query(ge=1, le=1000, description="images per page")] = 100,
) -> dict:
    """The indexed images in id order, ``limit`` per page from ``offset``, optionally filtered by metadata
    (``filter``: the search filter language). ``total`` counts every image matching the filter. A collection
    with no published version yet lists nothing (``index_version`` 0); a filter on it is checked for form only
    (no field is known yet, so none is an unknown field)."""
    from regis.indexes.filters import check_fields, compile_filter

    if "score_threshold" in extras:
        raise APIError(422, "unknown_parameter", "score_threshold applies to searches only")
    where, params = compile_filter(extras["where"]) if "where" in extras else (None, [])
    offset = extras.get("offset", 0)
    if engine is None:
        return {"index_version": EMPTY_VERSION, "total": 0, "offset": offset, "limit": limit, "images": []}
    snapshot = engine.snapshot
    if where is not None:
        await run_in_threadpool(check_fields, snapshot.table, extras["where"])
    records, total = await run_in_threadpool(snapshot.table.select_where, where, params, limit, offset)
    return {"index_version": snapshot.version, "total": total, "offset": offset, "limit": limit,
            "images": [rec.__dict__ for rec in records]}


@router.get("/{image_id}/similar", response_model=SearchResponse, response_model_exclude_unset=True,
            responses=_ERRORS)
async def similar_images(
    request: Request,
    response: Response,
    image_id: ImageId,
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    settings: Annotated[Settings, Depends(get_settings)],
    extras: Annotated[dict, Depends(search_extras)],
    k: Annotated[int | None, Query(ge=1, le=1000, description="results to return")] = None,
    depth: Annotated[int | None, Query(ge=1, le=4096, description="candidates per query token (k')")] = None,
    mode: Annotated[Literal["ann", "exact"], Query(description="ann: candidates + rerank; exact: score all")] = "ann",
    explain: Annotated[bool, Query(description="add each result's explanation and the query's tokens, as "
                                               "POST /v1/search?explain=true (the query is this image)")] = False,
) -> dict:
    """"More like this": search with the stored tokens of an indexed image (no upload, no encoding). The image
    itself comes first (score = its self-similarity). The query is the image's T stored tokens, not the m tokens
    an upload gets under the index's ``query_layout``, so scores are on another scale than a search by upload.
    On a collection with no published version yet every id is a 404 ``image_not_found``."""
    k, depth = search_size(settings, k, depth)
    if engine is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id}: the collection has no index version "
                                               "yet")
    from regis.retrieve.explain import similar_explained

    return await run_search_id(request, engine, image_id, search=similar_explained if explain else None, k=k,
                               depth=depth, mode=mode, **extras)


@router.patch("/{image_id}", response_model=MetadataPatchResponse, responses={202: {"model": MetadataPatchResponse},
                                                                             **_ERRORS})
async def patch_metadata(
    image_id: ImageId,
    write: Annotated[ImageWrite, Depends()],
    metadata: Annotated[dict, Body(embed=True, description="JSON merge patch of the image's metadata: keys "
                                                           "replace, null removes ('file' facts are kept)")],
    replace: Annotated[bool, Query(description="replace the whole user metadata instead of merging")] = False,
    wait: Annotated[bool, Query(description="wait for the index job (up to REGIS_WRITE_WAIT_S)")] = True,
) -> dict:
    """Change an image's metadata (a new index version; the image keeps its id and tokens). Values must be JSON
    regis can store and filter on: finite numbers, 64-bit integers, valid Unicode, at most 32 levels and 64 KiB
    (else 422 ``invalid_metadata`` with the ``path`` of the bad value; nothing is written)."""
    uploads.check_metadata(metadata)
    # (a remote shard: off the loop)
    engine = write.engine
    if engine is None or await run_in_threadpool(engine.snapshot.table.get, image_id) is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id} in index version "
                                               f"{engine.snapshot.version if engine else EMPTY_VERSION}")
    spec = JobSpec(kind="metadata", ids=[image_id], metadata=metadata, replace_metadata=replace)
    info, body = await write.run(spec, image_id, wait)
    if info.state != "done":
        return body
    return {**body, "metadata": (info.result or {}).get("metadata")}


@router.get("/{image_id}/thumbnail", responses={**_ERRORS, 304: {"description": "not modified"},
                                                200: {"content": {"image/jpeg": {}, "image/webp": {}}}})
async def thumbnail(
    request: Request,
    image_id: ImageId,
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    settings: Annotated[Settings, Depends(get_settings)],
    size: Annotated[int, Query(ge=16, le=1024, description="longest side, pixels, rounded up to one of 64, 128, "
                                                           "256, 512, 1024")] = 256,
    format: Annotated[Literal["jpeg", "webp"], Query(description="image format")] = "jpeg",
) -> Response:
    """A small copy of an image (longest side ``size`` px, rounded up to one of 64, 128, 256, 512 and 1024),
    made once and cached on disk by content within REGIS_THUMBNAIL_CACHE_BYTES (least recently used go first;
    an image's thumbnails go with it); ``ETag`` and ``Cache-Control`` let browsers keep it (``If-None-Match``
    -> 304)."""
    rec = None if engine is None else await run_in_threadpool(engine.snapshot.table.get, image_id)  # (a table read
    # or a remote shard call)
    if rec is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id}")
    size = thumbnails.cache_size(size)
    etag = thumbnails.etag(rec.sha256, size, format)
    headers = {"ETag": etag, "Cache-Control": thumbnails.CACHE_CONTROL}
    if etag in (request.headers.get("if-none-match") or ""):
        return Response(status_code=304, headers=headers)
    data = await run_in_threadpool(_thumbnail_bytes, engine, settings, image_id, rec.sha256, size, format)
    return Response(data, media_type=f"image/{format}", headers=headers)


def _thumbnail_bytes(engine: QueryEngine, settings: Settings, image_id: int, sha256: str, size: int,
                     fmt: str) -> bytes:
    """The thumbnail of an indexed image (``service.thumbnails.thumbnail``), made from its file.

    Raises:
        APIError: 404 ``file_unavailable`` when the file is not on disk, also when a delete of the image removed it
            after it was found here (before, the read failed as a bad image, 400 ``invalid_image``: found by
            scripts/soak.py); as ``image_path``.
        ImageDecodeError: the file does not decode.
    """
    source = image_path(engine, settings, image_id)
    pause_point("thumbnail.source-found")
    cache = thumbnails.cache_for(settings.index_dir, settings.thumbnail_cache_bytes)
    try:
        return thumbnails.thumbnail(source, sha256, size, fmt, cache, settings.max_pixels)
    except FileNotFoundError:
        raise APIError(404, "file_unavailable", f"image {image_id} is no longer on disk (deleted meanwhile)") from None
