"""Read-only view of one published index version."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from regis.errors import IndexFormatError
from regis.indexes import codes as token_codes
from regis.indexes import faiss_index
from regis.indexes.layout import (
    FAISS_FILE,
    LOCATIONS_FILE,
    SEGMENTS_DIR,
    TABLE_FILE,
    VERSIONS_DIR,
    read_current,
)
from regis.indexes.manifest import Manifest, read_manifest
from regis.indexes.npy import load_npy
from regis.indexes.store import TokenStore
from regis.indexes.table import ImageTable


class IndexSnapshot:
    """One index version, opened for search: manifest, token store (memory-mapped), image table, FAISS index.

    A snapshot never changes; a writer publishes a new version beside it. Open the newest one with
    ``IndexSnapshot.open(index_dir)``.

    Attributes:
        index_dir: the index directory.
        name: version directory name ("v000003").
        manifest: the version's manifest.
        store: token store.
        table: image table (read-only, thread-safe).
        faiss: the FAISS token index (in memory).
        codes: the compressed token store (``regis.indexes.codes.CodeStore``), None for a float16 store.
        buddies: (next_id, R + 1) int16 buddy patches of the images (-1: unknown), None when the version has
            none (written before they were stored); their grid is ``manifest.buddies.grid``.
    """

    def __init__(self, index_dir: Path, name: str, manifest: Manifest, store: TokenStore, table: ImageTable, faiss,
                 codes: token_codes.CodeStore | None = None, buddies: np.ndarray | None = None):
        self.index_dir = Path(index_dir)
        self.name = name
        self.manifest = manifest
        self.store = store
        self.table = table
        self.faiss = faiss
        self.codes = codes
        self.buddies = buddies

    @property
    def version(self) -> int:
        """The version number."""
        return self.manifest.version

    @classmethod
    def open(cls, index_dir: Path | str, name: str | None = None) -> IndexSnapshot:
        """Open version ``name`` (default: the one CURRENT names).

        Raises:
            IndexFormatError: no index there, or a file of the version is missing or corrupt.
        """
        index_dir = Path(index_dir)
        if not index_dir.is_dir():
            raise IndexFormatError(f"{index_dir} is not a directory; build an index with `regis index build`")
        name = name or read_current(index_dir)
        if name is None:
            raise IndexFormatError(f"{index_dir} holds no index yet (no CURRENT file); run `regis index build`")
        vdir = index_dir / VERSIONS_DIR / name
        manifest = read_manifest(vdir)
        try:
            locations = load_npy(vdir / LOCATIONS_FILE)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{vdir / LOCATIONS_FILE} is missing or corrupt") from exc
        store = TokenStore(
            index_dir / SEGMENTS_DIR, manifest.segments, locations, manifest.tokens_per_image, manifest.dim
        )
        if not (vdir / TABLE_FILE).is_file() or not (vdir / FAISS_FILE).is_file():
            raise IndexFormatError(f"{vdir} is incomplete: {TABLE_FILE} or {FAISS_FILE} is missing")
        try:
            index = faiss_index.read(vdir / FAISS_FILE)
        except RuntimeError as exc:
            raise IndexFormatError(f"{vdir / FAISS_FILE} cannot be read by FAISS") from exc
        codes = None
        if manifest.token_store.spec != token_codes.FLOAT16:
            codes = token_codes.CodeStore(vdir, manifest.tokens_per_image, manifest.dim)
        buddies = None
        if manifest.buddies is not None:
            try:
                buddies = load_npy(vdir / manifest.buddies.file)
            except (OSError, ValueError) as exc:
                raise IndexFormatError(f"{vdir / manifest.buddies.file} is missing or corrupt") from exc
        return cls(index_dir, name, manifest, store, ImageTable(vdir / TABLE_FILE, readonly=True), index, codes,
                   buddies)

    def close(self) -> None:
        """Release the table connection (memory maps go with the object)."""
        self.table.close()

    def __len__(self) -> int:
        return len(self.store)
