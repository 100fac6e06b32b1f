"""Duplicate runs of the service: one background thread per (index, version, candidate settings).

A duplicates request whose pairs are stored already is answered at once. Otherwise the run starts in a thread
(``regis.duplicates.finder.update_pairs``: incremental, so after an upload only the new images are searched) and
the request waits for it up to its ``wait``; a run still going is answered 202 with its progress, and the next
request for the same version finds it running or done. A failed run is reported to the requests waiting on it and
forgotten, so a later request tries again.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger("regis.service")


@dataclass
class DuplicateRunState:
    """A run in a thread: its progress, and its end (``done`` set; ``error`` when it failed)."""

    version: int
    stage: str | None = None
    done_count: int = 0
    total: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def progress(self, stage: str, done: int, total: int) -> None:
        self.stage, self.done_count, self.total = stage, done, total


class DuplicateRuns:
    """The runs of one service (``app.state.duplicate_runs``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[tuple, DuplicateRunState] = {}

    def start(self, snapshot, config, resolve) -> DuplicateRunState:
        """The run for ``snapshot``'s version with ``config``'s candidate settings: the one in progress, or a new
        one started now."""
        key = (str(snapshot.index_dir), snapshot.version, json.dumps(config.candidate_settings(), sort_keys=True))
        with self._lock:
            state = self._runs.get(key)
            if state is not None and not (state.done.is_set() and state.error is not None):
                return state
            state = self._runs[key] = DuplicateRunState(snapshot.version)
            for old in [k for k, s in self._runs.items() if s.done.is_set() and k != key]:
                del self._runs[old]  # finished runs are on disk; only running ones need remembering
        threading.Thread(target=self._run, args=(state, snapshot, config, resolve), daemon=True,
                         name=f"regis-duplicates-v{snapshot.version}").start()
        return state

    @staticmethod
    def _run(state: DuplicateRunState, snapshot, config, resolve) -> None:
        from regis.duplicates.finder import update_pairs

        try:
            update_pairs(snapshot, config, resolve, progress=state.progress)
        except BaseException as exc:  # handed to the requests waiting on it
            log.exception("duplicates run on index version %s failed", state.version)
            state.error = exc
        finally:
            state.done.set()
