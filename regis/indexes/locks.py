"""Exclusive advisory locks between processes on a lock file (``flock``): the index writer's, the uploads
folder's and a duplicates run's. The lock belongs to the open file description, so two holders in one process
exclude each other too; closing the descriptor releases it (also when the process dies)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from regis.errors import IndexLockedError


def acquire_flock(path: Path | str, timeout_s: float, busy_message: str, poll_s: float = 0.1) -> int:
    """Open (creating it, mode 0o644) ``path`` and take its exclusive ``flock``, waiting up to ``timeout_s`` seconds
    (0: one try), polling every ``poll_s`` seconds.

    Returns:
        The open descriptor holding the lock; ``release_flock`` (or ``os.close``) releases it.

    Raises:
        IndexLockedError: another holder kept it for ``timeout_s`` seconds; its message is ``busy_message``.
        OSError: ``path`` cannot be opened (its folder does not exist, no permission).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise IndexLockedError(busy_message) from None
            time.sleep(poll_s)
        except BaseException:
            os.close(fd)
            raise


def release_flock(fd: int) -> None:
    """Release a lock taken by ``acquire_flock`` and close its descriptor."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
