"""Named crash points for fault-injection tests: ``REGIS_CRASH_AT=<point>`` makes the process SIGKILL itself
when it reaches that point, so a test kills inside the window it names every time (not at a random moment of
interpreter start-up). Unset, a crash point costs one dictionary lookup.

Points (where the window is):
    ``writer.segment-written``   index writer: the new token segment is on disk, no version published yet.
    ``writer.version-renamed``   index writer: the version directory is in place, CURRENT not yet replaced.
    ``sharded.shard-renamed``    sharded writer: a changed shard's version is renamed into place (not live: no
                                 collection record lists it yet); with two changed shards, between their renames.
    ``sharded.record-written``   sharded writer: the collection record is replaced (the write is live), the
                                 shards' CURRENT hints not yet written.
    ``upload.staged``            API: an upload's files are staged, its job not yet queued.
    ``job.placed``               job: uploaded files moved to their content-addressed place, index not yet
                                 written.
    ``delete.committed``         delete job: the version without the images is live, their uploaded files and
                                 thumbnails not yet removed (the next start removes them).
    ``build.staging-unnamed``    folder build: an embedded batch's staging file is written under its temporary name,
                                 not yet renamed into ``INDEX/resume`` (``indexer.resume``).
    ``build.batch-staged``       folder build: a batch is staged, the build not committed (the next run resumes).
    ``job.published``            job (index, add, delete, metadata): its new version is live, the job not yet reported
                                 done (a re-run then replays the result: ``indexer.job_record``).
    ``worker.maintenance-locked`` worker: it holds its queue's registry-cleaning lock (RQ), the registries not
                                 yet cleaned (also a pause point).

Named pause points hold a process inside a window instead of killing it: ``REGIS_PAUSE_AT=<point>`` with
``REGIS_PAUSE_RELEASE=PATH`` makes the process, at that point, create ``PATH.reached`` and wait until ``PATH``
exists (later passes through the point then go on at once), so a test can act on the rest of the system (kill
Redis, say) while the process is in the window, however fast the machine is.

Pause points:
    ``build.batch-reported``     folder build: a batch is embedded and its progress reported, the next batch not
                                 yet embedded (the job is under way, nothing committed).
    ``worker.maintenance-locked`` worker: as the crash point of that name (a test kills Redis in the window).
    ``snapshot.state-read``      snapshot: the published state is read, its files not yet linked (writes that
                                 go on may collect them: the snapshot starts over from the newer state).
    ``engine.version-unopened``  API: a request found its collection's published version not opened yet (CURRENT
                                 names one, the live index holds none), not yet opened (a delete may come between).
    ``thumbnail.source-found``   API: a thumbnail's source file is found on disk, not yet read (a delete of the
                                 image may remove it between).
    ``image-file.found``         API: ``GET /v1/images/{id}/file`` found the image's file on disk, not yet opened
                                 (a delete of the image may remove it between).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_ENV = "REGIS_CRASH_AT"
PAUSE_ENV = "REGIS_PAUSE_AT"
RELEASE_ENV = "REGIS_PAUSE_RELEASE"  # a file path: the pause ends when it exists; PATH.reached marks the arrival
ONCE_ENV = "REGIS_CRASH_ONCE"  # a file path: crash only if it does not exist yet (it is created first)


def crash_point(name: str) -> None:
    """SIGKILL this process if ``REGIS_CRASH_AT`` names ``name`` (no clean-up, no ``finally``, no atexit).
    With ``REGIS_CRASH_ONCE=PATH`` only the first process to get there dies (a retried job then completes)."""
    if os.environ.get(CRASH_ENV) != name:
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def pause_point(name: str, poll_s: float = 0.02) -> None:
    """Wait at point ``name`` if ``REGIS_PAUSE_AT`` names it: create ``$REGIS_PAUSE_RELEASE.reached``, then sleep
    until the file ``$REGIS_PAUSE_RELEASE`` exists (``poll_s`` seconds between looks). Once released, passing the
    point again costs one file check. Unset, one dictionary lookup.

    Raises:
        ConfigError: ``REGIS_PAUSE_AT`` is set but ``REGIS_PAUSE_RELEASE`` is not.
    """
    if os.environ.get(PAUSE_ENV) != name:
        return
    release = os.environ.get(RELEASE_ENV)
    if not release:
        from regis.errors import ConfigError

        raise ConfigError(f"{PAUSE_ENV}={name} needs {RELEASE_ENV}: the file whose creation ends the pause")
    release_path = Path(release)
    if release_path.exists():
        return
    Path(f"{release}.reached").touch()
    while not release_path.exists():
        time.sleep(poll_s)
