"""Start-up clean-up of an uploads folder: what a process killed mid-write left behind.

- Staged batches no job will place (``clean_orphaned_staging``): an API process stages an upload's files under
  ``UPLOADS_DIR/.staging/<job id>/`` and then queues the job that places them. Killed between the two (or when
  the queue lost the job: an embedded queue's jobs die with their process), the batch would stay forever.
- Uploaded files no index version lists (``clean_orphaned_uploads``): a job killed after placing its files and
  before publishing (``job.placed``), or after publishing a delete and before removing the files
  (``delete.committed``), left files nothing points at; and the thumbnails of images no longer indexed. It runs
  under the uploads lock, which every add and delete job holds from placing its files to publishing, so a file
  not listed then is not about to be (a retried job places it again from its staged copy).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from regis.indexes.uploads import STAGING_DIR, is_upload_path, upload_file, uploads_lock

log = logging.getLogger("regis.uploads")
FINISHED = ("done", "failed")


def clean_orphaned_staging(uploads_dir: Path | str, job_state: Callable[[str], str | None],
                           grace_s: float = 600.0) -> list[str]:
    """Remove the staging batches no job will place.

    Args:
        uploads_dir: the uploads folder.
        job_state: the state of the job named like a batch ("queued", "running", "done", "failed"), None
            when the queue does not know it.
        grace_s: a batch the queue does not know is kept while younger than this (another API process may
            be about to queue its job), seconds.

    Returns:
        The batch names removed.
    """
    staging = Path(uploads_dir) / STAGING_DIR
    if not staging.is_dir():
        return []
    removed = []
    now = time.time()
    for batch in sorted(staging.iterdir()):
        try:
            age = now - batch.stat().st_mtime
        except FileNotFoundError:
            continue
        state = job_state(batch.name)
        if state in FINISHED or (state is None and age >= grace_s):
            shutil.rmtree(batch, ignore_errors=True)
            removed.append(batch.name)
    if removed:
        log.warning("removed %d orphaned staging batch(es) in %s", len(removed), staging)
    return removed


def clean_orphaned_uploads(uploads_dir: Path | str, index_dir: Path | str) -> list[str] | None:
    """Remove the uploaded files the live index version does not list, and the cached thumbnails of contents it
    does not hold (module docstring). Skipped (None) while a job holds the uploads lock, and for sharded
    collections (their shards' tables are read by ``regis.sharding``; their uploads are left alone).

    Returns:
        The files removed (relative to ``uploads_dir``), or None when skipped.
    """
    from regis.errors import IndexLockedError
    from regis.indexes.layout import TABLE_FILE, VERSIONS_DIR, read_current
    from regis.indexes.table import ImageTable
    from regis.indexes.thumbnails import stale_thumbnails
    from regis.sharding.layout import is_sharded

    uploads_dir, index_dir = Path(uploads_dir), Path(index_dir)
    if not uploads_dir.is_dir() or is_sharded(index_dir):
        return None
    try:
        with uploads_lock(uploads_dir, timeout_s=0.0):
            current = read_current(index_dir) if index_dir.is_dir() else None
            rows: list[tuple[str, str]] = []
            if current is not None:
                table = ImageTable(index_dir / VERSIONS_DIR / current / TABLE_FILE)
                try:
                    rows = table.paths_and_hashes()
                finally:
                    table.close()
            listed = {upload_file(uploads_dir, path) for path, _ in rows if is_upload_path(path)}
            removed = []
            for sub in uploads_dir.iterdir():
                if len(sub.name) != 2 or not sub.is_dir():
                    continue
                for f in sub.iterdir():
                    if f not in listed:
                        f.unlink(missing_ok=True)
                        removed.append(f"{sub.name}/{f.name}")
            stale = stale_thumbnails(index_dir, {sha for _, sha in rows})
            for f in stale:
                f.unlink(missing_ok=True)
    except IndexLockedError:
        log.info("uploads in %s are being written: their clean-up waits for the next start", uploads_dir)
        return None
    if removed or stale:
        log.warning("removed %d uploaded file(s) no index version lists and %d stale thumbnail(s) (%s)",
                    len(removed), len(stale), uploads_dir)
    return removed
