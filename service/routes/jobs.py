"""POST /v1/jobs/index (index a folder), GET /v1/jobs/{id} (state, progress, errors), GET /v1/jobs (recent)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import ErrorResponse, IndexJobRequest, JobList
from regis.jobs.folders import FolderError, resolve_folder
from regis.jobs.model import JobInfo, JobSpec
from regis.jobs.queue import JobQueue
from service.deps import get_jobs, get_live, get_settings
from service.errors import APIError
from service.jobs import await_served
from service.live import LiveIndex
from service.settings import Settings

router = APIRouter(prefix="/jobs", tags=["jobs"])  # under /v1 and /v1/collections/{collection}

_FOLDER_STATUS = {"forbidden": (403, "folder_forbidden"), "not_found": (404, "folder_not_found"),
                  "invalid": (422, "invalid_folder")}
_SERVED_WAIT_S = 5.0  # seconds GET /v1/jobs/{id} waits for a done job's version to be served
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 403, 404, 422, 501, 503)}


@router.post("/index", response_model=JobInfo, status_code=202, responses=_ERRORS)
async def submit_index_job(
    body: IndexJobRequest,
    response: Response,
    queue: Annotated[JobQueue, Depends(get_jobs)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> JobInfo:
    """Index a folder under the images root (incremental: new and changed files are embedded, files gone
    from it are removed; other folders and uploads are left alone). Returns the queued job; follow it with
    GET /v1/jobs/{id}. Folders outside the root, with '..', or reached through a symlink leading out are
    refused (403). A sharded collection is built in the job's process, one collection version for the whole
    folder (``regis index build --ray`` distributes the embedding instead)."""
    if settings.images_root is None:
        raise APIError(403, "folder_jobs_disabled", "no images root is configured (REGIS_IMAGES_ROOT): folders "
                                                    "cannot be indexed, only uploads")
    try:
        _, rel = resolve_folder(settings.images_root, body.folder)
    except FolderError as exc:
        status, code = _FOLDER_STATUS.get(exc.reason, (422, "invalid_folder"))
        raise APIError(status, code, str(exc)) from None
    info = await run_in_threadpool(queue.submit, JobSpec(kind="index", folder=rel))
    response.headers["Location"] = f"/v1/jobs/{info.id}"
    return info


@router.get("/{job_id}", response_model=JobInfo, responses=_ERRORS)
async def get_job(
    job_id: str,
    queue: Annotated[JobQueue, Depends(get_jobs)],
    live: Annotated[LiveIndex | None, Depends(get_live)],
) -> JobInfo:
    """A job's state (queued, running, done, failed), progress (images done / total, images/s, skipped),
    result (the index version it published, counts, skipped files) or error. "done" is answered once this
    server serves the version the job published (read-your-writes: the next search or listing sees it), waiting
    up to ``_SERVED_WAIT_S`` for the index watcher; after that it answers "done" anyway."""
    info = await run_in_threadpool(queue.get, job_id)
    if info is None:
        raise APIError(404, "job_not_found", f"no job with id {job_id[:64]!r} (finished jobs expire)")
    await await_served(live, info, _SERVED_WAIT_S)
    return info


@router.get("", response_model=JobList, responses=_ERRORS)
async def list_jobs(
    queue: Annotated[JobQueue, Depends(get_jobs)],
    limit: Annotated[int, Query(ge=1, le=200, description="jobs to list")] = 20,
) -> dict:
    """The most recently submitted jobs, newest first."""
    return {"jobs": await run_in_threadpool(queue.list, limit)}
