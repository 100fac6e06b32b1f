"""Loading the index's small ``.npy`` files safely from several threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

# numpy parses a .npy header with ``ast.literal_eval``. On CPython 3.11 before 3.11.8, two threads building an
# AST at once can fail with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905); a
# sharded collection opens its shards' versions from several threads. One lock makes our header parses serial.
_HEADER_LOCK = threading.Lock()


def load_npy(path: str | Path, mmap_mode: str | None = None) -> np.ndarray:
    """``np.load`` of one ``.npy`` file, serialised across threads (CPython gh-106905, see module comment).

    Args:
        path: the ``.npy`` file.
        mmap_mode: None to read it into memory, ``"r"`` to memory-map it read-only.

    Returns:
        The array, dtype and shape as stored.

    Raises:
        OSError / FileNotFoundError: the file cannot be read; ValueError: it is not a ``.npy`` file.
    """
    with _HEADER_LOCK:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
