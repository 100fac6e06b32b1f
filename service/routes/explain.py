"""POST /v1/explain: why one indexed image matches a query image, with patch-level heatmaps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, UploadFile
from starlette.concurrency import run_in_threadpool

from regis.api.explain import PairExplanation
from regis.api.schemas import ErrorResponse
from regis.retrieve.query import QueryEngine
from service.deps import get_engine, get_settings
from service.errors import APIError
from service.params import ImageIdForm
from service.routes.images import image_path
from service.routes.search import read_upload
from service.settings import Settings

router = APIRouter(tags=["search"])  # mounted at /v1 and /v1/collections/{collection} (service.app)


def _explain(engine: QueryEngine, settings: Settings, query: bytes, image_id: int) -> dict:
    from regis.retrieve.explain import ResultImageError, explain_pair

    path = image_path(engine, settings, image_id)
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise APIError(404, "file_unavailable", f"image {image_id} cannot be read from disk") from exc
    try:
        return explain_pair(engine, query, image_id, image)
    except KeyError as exc:  # deleted between the lookup and the explanation
        raise APIError(404, "image_not_found", f"no image with id {image_id} in the index") from exc
    except ResultImageError as exc:
        raise APIError(409, "file_unreadable", str(exc)) from exc


@router.post(
    "/explain",
    response_model=PairExplanation,
    responses={code: {"model": ErrorResponse} for code in (400, 404, 409, 413, 422, 503)},
)
async def explain(
    file: Annotated[UploadFile, File(description="the query image (JPEG, PNG, WebP, BMP, TIFF, GIF)")],
    id: ImageIdForm,
    engine: Annotated[QueryEngine, Depends(get_engine)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> dict:
    """Explain one result: which of its tokens each query token matched (similarity, share of the score, ROI
    boxes on both images) and a heatmap per query token over the result's patches. Re-encodes both images.
    On a sharded collection the image's shard supplies its stored tokens and buddy patches (503
    ``shards_unavailable`` when it does not answer)."""
    data = await read_upload(file, settings.max_upload_bytes)
    return await run_in_threadpool(_explain, engine, settings, data, id)
