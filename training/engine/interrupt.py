"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (``docker stop``, a scheduler's pre-emption):
the step in flight finishes, a resumable checkpoint is written, and the run ends as "stopped"
(``regis train ... --resume`` continues it). A second signal interrupts at once, as Python would."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Context manager: while inside, SIGINT/SIGTERM set ``received`` (the signal's name) instead of killing
    the process; the second one raises ``KeyboardInterrupt``. Outside the main thread it does nothing (Python
    delivers signals to the main thread only)."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def clamp_warmup(warmup_steps: int, total_steps: int, log) -> int:
    """The warm-up actually used: at most the run's steps (a short run with the default 100 warm-up steps is
    fine), with a warning naming ``--warmup-steps`` when it had to be shortened."""
    if warmup_steps <= total_steps:
        return warmup_steps
    log.warning("--warmup-steps %d is more than the run's %d steps: warming up over all %d steps instead",
                warmup_steps, total_steps, total_steps)
    return total_steps
