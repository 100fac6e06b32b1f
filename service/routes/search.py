"""POST /v1/search: query by image."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Query, Request, Response, UploadFile
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import ErrorResponse, SearchResponse
from regis.retrieve.query import QueryEngine
from service.deps import get_engine_or_empty, get_settings, search_extras, search_size
from service.errors import APIError
from service.searching import check_query_images, empty_search, run_search
from service.settings import Settings

router = APIRouter(tags=["search"])  # mounted at /v1 and /v1/collections/{collection} (service.app)


async def read_upload(file: UploadFile, limit: int) -> bytes:
    """Read an upload, refusing more than ``limit`` bytes (413) without reading the rest."""
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise APIError(413, "payload_too_large", f"upload is larger than the limit of {limit:,} bytes")
    return data


@router.post(
    "/search",
    response_model=SearchResponse,
    responses={code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 503)},
)
async def search(
    request: Request,
    response: Response,
    file: Annotated[UploadFile, File(description="the query image (JPEG, PNG, WebP, BMP, TIFF, GIF)")],
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    settings: Annotated[Settings, Depends(get_settings)],
    k: Annotated[int | None, Query(ge=1, le=1000, description="results to return")] = None,
    depth: Annotated[
        int | None, Query(ge=1, le=4096, description="candidates: FAISS neighbours per query token (k')")
    ] = None,
    mode: Annotated[Literal["ann", "exact"], Query(description="ann: candidates + rerank; exact: score all")] = "ann",
    explain: Annotated[bool, Query(description="add each result's explanation (which result token each query "
                                               "token matched, its similarity and share of the score, ROI boxes) "
                                               "and the query's tokens; on a sharded collection each result's "
                                               "shard explains it")] = False,
    extras: Annotated[dict, Depends(search_extras)] = None,
) -> dict:
    """Rank the indexed images by MaxSim similarity to the uploaded image (with ``explain=true``: and say why).
    A collection with no published version yet answers 200 with no results (``index_version`` 0, timings 0);
    the upload is still decoded once, so a non-image is a 400 there too."""
    k, depth = search_size(settings, k, depth)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.max_upload_bytes + 64 * 1024:
        raise APIError(
            413, "payload_too_large", f"upload is larger than the limit of {settings.max_upload_bytes:,} bytes"
        )
    data = await read_upload(file, settings.max_upload_bytes)
    if engine is None:
        await check_query_images([data], settings.max_pixels)
        return empty_search(k, depth, mode)
    if explain:
        from regis.retrieve.explain import search_explained

        result = await run_in_threadpool(search_explained, engine, data, k=k, depth=depth, mode=mode, **extras)
        request.app.state.metrics.observe_search(result["timings_ms"])
        return result
    return await run_search(request, response, engine, data, k=k, depth=depth, mode=mode, **extras)
