"""GET /v1/images/{id} (metadata) and GET /v1/images/{id}/file (the image bytes)."""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse

from regis.retrieve.query import QueryEngine
from service.deps import get_engine, get_settings
from service.errors import APIError
from service.schemas import ErrorResponse, ImageInfo
from service.settings import Settings

router = APIRouter(prefix="/v1/images", tags=["images"])


def _record(engine: QueryEngine, image_id: int):
    snapshot = engine.snapshot
    rec = snapshot.table.get(image_id)
    if rec is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id} in index version {snapshot.version}")
    return snapshot, rec


@router.get("/{image_id}", response_model=ImageInfo, responses={404: {"model": ErrorResponse}})
def image_info(image_id: int, engine: Annotated[QueryEngine, Depends(get_engine)]) -> dict:
    """The table row of an indexed image."""
    snapshot, rec = _record(engine, image_id)
    return {**rec.__dict__, "index_version": snapshot.version}


@router.get("/{image_id}/file", responses={404: {"model": ErrorResponse}, 200: {"content": {"image/*": {}}}})
def image_file(
    image_id: int,
    engine: Annotated[QueryEngine, Depends(get_engine)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> FileResponse:
    """The bytes of an indexed image, read from the indexed folder."""
    snapshot, rec = _record(engine, image_id)
    root = settings.images_root or snapshot.manifest.images_root
    if root is None:
        raise APIError(404, "file_unavailable", "this index has no image folder to serve files from")
    root = Path(root).resolve()
    path = (root / rec.path).resolve()
    if not path.is_relative_to(root):
        raise APIError(404, "file_unavailable", "the image path lies outside the indexed folder")
    if not path.is_file():
        raise APIError(404, "file_unavailable", f"image {image_id} is no longer on disk ({rec.path})")
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media_type)
