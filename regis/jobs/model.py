"""What a job is (``JobSpec``, what the worker runs) and what clients see of it (``JobInfo``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from regis.errors import RegisError
from regis.indexes import json_values

JobKind = Literal["index", "add", "delete", "metadata"]
JobState = Literal["queued", "running", "done", "failed"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "done", "failed")
MAX_SKIPPED_REPORTED = 200  # skipped files listed in a job result (the count is always exact)


def _storable(metadata: dict) -> dict:
    """A job's metadata must be a value regis stores (``regis.indexes.json_values``): the API checks it first,
    this keeps a job from another producer (or an old queue) from writing NaN or a lone surrogate."""
    return json_values.check_value(metadata, "metadata", max_bytes=json_values.MAX_METADATA_BYTES)


class QueueUnavailableError(RegisError):
    """The job queue (Redis) cannot be reached; the message says so without internals."""


class QueueClosedError(RegisError):
    """The job queue takes no more jobs; ``code`` says why ("collection_deleted", "queue_closed")."""

    def __init__(self, message: str, code: str = "queue_closed"):
        super().__init__(message)
        self.code = code


class UploadItem(BaseModel):
    """One uploaded image of an ``add`` job (see ``regis.indexes.uploads``).

    Attributes:
        path: table path, ``.uploads/ab/<sha256>.<ext>``.
        staged: the received file, relative to the uploads folder (``.staging/<batch>/<n>.<ext>``).
        sha256: SHA-256 of the bytes, hex.
        filename: the client's file name (reported back only).
        metadata: user metadata (JSON object).
    """

    model_config = ConfigDict(extra="forbid")

    path: str
    staged: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    filename: str = ""
    metadata: dict = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _storable_metadata(cls, v: dict) -> dict:
        return _storable(v)


class JobSpec(BaseModel):
    """A job: ``index`` a folder, ``add`` uploaded images, or ``delete`` images by id.

    Attributes:
        kind: the job kind.
        folder: ``index``: the folder, relative to the images root ("" = the root itself).
        uploads: ``add``: the staged images.
        ids: ``delete``: image ids.
        collection: the collection the job writes (None: the deployment's default collection).
        collection_uid: the incarnation of ``collection`` it was submitted for (``CollectionConfig.uid``): a job
            queued before its collection was deleted is refused, even if one of that name exists again.
        metadata: ``metadata``: a JSON merge patch of the image's user metadata (``ids``: the one image).
        replace_metadata: ``metadata``: replace the user metadata instead of patching it.
    """

    model_config = ConfigDict(extra="forbid")

    kind: JobKind
    folder: str | None = None
    uploads: list[UploadItem] = Field(default_factory=list)
    ids: list[int] = Field(default_factory=list)
    collection: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    collection_uid: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    metadata: dict | None = None
    replace_metadata: bool = False

    @field_validator("metadata")
    @classmethod
    def _storable_metadata(cls, v: dict | None) -> dict | None:
        return _storable(v) if v is not None else v

    @model_validator(mode="after")
    def _fields_of_kind(self) -> JobSpec:
        if self.kind == "index" and self.folder is None:
            raise ValueError("an index job needs a folder")
        if self.kind == "add" and not self.uploads:
            raise ValueError("an add job needs at least one upload")
        if self.kind == "delete" and not self.ids:
            raise ValueError("a delete job needs at least one id")
        if self.kind == "metadata" and (len(self.ids) != 1 or self.metadata is None):
            raise ValueError("a metadata job needs one id and the metadata")
        return self

    def params(self) -> dict:
        """A short, client-facing summary of the job's parameters."""
        where = {"collection": self.collection} if self.collection else {}
        if self.kind == "index":
            return {"folder": self.folder, **where}
        if self.kind == "add":
            return {"images": len(self.uploads), **where}
        return {"ids": self.ids[:100], **where}


class JobProgress(BaseModel):
    """Where a job is.

    Attributes:
        phase: queued, scanning, embedding, writing, done.
        done: images processed so far (embedded or skipped).
        total: images to process (None until the scan is over).
        skipped: files that could not be indexed so far.
        images_per_s: processing rate since embedding started, images/s.
    """

    phase: str = "queued"
    done: int = 0
    total: int | None = None
    skipped: int = 0
    images_per_s: float = 0.0


class JobError(BaseModel):
    """Why a job failed: a stable ``code`` and a message for people."""

    code: str
    message: str


class JobInfo(BaseModel):
    """A job as ``GET /v1/jobs/{id}`` shows it. Times are ISO-8601 UTC.

    Attributes:
        id: the job id.
        kind: index, add or delete.
        state: queued, running, done or failed.
        params: the job's parameters (summary).
        submitted_at, started_at, ended_at: when it was submitted, last started, ended.
        attempts: how many times a worker started it (a job whose worker died is retried).
        progress: progress of the current or last attempt.
        result: what it did (done jobs): ``version`` (published index version, None if nothing changed) and
            counts; index jobs list ``skipped`` files with their reasons.
        error: why it failed (failed jobs).
    """

    id: str
    kind: JobKind
    state: JobState
    params: dict = Field(default_factory=dict)
    submitted_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    attempts: int = 0
    progress: JobProgress = Field(default_factory=JobProgress)
    result: dict | None = None
    error: JobError | None = None


def utc_now() -> str:
    """Now, ISO-8601 UTC with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def error_code(exc: BaseException) -> str:
    """A stable code for a regis error raised by a job (``regis.errors`` class -> snake case)."""
    from regis import errors
    from regis.indexes.collections import CollectionNotFoundError

    codes = {
        CollectionNotFoundError: "collection_not_found",
        errors.ConfigError: "invalid_job",
        errors.IndexMismatchError: "encoder_mismatch",
        errors.IndexLockedError: "index_locked",
        errors.IndexFormatError: "index_unreadable",
        errors.WeightsError: "weights_unavailable",
        errors.ImageDecodeError: "invalid_image",
    }
    for cls in type(exc).__mro__:
        if cls in codes:
            return codes[cls]
    return "job_error"
