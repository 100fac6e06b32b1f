"""Start-up clean-up of the uploads staging area: batches whose job will never place them.

An API process stages an upload's files under ``UPLOADS_DIR/.staging/<job id>/`` and then queues the job that
moves them into place. Killed between the two (or when the job queue lost the job), the batch stays forever;
this removes such batches when a service starts.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from regis.indexes.uploads import STAGING_DIR

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
