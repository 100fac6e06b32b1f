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
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "REGIS_CRASH_AT"
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
