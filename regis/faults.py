"""Named crash points for fault-injection tests: ``REGIS_CRASH_AT=<point>`` makes the process SIGKILL itself
when it reaches that point, so a test kills inside the window it names every time (not at a random moment of
interpreter start-up). Unset, a crash point costs one dictionary lookup.

Points (where the window is):
    ``writer.segment-written``   index writer: the new token segment is on disk, no version published yet.
    ``writer.version-renamed``   index writer: the version directory is in place, CURRENT not yet replaced.
    ``upload.staged``            API: an upload's files are staged, its job not yet queued.
    ``job.placed``               job: uploaded files moved to their content-addressed place, index not yet
                                 written.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "REGIS_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``REGIS_CRASH_AT`` names ``name`` (no clean-up, no ``finally``, no atexit)."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
