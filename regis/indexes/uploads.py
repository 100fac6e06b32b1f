"""Uploaded images: where their files live and how the image table names them.

An index mirrors folders below its ``images_root`` (image table paths are relative to it) and may also hold
images uploaded over HTTP. Uploads are stored content-addressed in an uploads folder::

    UPLOADS_DIR/
      ab/abcdef...0123.jpg          the file, named by the SHA-256 of its bytes (extension from its format)
      .staging/<job id>/<n>.jpg     files received by the API, moved into place by the job that indexes them

and their table path is ``.uploads/ab/abcdef...0123.jpg``. A folder scan skips hidden names, so it never
produces a path starting with ``.uploads/``: the prefix tells uploads from scanned files unambiguously, an
incremental build leaves them alone, and the service resolves them against the uploads folder (which may, but
need not, be ``images_root/.uploads``). The same bytes uploaded twice are one image.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

from regis.errors import ConfigError
from regis.indexes.locks import acquire_flock, release_flock

UPLOADS_PREFIX = ".uploads/"
STAGING_DIR = ".staging"
LOCK_FILE = ".lock"
# The image formats regis decodes, by PIL format name -> file extension of the stored upload.
FORMAT_EXTENSIONS = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp", "TIFF": ".tif", "GIF": ".gif",
                     "MPO": ".jpg"}
_UPLOAD_PATH = re.compile(r"^\.uploads/([0-9a-f]{2})/([0-9a-f]{64})(\.[a-z]{3,4})$")
_STAGED_PATH = re.compile(r"^\.staging/[0-9a-f]{32}/[0-9]{1,6}(\.[a-z]{3,4})$")


def is_upload_path(path: str) -> bool:
    """Whether an image table path names an uploaded file (``.uploads/...``)."""
    return path.startswith(UPLOADS_PREFIX)


def upload_table_path(sha256: str, fmt: str) -> str:
    """Table path of an upload with content hash ``sha256`` (hex) and PIL format name ``fmt``.

    Raises:
        ConfigError: not a hex SHA-256, or a format regis does not index.
    """
    ext = FORMAT_EXTENSIONS.get(fmt.upper())
    if ext is None:
        raise ConfigError(f"unsupported upload format {fmt!r}")
    path = f"{UPLOADS_PREFIX}{sha256[:2]}/{sha256}{ext}"
    if not _UPLOAD_PATH.match(path):
        raise ConfigError("an upload is named by the hex SHA-256 of its bytes")
    return path


def upload_file(uploads_dir: Path | str, table_path: str) -> Path:
    """Where the file of upload ``table_path`` is stored.

    Raises:
        ConfigError: ``table_path`` is not a well-formed upload path (so it can never escape ``uploads_dir``).
    """
    m = _UPLOAD_PATH.match(table_path)
    if m is None:
        raise ConfigError(f"{table_path!r} is not an upload path")
    return Path(uploads_dir) / m.group(1) / f"{m.group(2)}{m.group(3)}"


def staged_file(uploads_dir: Path | str, staged: str) -> Path:
    """Absolute path of a staged upload (``.staging/<batch>/<n>.<ext>``, relative to ``uploads_dir``).

    Raises:
        ConfigError: a malformed staged path (it could otherwise point anywhere).
    """
    if not _STAGED_PATH.match(staged):
        raise ConfigError(f"{staged!r} is not a staged upload path")
    return Path(uploads_dir) / staged


def new_staging_batch() -> str:
    """A fresh staging batch name (32 hex digits)."""
    return uuid.uuid4().hex


def stage_upload(uploads_dir: Path | str, batch: str, n: int, data: bytes, fmt: str) -> tuple[str, str, str]:
    """Write received bytes to the staging area (fsync'ed), for a job to move into place.

    Args:
        uploads_dir: the uploads folder (created if missing).
        batch: staging batch name from ``new_staging_batch``.
        n: the file's number in the batch.
        data: the file's bytes (already checked to decode).
        fmt: PIL format name of the decoded image.

    Returns:
        (staged path relative to ``uploads_dir``, table path, SHA-256 hex).
    """
    sha = hashlib.sha256(data).hexdigest()
    table_path = upload_table_path(sha, fmt)
    staged = f"{STAGING_DIR}/{batch}/{n}{Path(table_path).suffix}"
    target = staged_file(uploads_dir, staged)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return staged, table_path, sha


def place_upload(uploads_dir: Path | str, staged: str, table_path: str) -> Path:
    """Put a staged file in its content-addressed place (atomic; a no-op if the content is already there). The
    staged file stays until its job ends (the job removes its batch): a placed file the index does not list yet
    is an orphan the start-up clean-up may remove (``clean_orphaned_uploads``), and a retry of the job places it
    again from the staging area.

    Returns:
        The stored file.

    Raises:
        FileNotFoundError: neither the staged file nor the stored one exists.
    """
    final = upload_file(uploads_dir, table_path)
    source = staged_file(uploads_dir, staged)
    if final.is_file():
        return final
    final.parent.mkdir(exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}")
    try:  # same file system: the staging area is inside the uploads folder
        os.link(source, tmp)
    except FileNotFoundError:
        raise
    except OSError:  # no hard links here: copy
        import shutil

        shutil.copyfile(source, tmp)
    os.replace(tmp, final)
    return final


@contextlib.contextmanager
def uploads_lock(uploads_dir: Path | str, timeout_s: float = 0.0) -> Iterator[None]:
    """Hold the uploads folder's exclusive ``flock`` (placing and removing files). Take it before an index's
    write lock, never after, so that two writers cannot deadlock.

    Raises:
        IndexLockedError: another process holds it for more than ``timeout_s`` seconds.
    """
    folder = Path(uploads_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = acquire_flock(folder / LOCK_FILE, timeout_s, f"another process is changing the uploads in {folder}",
                       poll_s=0.05)
    try:
        yield
    finally:
        release_flock(fd)


def default_uploads_dir(index_dir: Path | str, images_root: Path | str | None) -> Path:
    """Where uploads go unless configured: ``images_root/.uploads`` (so their table paths are literally
    relative to the images root), or ``index_dir/uploads`` for a service without an images root."""
    return Path(images_root) / ".uploads" if images_root is not None else Path(index_dir) / "uploads"
