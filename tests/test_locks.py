"""regis.indexes.locks: one exclusive holder at a time, a waiter that gets the lock once it is released, and a
timeout that raises IndexLockedError with the caller's message (the index writer, uploads and duplicates locks)."""

from __future__ import annotations

import threading
import time

import pytest

from regis.errors import IndexLockedError
from regis.indexes.locks import acquire_flock, release_flock


def test_second_holder_times_out_with_the_callers_message(tmp_path):
    fd = acquire_flock(tmp_path / "lock", 0.0, "busy")
    try:
        t0 = time.monotonic()
        with pytest.raises(IndexLockedError, match="^index writer busy$"):
            acquire_flock(tmp_path / "lock", 0.3, "index writer busy", poll_s=0.05)
        assert time.monotonic() - t0 >= 0.3
    finally:
        release_flock(fd)
    release_flock(acquire_flock(tmp_path / "lock", 0.0, "busy"))  # free again


def test_a_waiter_gets_the_lock_when_it_is_released(tmp_path):
    fd = acquire_flock(tmp_path / "lock", 0.0, "busy")
    threading.Timer(0.2, release_flock, args=(fd,)).start()
    t0 = time.monotonic()
    second = acquire_flock(tmp_path / "lock", 5.0, "busy", poll_s=0.02)
    assert 0.15 <= time.monotonic() - t0 < 5.0
    release_flock(second)


def test_a_missing_folder_is_an_os_error_not_a_lock(tmp_path):
    with pytest.raises(FileNotFoundError):
        acquire_flock(tmp_path / "nosuch" / "lock", 0.0, "busy")
