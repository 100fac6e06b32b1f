"""POST /v1/search/batch: several query images in one request, through the batched search path."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Query, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import BatchSearchResponse, ErrorResponse
from regis.retrieve.query import QueryEngine
from service.deps import get_engine_or_empty, get_settings, search_extras, search_size
from service.errors import APIError
from service.routes.search import read_upload
from service.searching import check_query_images, empty_search, run_search_batch
from service.settings import Settings

router = APIRouter(tags=["search"])  # mounted at /v1 and /v1/collections/{collection} (service.app)


@router.post("/search/batch", response_model=BatchSearchResponse, response_model_exclude_unset=True,
             responses={code: {"model": ErrorResponse} for code in (400, 413, 422, 503)})
async def search_batch(
    request: Request,
    files: Annotated[list[UploadFile], File(description="query images, one result list each, in order")],
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    settings: Annotated[Settings, Depends(get_settings)],
    extras: Annotated[dict, Depends(search_extras)],
    k: Annotated[int | None, Query(ge=1, le=1000, description="results per query")] = None,
    depth: Annotated[int | None, Query(ge=1, le=4096, description="candidates per query token (k')")] = None,
    mode: Annotated[Literal["ann", "exact"], Query(description="ann: candidates + rerank; exact: score all")] = "ann",
    explain: Annotated[bool, Query(description="add each result's explanation and each query's tokens, as "
                                               "POST /search?explain=true (the images are then searched one by one)")]
    = False,
) -> dict:
    """Rank the indexed images for each uploaded image: one encoder pass and one batched candidate search for
    all of them (the same results as one request per image). At most REGIS_MAX_UPLOAD_FILES images. With
    ``explain=true`` each image is searched and explained as by ``POST /search?explain=true``. A collection with
    no published version yet answers one empty result list per image (each image still decoded: a non-image is
    a 400)."""
    k, depth = search_size(settings, k, depth)
    if len(files) > settings.max_upload_files:
        raise APIError(413, "too_many_files", f"at most {settings.max_upload_files} query images per request")
    images = [await read_upload(f, settings.max_upload_bytes) for f in files]
    if engine is None:
        await check_query_images(images, settings.max_pixels)
        return {"results": [empty_search(k, depth, mode) for _ in images]}
    if explain:
        results = await run_in_threadpool(_explained_one_by_one, engine, images, k=k, depth=depth, mode=mode,
                                          **extras)
        for r in results:
            request.app.state.metrics.observe_search(r["timings_ms"])
        return {"results": results}
    results = await run_search_batch(request, engine, images, k=k, depth=depth, mode=mode, **extras)
    return {"results": results}


def _explained_one_by_one(engine: QueryEngine, images: list[bytes], **params) -> list[dict]:
    """``regis.retrieve.explain.search_explained`` of each image in turn (each explanation needs its query's own
    buddy patches, which the batched encoder pass does not keep).

    Raises:
        ImageDecodeError: an image does not decode (the message names it: "image 2: ...").
    """
    from regis.errors import ImageDecodeError
    from regis.retrieve.explain import search_explained

    results = []
    for n, data in enumerate(images):
        try:
            results.append(search_explained(engine, data, **params))
        except ImageDecodeError as exc:
            raise ImageDecodeError(f"image {n + 1}: {exc}") from None
    return results
