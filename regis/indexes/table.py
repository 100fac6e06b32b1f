"""The image table: one row per live image, in SQLite (``images.sqlite`` of a version directory)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    id       INTEGER PRIMARY KEY,
    path     TEXT NOT NULL UNIQUE,
    sha256   TEXT NOT NULL,
    width    INTEGER NOT NULL,
    height   INTEGER NOT NULL,
    bytes    INTEGER NOT NULL,
    mtime    REAL NOT NULL,
    metadata TEXT
)
"""
_COLUMNS = "id, path, sha256, width, height, bytes, mtime, metadata"


@dataclass(frozen=True)
class ImageRecord:
    """One indexed image.

    Attributes:
        id: stable image id (never reused after a delete).
        path: path relative to the indexed root, POSIX separators.
        sha256: SHA-256 of the file bytes, hex.
        width, height: pixels, after EXIF orientation.
        bytes: file size in bytes.
        mtime: modification time, seconds since the epoch.
        metadata: optional user metadata (JSON object).
    """

    id: int
    path: str
    sha256: str
    width: int
    height: int
    bytes: int
    mtime: float
    metadata: dict = field(default_factory=dict)

    def to_row(self) -> tuple:
        # allow_nan=False: a NaN that got past the checks (regis.indexes.json_values) fails the write here, instead
        # of every later metadata filter on the table (SQLite's JSON functions cannot read a bare NaN)
        meta = json.dumps(self.metadata, sort_keys=True, allow_nan=False) if self.metadata else None
        return (self.id, self.path, self.sha256, self.width, self.height, self.bytes, self.mtime, meta)

    @classmethod
    def from_row(cls, row: tuple) -> ImageRecord:
        return cls(*row[:7], metadata=json.loads(row[7]) if row[7] else {})


class ImageTable:
    """SQLite-backed image table.

    Read-only tables (``readonly=True``) open the file immutable and may be shared between threads; a
    writable table belongs to one ``IndexWriter``.
    """

    def __init__(self, path: Path, readonly: bool = True):
        self.path = Path(path)
        self.readonly = readonly
        self._fields: dict[str, bool] = {}  # field -> some row has it (read-only tables: missing_fields)
        self._lock = threading.Lock()
        if readonly:
            uri = f"file:{self.path}?mode=ro&immutable=1"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            self._conn = sqlite3.connect(self.path, check_same_thread=False)
            self._conn.execute(_SCHEMA)
            self._conn.commit()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def _query(self, sql: str, params: Iterable = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    def count(self) -> int:
        """Number of rows (live images)."""
        return int(self._query("SELECT COUNT(*) FROM images")[0][0])

    def get(self, image_id: int) -> ImageRecord | None:
        """The record of ``image_id``, or None if there is none."""
        rows = self._query(f"SELECT {_COLUMNS} FROM images WHERE id = ?", (int(image_id),))
        return ImageRecord.from_row(rows[0]) if rows else None

    def get_many(self, ids: Iterable[int]) -> dict[int, ImageRecord]:
        """Records of the given ids that exist, keyed by id."""
        return {rec.id: rec for rec in self._select_in("id", [int(i) for i in ids])}

    def by_path(self) -> dict[str, ImageRecord]:
        """Every record keyed by its relative path (what an incremental build compares against)."""
        return {r.path: r for r in self.iter_all()}

    def get_by_paths(self, paths: Iterable[str]) -> dict[str, ImageRecord]:
        """Records of the given relative paths that exist, keyed by path."""
        return {rec.path: rec for rec in self._select_in("path", list(paths))}

    def _select_in(self, column: str, values: list) -> Iterator[ImageRecord]:
        """Rows whose ``column`` ("id" or "path") is one of ``values``, in batches under SQLite's parameter limit."""
        for start in range(0, len(values), 900):
            part = values[start : start + 900]
            marks = ",".join("?" * len(part))
            for row in self._query(f"SELECT {_COLUMNS} FROM images WHERE {column} IN ({marks})", part):
                yield ImageRecord.from_row(row)

    def paths_and_hashes(self) -> list[tuple[str, str]]:
        """(path, sha256) of every row (what start-up clean-ups compare files against; no metadata parsed)."""
        return [(str(p), str(s)) for p, s in self._query("SELECT path, sha256 FROM images")]

    def iter_all(self, limit: int | None = None, offset: int = 0) -> Iterator[ImageRecord]:
        """Records in id order."""
        sql = f"SELECT {_COLUMNS} FROM images ORDER BY id"
        params: tuple = ()
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            params = (int(limit), int(offset))
        for row in self._query(sql, params):
            yield ImageRecord.from_row(row)

    def ids_where(self, where: str, params: Iterable = ()) -> np.ndarray:
        """Ids of the rows matching a SQL condition (``regis.indexes.filters.compile_filter``), ascending.

        Returns:
            (n,) int64.
        """
        rows = self._query(f"SELECT id FROM images WHERE {where} ORDER BY id", params)
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def missing_fields(self, fields: list[str]) -> list[str]:
        """The metadata fields (dotted keys, ``regis.indexes.filters``) that no row has, in the order given. A
        read-only table (a snapshot's, which never changes) remembers each answer.
        """
        cache = self._fields if self.readonly else {}
        for name in fields:
            if name not in cache:
                rows = self._query("SELECT EXISTS (SELECT 1 FROM images WHERE json_type(metadata, ?) IS NOT NULL)",
                                   ("$." + name,))
                cache[name] = bool(rows[0][0])
        return [name for name in fields if not cache[name]]

    def field_names(self) -> set[str]:
        """Every metadata field some row has, as dotted keys (nested objects give "file", "file.folder", ...;
        nothing inside lists). Reads every row's metadata: for error messages, not for each query."""
        rows = self._query("SELECT DISTINCT fullkey FROM images, json_tree(images.metadata) "
                           "WHERE images.metadata IS NOT NULL AND fullkey != '$' AND instr(fullkey, '[') = 0")
        return {r[0][2:] for r in rows if r[0].startswith("$.")}

    def select_where(self, where: str | None, params: Iterable = (), limit: int = 100,
                     offset: int = 0) -> tuple[list[ImageRecord], int]:
        """A page of the rows matching a SQL condition (None: every row), in id order, and the total count."""
        clause = f" WHERE {where}" if where else ""
        params = tuple(params)
        total = int(self._query(f"SELECT COUNT(*) FROM images{clause}", params)[0][0])
        rows = self._query(f"SELECT {_COLUMNS} FROM images{clause} ORDER BY id LIMIT ? OFFSET ?",
                           (*params, int(limit), int(offset)))
        return [ImageRecord.from_row(r) for r in rows], total

    def upsert(self, records: Iterable[ImageRecord]) -> None:
        """Insert or replace rows (writable tables only); committed by ``commit``."""
        with self._lock:
            self._conn.executemany(
                f"INSERT OR REPLACE INTO images ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [r.to_row() for r in records],
            )

    def prefix_paths(self, prefix: str, exclude_prefix: str, folder_key: str | None = None) -> int:
        """Prepend ``prefix`` ("a/b/") to every path not starting with ``exclude_prefix`` (writable tables only);
        returns the rows changed. ``folder_key``: a JSON path of the metadata (``$.file.folder``) holding the
        image's folder, moved the same way where present. Two statements, so that UNIQUE(path) never sees a
        transient clash."""
        marker = "\x01"
        with self._lock:
            cur = self._conn.execute("UPDATE images SET path = ? || path WHERE substr(path, 1, ?) != ?",
                                     (marker, len(exclude_prefix), exclude_prefix))
            if folder_key is not None:
                folder = prefix.rstrip("/")
                self._conn.execute(
                    "UPDATE images SET metadata = json_set(metadata, ?, CASE WHEN json_extract(metadata, ?) = '' "
                    "THEN ? ELSE ? || json_extract(metadata, ?) END) "
                    "WHERE substr(path, 1, 1) = ? AND json_type(metadata, ?) = 'text'",
                    (folder_key, folder_key, folder, prefix, folder_key, marker, folder_key))
            self._conn.execute("UPDATE images SET path = ? || substr(path, 2) WHERE substr(path, 1, 1) = ?",
                               (prefix, marker))
            return cur.rowcount

    def delete(self, ids: Iterable[int]) -> None:
        """Delete rows by id (writable tables only)."""
        with self._lock:
            self._conn.executemany("DELETE FROM images WHERE id = ?", [(int(i),) for i in ids])

    def commit(self) -> None:
        """Commit pending writes and flush them to disk."""
        with self._lock:
            self._conn.commit()
