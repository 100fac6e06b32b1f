"""Snapshots over REST (``regis.backups``): POST /v1/collections/{collection}/snapshots (take one: the state the
collection publishes now, while writes go on), GET .../snapshots (list), GET .../snapshots/{snapshot} (download the
tar), POST .../snapshots/{snapshot}/restore (a new collection from it). Snapshot files live in
``REGIS_SNAPSHOTS_DIR/<collection>/``; a file copied there from another machine is restored the same way
(``regis collections restore FILE NAME`` does it from the command line)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from regis.api.schemas import CollectionInfo, ErrorResponse
from service.collections import CollectionRegistry
from service.deps import collection_path, get_jobs, get_registry
from service.errors import APIError

router = APIRouter(prefix="/v1/collections/{collection}/snapshots", tags=["snapshots"])
_ERRORS = {code: {"model": ErrorResponse} for code in (403, 404, 409, 422, 503)}
SNAPSHOT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}-\d{8}T\d{6}Z-[0-9a-f]{6}\.tar$"
_SNAPSHOT = re.compile(SNAPSHOT_PATTERN)


class SnapshotInfo(BaseModel):
    """A snapshot file: its name, size, and the published state it holds."""

    name: str
    bytes: int
    kind: str = Field(description='"index" or "sharded"')
    version: int = Field(description="the collection version it holds")
    images: int
    created_at: str


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class RestoreRequest(BaseModel):
    """Restore a snapshot into a new collection."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="the new collection (must not exist)")


def _registry(request: Request) -> CollectionRegistry:
    registry = get_registry(request)
    if registry is None:
        raise APIError(503, "index_unavailable", "the service has not loaded its collections")
    return registry


def _folder(request: Request, collection: str) -> Path:
    return request.app.state.settings.resolved_snapshots_dir() / collection


def _write_scope(request: Request) -> None:
    from service.auth import require_write

    require_write(request)


def _info(path: Path) -> SnapshotInfo:
    from regis.backups.restore import read_snapshot_manifest

    m = read_snapshot_manifest(path)
    return SnapshotInfo(name=path.name, bytes=path.stat().st_size, kind=m["kind"], version=m["version"],
                        images=m["images"], created_at=m["created_at"])


def _take(request: Request, registry: CollectionRegistry, collection: str) -> SnapshotInfo:
    import uuid
    from datetime import datetime, timezone

    from regis.backups.snapshot import snapshot

    if not registry.exists(collection):
        raise APIError(404, "collection_not_found", f"no collection named {collection!r}")
    settings = registry.settings_for(collection)
    folder = _folder(request, collection)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = folder / f"{collection}-{stamp}-{uuid.uuid4().hex[:6]}.tar"
    snapshot(settings.index_dir, out, uploads_dir=settings.resolved_uploads_dir())
    return _info(out)


@router.post("", response_model=SnapshotInfo, status_code=201, responses=_ERRORS, dependencies=[Depends(_write_scope)])
async def create_snapshot(request: Request, collection: Annotated[str, Depends(collection_path)]) -> SnapshotInfo:
    """Write the state the collection publishes now (one version; every shard's for a sharded collection; its
    uploaded files included) to a tar file, while writes go on. 409 ``nothing_to_snapshot`` before its first
    version."""
    from regis.errors import IndexFormatError

    registry = _registry(request)
    try:
        return await run_in_threadpool(_take, request, registry, collection)
    except IndexFormatError:
        raise APIError(409, "nothing_to_snapshot", f"collection {collection!r} has no published version yet") from None


@router.get("", response_model=SnapshotList, responses=_ERRORS)
async def list_snapshots(request: Request, collection: Annotated[str, Depends(collection_path)]) -> dict:
    """The collection's snapshot files, newest first."""
    folder = _folder(request, collection)

    def read() -> list[SnapshotInfo]:
        from regis.errors import IndexFormatError

        out = []
        for path in sorted(folder.glob("*.tar"), reverse=True) if folder.is_dir() else []:
            if _SNAPSHOT.match(path.name):
                try:
                    out.append(_info(path))
                except IndexFormatError:
                    continue
        return out

    return {"snapshots": await run_in_threadpool(read)}


def _snapshot_file(request: Request, collection: str, snapshot: str) -> Path:
    path = _folder(request, collection) / snapshot
    if not path.is_file():
        raise APIError(404, "snapshot_not_found", f"no snapshot {snapshot!r} of collection {collection!r}")
    return path


SnapshotName = Annotated[str, PathParam(pattern=SNAPSHOT_PATTERN, max_length=120,
                                        description="a snapshot file name (GET .../snapshots lists them)")]


@router.get("/{snapshot}", responses={**_ERRORS, 200: {"content": {"application/x-tar": {}}}})
async def download_snapshot(request: Request, collection: Annotated[str, Depends(collection_path)],
                            snapshot: SnapshotName) -> FileResponse:
    """The snapshot file (a tar; ``regis collections restore FILE NAME`` restores it on another machine)."""
    return FileResponse(_snapshot_file(request, collection, snapshot), media_type="application/x-tar",
                        filename=snapshot)


@router.post("/{snapshot}/restore", response_model=CollectionInfo, status_code=201, responses=_ERRORS,
             dependencies=[Depends(get_jobs)])
async def restore_snapshot(request: Request, collection: Annotated[str, Depends(collection_path)],
                           snapshot: SnapshotName, body: RestoreRequest) -> dict:
    """Create collection ``name`` from the snapshot (checked file by file): it answers every search as the
    snapshot's collection did at its version. Needs a service that takes writes and a collections root."""
    from regis.backups.restore import restore

    registry = _registry(request)
    path = _snapshot_file(request, collection, snapshot)
    if registry.root is None:
        raise APIError(404, "collections_disabled", "this service serves one index; set REGIS_COLLECTIONS_ROOT to "
                                                    "restore snapshots as collections")
    if registry.exists(body.name):
        raise APIError(409, "collection_exists", f"collection {body.name!r} exists already")
    await run_in_threadpool(restore, path, registry.root.path(body.name))
    return await run_in_threadpool(registry.describe, body.name)
