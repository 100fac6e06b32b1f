"""Checking and staging uploaded images for an ``add`` job (POST /v1/images).

Every file must decode as an image within the pixel limit before anything is stored; the files are then
written to the uploads folder's staging area and the job moves them to their content-addressed place under the
index write lock (``regis.indexes.uploads``).
"""

from __future__ import annotations

import shutil

from fastapi import Request

from regis.errors import ConfigError, ImageDecodeError, ImageTooLargeError
from regis.images.decode import decode_image
from regis.indexes import json_values
from regis.indexes.uploads import STAGING_DIR, stage_upload, upload_table_path
from regis.jobs.model import JobInfo, UploadItem
from service.errors import APIError

MAX_METADATA_BYTES = json_values.MAX_METADATA_BYTES
_FAILURE_STATUS = {"invalid_job": 422, "invalid_image": 422, "encoder_mismatch": 409, "index_locked": 409,
                   "index_unreadable": 503, "weights_unavailable": 503,
                   # the collection was deleted while the write waited for its job (cancelled, or refused by the
                   # job): the same 404 as a write sent after the delete (was 500; found by scripts/soak.py)
                   "collection_not_found": 404, "collection_deleted": 404}
_FAILURE_CODE = {"collection_deleted": "collection_not_found"}


def check_request_size(request: Request, settings) -> None:
    """Refuse (413) a request whose declared size exceeds what the limits allow, before reading it."""
    declared = request.headers.get("content-length")
    limit = settings.max_upload_files * (settings.max_upload_bytes + 64 * 1024) + MAX_METADATA_BYTES
    if declared and declared.isdigit() and int(declared) > limit:
        raise APIError(413, "payload_too_large", f"request is larger than the limit of {limit:,} bytes")


def invalid_metadata(exc: json_values.InvalidValueError) -> APIError:
    """The 422 for metadata regis does not store, with the path of the bad value."""
    return APIError(422, "invalid_metadata", str(exc), path=exc.path)


def check_metadata(value: dict) -> dict:
    """``value`` if regis can store it as an image's metadata (``regis.indexes.json_values``: finite numbers,
    64-bit integers, valid Unicode, at most 32 levels and 64 KiB).

    Raises:
        APIError: 422 ``invalid_metadata`` naming the bad value's path.
    """
    try:
        return json_values.check_value(value, "metadata", max_bytes=MAX_METADATA_BYTES)
    except json_values.InvalidValueError as exc:
        raise invalid_metadata(exc) from None


def parse_metadata(raw: str | None, n_files: int) -> list[dict]:
    """One metadata object per file from the ``metadata`` form field (JSON object for all, or a list), each a
    value ``check_metadata`` accepts.

    Raises:
        APIError: 422 for invalid JSON, a wrong shape, more than 64 KiB, or a value regis does not store (the
            error names its path).
    """
    if raw is None or raw.strip() == "":
        return [{} for _ in range(n_files)]
    try:
        value = json_values.loads(raw, "metadata", max_bytes=MAX_METADATA_BYTES)
    except json_values.InvalidValueError as exc:
        raise invalid_metadata(exc) from None
    if isinstance(value, dict):
        return [dict(value) for _ in range(n_files)]
    if isinstance(value, list) and len(value) == n_files and all(isinstance(v, dict) for v in value):
        return value
    raise APIError(422, "invalid_metadata", f"metadata must be a JSON object, or a list of {n_files} objects "
                                            "(one per file)")


def check_and_stage(received: list[tuple[str, bytes]], metas: list[dict], settings, batch: str,
                    start: int = 0) -> list[UploadItem]:
    """Decode-check every file, then stage them all (blocking; run it in a thread). ``start`` numbers the
    first file in the batch (a request staged one file at a time holds one file's bytes in memory).

    Raises:
        APIError: 400 (not an image), 413 (over the pixel limit), 415 (a format regis does not index); the
            message names the file. Nothing is staged then.
    """
    checked = []
    for n, (name, data) in enumerate(received, start):
        label = f"file {n + 1} ({name[:100]!r})"
        try:
            decoded = decode_image(data, max_pixels=settings.max_pixels, draft_size=256)
        except ImageTooLargeError as exc:
            raise APIError(413, "image_too_large", f"{label}: {exc}") from None
        except ImageDecodeError as exc:
            raise APIError(400, "invalid_image", f"{label}: {exc}") from None
        try:
            upload_table_path("0" * 64, decoded.format)
        except ConfigError:
            raise APIError(415, "unsupported_format", f"{label}: {decoded.format} images are not indexed") from None
        checked.append((name, data, decoded.format))
    uploads_dir = settings.resolved_uploads_dir()
    items = []
    try:
        for n, ((name, data, fmt), meta) in enumerate(zip(checked, metas, strict=True), start):
            staged, path, sha = stage_upload(uploads_dir, batch, n, data, fmt)
            items.append(UploadItem(path=path, staged=staged, sha256=sha, filename=name[:255], metadata=meta))
    except OSError:
        discard_staged(settings, batch)
        raise
    return items


def discard_staged(settings, batch: str) -> None:
    """Remove a staging batch (its job was never queued)."""
    shutil.rmtree(settings.resolved_uploads_dir() / STAGING_DIR / batch, ignore_errors=True)


def job_failure(info: JobInfo) -> APIError:
    """The error response for a write whose job failed (status by the job's error code; the job id is in the
    message so the client can look it up)."""
    code = info.error.code if info.error else "job_failed"
    message = info.error.message if info.error else "the job failed"
    return APIError(_FAILURE_STATUS.get(code, 500), _FAILURE_CODE.get(code, code), f"{message} (job {info.id})")
