"""On-disk layout of an index directory, and the atomic-write helpers every writer uses.

    INDEX_DIR/
      CURRENT                      name of the live version, e.g. "v000003" (replaced atomically)
      .lock                        flock'ed by the one writer
      resume/                      a folder build's staged embeddings until it commits (``indexer.resume``)
      segments/seg-<uuid>.f16      immutable token segments: float16 (rows, T, D), C order, no header
      versions/v000003/
        manifest.json              the Manifest (encoder, weights checksum, FAISS spec, segments, counts)
        images.sqlite              the image table (id, path, sha256, width, height, bytes, mtime, metadata)
        locations.npy              int64 (next_id, 2): (segment index, row) of each image id, -1 if none
        tokens.faiss               FAISS index over token vectors, id = image_id * T + token_position
        build_report.json          what the build that made this version did (optional)
        buddies.npy                int16 (next_id, R + 1): each image's buddy patch per cue, -1 if unknown
                                   (optional: versions written before it existed have none)

A version directory is written under a temporary name and renamed when complete; CURRENT is replaced last.
A writer killed at any point leaves the previous version live and intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CURRENT_FILE = "CURRENT"
LOCK_FILE = ".lock"
SEGMENTS_DIR = "segments"
VERSIONS_DIR = "versions"
MANIFEST_FILE = "manifest.json"
TABLE_FILE = "images.sqlite"
LOCATIONS_FILE = "locations.npy"
FAISS_FILE = "tokens.faiss"
REPORT_FILE = "build_report.json"
BUDDIES_FILE = "buddies.npy"
TMP_PREFIX = ".tmp-"


def version_name(version: int) -> str:
    """Directory name of version ``version`` (``v000003``)."""
    return f"v{version:06d}"


def version_number(name: str | None) -> int:
    """The number of a version name, the inverse of ``version_name`` ("v000003" -> 3; None, no version -> 0)."""
    return int(name[1:]) if name else 0


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames inside it survive a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a written file's data to disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file + fsync + rename: readers see old or new, never half."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: object) -> None:
    """``write_bytes_atomic`` of pretty-printed JSON."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def write_current(index_dir: Path, name: str) -> None:
    """Replace CURRENT with ``name`` atomically (``write_bytes_atomic``)."""
    write_bytes_atomic(Path(index_dir) / CURRENT_FILE, (name + "\n").encode())


def read_current(index_dir: Path) -> str | None:
    """Name of the live version directory, or None for an index that has none yet."""
    try:
        name = (Path(index_dir) / CURRENT_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None
