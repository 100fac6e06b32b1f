"""GET /v1/images/{id} (metadata), GET /v1/images/{id}/file (the image bytes), POST /v1/images (upload and
index images), DELETE /v1/images/{id}."""

from __future__ import annotations

import mimetypes
import os
from email.utils import formatdate
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, Response, UploadFile
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import DeleteResponse, ErrorResponse, ImageInfo, UploadResponse
from regis.faults import crash_point, pause_point
from regis.indexes.uploads import is_upload_path, upload_file
from regis.jobs.model import JobSpec
from regis.jobs.queue import JobQueue, new_job_id
from regis.retrieve.query import QueryEngine
from service import uploads
from service.deps import ImageWrite, check_collection_exists, get_engine_or_empty, get_jobs, get_live, get_settings
from service.errors import APIError
from service.jobs import await_job
from service.live import LiveIndex
from service.params import ImageId
from service.routes.search import read_upload
from service.settings import Settings

router = APIRouter(prefix="/images", tags=["images"])  # under /v1 and /v1/collections/{collection}


def _record(engine: QueryEngine | None, image_id: int):
    """(snapshot, row) of an indexed image.

    Raises:
        APIError: 404 ``image_not_found`` (not in the version served, or the collection has none yet).
    """
    if engine is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id}: the collection has no index version "
                                               "yet")
    snapshot = engine.snapshot
    rec = snapshot.table.get(image_id)
    if rec is None:
        raise APIError(404, "image_not_found", f"no image with id {image_id} in index version {snapshot.version}")
    return snapshot, rec


@router.get("/{image_id}", response_model=ImageInfo, responses={404: {"model": ErrorResponse}})
def image_info(image_id: ImageId, engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)]) -> dict:
    """The table row of an indexed image."""
    snapshot, rec = _record(engine, image_id)
    return {**rec.__dict__, "index_version": snapshot.version}


@router.get("/{image_id}/file", responses={404: {"model": ErrorResponse}, 200: {"content": {"image/*": {}}}})
def image_file(
    image_id: ImageId,
    engine: Annotated[QueryEngine | None, Depends(get_engine_or_empty)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> StreamingResponse:
    """The bytes of an indexed image, read from the indexed folder (or the uploads folder).

    The file is opened here, before the answer starts: a delete that removes it afterwards cannot break the answer
    (the open file stays readable), and one that removed it between the look-up and the open answers 404.

    Raises:
        APIError: 404 ``image_not_found`` (no such id) or ``file_unavailable`` (not on disk any more, also when a
            delete of the image removed it after it was found: before, Starlette's FileResponse raised and the
            client got 500).
    """
    path = image_path(engine, settings, image_id)
    pause_point("image-file.found")
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise APIError(404, "file_unavailable", f"image {image_id} is no longer on disk (deleted meanwhile)") from None
    return file_stream(handle, mimetypes.guess_type(path.name)[0] or "application/octet-stream")


def file_stream(handle, media_type: str, chunk_bytes: int = 1 << 16) -> StreamingResponse:
    """A 200 answer that streams an open binary file in ``chunk_bytes`` pieces and closes it, with Content-Length,
    Last-Modified and an ETag from the open file's stat (as Starlette's FileResponse would give)."""
    st = os.fstat(handle.fileno())

    def chunks():
        with handle:
            while block := handle.read(chunk_bytes):
                yield block

    headers = {"content-length": str(st.st_size), "last-modified": formatdate(st.st_mtime, usegmt=True),
               "etag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"'}
    return StreamingResponse(chunks(), media_type=media_type, headers=headers)


def image_path(engine: QueryEngine | None, settings: Settings, image_id: int) -> Path:
    """Where the file of an indexed image is (the uploads folder, or the indexed folder).

    Raises:
        APIError: 404 ``image_not_found`` (no such id) or ``file_unavailable`` (not on disk any more).
    """
    snapshot, rec = _record(engine, image_id)
    if is_upload_path(rec.path):  # uploads live in the uploads folder, content-addressed
        path = upload_file(settings.resolved_uploads_dir(), rec.path)
        if not path.is_file():
            raise APIError(404, "file_unavailable", f"image {image_id} is no longer on disk")
        return path
    root = settings.images_root or snapshot.manifest.images_root
    if root is None:
        raise APIError(404, "file_unavailable", "this index has no image folder to serve files from")
    root = Path(root).resolve()
    path = (root / rec.path).resolve()
    if not path.is_relative_to(root):
        raise APIError(404, "file_unavailable", "the image path lies outside the indexed folder")
    if not path.is_file():
        raise APIError(404, "file_unavailable", f"image {image_id} is no longer on disk ({rec.path})")
    return path



# ---------------------------------------------------------------- writes: each one an index job
_WRITE_ERRORS = {code: {"model": ErrorResponse} for code in (400, 403, 404, 409, 413, 415, 422, 500, 503)}


@router.post("", response_model=UploadResponse, status_code=201, responses={202: {"model": UploadResponse},
                                                                           **_WRITE_ERRORS})
async def upload_images(
    request: Request,
    response: Response,
    files: Annotated[list[UploadFile], File(min_length=1, description="one or more images (JPEG, PNG, WebP, BMP, "
                                                                     "TIFF, GIF)")],
    queue: Annotated[JobQueue, Depends(get_jobs)],
    settings: Annotated[Settings, Depends(get_settings)],
    live: Annotated[LiveIndex, Depends(get_live)],
    metadata: Annotated[str | None, Form(description="JSON: one object for every file, or a list of one object "
                                                     "per file")] = None,
    wait: Annotated[bool, Query(description="wait for the index job (up to REGIS_WRITE_WAIT_S)")] = True,
) -> dict:
    """Add images to the index; returns their ids (201) once the new index version answers searches, or the
    job id (202) if the job takes longer than the wait. The same bytes uploaded again are the same image
    (status ``exists``; given metadata replaces the stored one). Every file must decode, or nothing is added."""
    uploads.check_request_size(request, settings)
    if len(files) > settings.max_upload_files:
        raise APIError(413, "too_many_files", f"at most {settings.max_upload_files} files per request")
    metas = uploads.parse_metadata(metadata, len(files))
    job_id = new_job_id()
    items = []
    try:  # one file in memory at a time: read, decode-check, stage
        for n, (f, meta) in enumerate(zip(files, metas, strict=True)):
            received = [(f.filename or f"file {n + 1}", await read_upload(f, settings.max_upload_bytes))]
            items += await run_in_threadpool(uploads.check_and_stage, received, [meta], settings, job_id, n)
            del received
    except OSError:
        uploads.discard_staged(settings, job_id)
        check_collection_exists(request)  # deleted under the request: 404, not the OS error of its tombstone
        raise
    except BaseException:
        uploads.discard_staged(settings, job_id)
        raise
    crash_point("upload.staged")
    try:
        info = await run_in_threadpool(queue.submit, JobSpec(kind="add", uploads=items), job_id)
    except BaseException:
        uploads.discard_staged(settings, job_id)
        raise
    if wait and settings.write_wait_s > 0:
        info = await await_job(queue, live, job_id, settings.write_wait_s) or info
    if info.state == "failed":
        raise uploads.job_failure(info)
    if info.state != "done":
        response.status_code = 202
        response.headers["Location"] = f"/v1/jobs/{job_id}"
        images = [{"filename": it.filename, "sha256": it.sha256, "status": "pending"} for it in items]
        return {"job_id": job_id, "state": info.state, "index_version": live.version, "images": images}
    return {"job_id": job_id, "state": "done", "index_version": live.version, "images": info.result["images"]}


@router.delete("/{image_id}", response_model=DeleteResponse, responses={202: {"model": DeleteResponse},
                                                                      **_WRITE_ERRORS})
async def delete_image(
    image_id: ImageId,
    write: Annotated[ImageWrite, Depends()],
    wait: Annotated[bool, Query(description="wait for the index job (up to REGIS_WRITE_WAIT_S)")] = True,
) -> dict:
    """Remove an image from the index (its id is never reused; an uploaded file is deleted too). 200 once the
    new index version answers searches, 202 with the job id if the job takes longer than the wait.
    An image indexed from a folder comes back with the next scan of that folder if its file is still there."""
    await run_in_threadpool(_record, write.engine, image_id)  # (a remote shard on Ray: never block the loop)
    info, body = await write.run(JobSpec(kind="delete", ids=[image_id]), image_id, wait)
    if info.state != "done":
        return {**body, "deleted": False}
    return {**body, "deleted": image_id in (info.result or {}).get("deleted", [])}
