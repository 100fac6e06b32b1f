"""Opening the writer of an index or of a sharded collection (the writes that uploads, deletes and metadata
changes share)."""

from __future__ import annotations

from pathlib import Path

from regis.errors import IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current
from regis.indexes.manifest import read_manifest
from regis.indexes.writer import IndexWriter


def open_writer(index_dir: str | Path, encoder, weights, **writer_kwargs):
    """The writer of an index: ``IndexWriter``, or for a sharded collection a ``CollectionWriter`` (the same
    interface in global ids, over every shard; ``regis.sharding.write``).

    Raises:
        IndexMismatchError / IndexLockedError: as ``IndexWriter``.
    """
    from regis.sharding.layout import is_sharded

    if is_sharded(index_dir):
        from regis.sharding.write import CollectionWriter

        return CollectionWriter(index_dir, encoder, weights, **writer_kwargs)
    return IndexWriter(index_dir, encoder, weights, **writer_kwargs)


def open_live_writer(index_dir: str | Path, lock_timeout_s: float = 0.0, why: str = ""):
    """A writer (``open_writer``) on the live version of an existing index or sharded collection, with the
    encoder its manifest records (for writes that embed nothing: deletes, metadata changes).

    Raises:
        IndexFormatError: there is no index (the message ends with ``why``).
        IndexLockedError: another writer holds the index past ``lock_timeout_s`` (when the writer is entered).
    """
    from regis.sharding.layout import collection_manifest, is_sharded

    index_dir = Path(index_dir)
    if is_sharded(index_dir):
        try:
            manifest = collection_manifest(index_dir)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{index_dir} holds no index yet{why}") from exc
        return open_writer(index_dir, manifest.encoder, manifest.weights, lock_timeout_s=lock_timeout_s)
    current = read_current(index_dir) if index_dir.is_dir() else None
    if current is None:
        raise IndexFormatError(f"{index_dir} holds no index yet{why}")
    manifest = read_manifest(index_dir / VERSIONS_DIR / current)
    return IndexWriter(index_dir, manifest.encoder, manifest.weights, lock_timeout_s=lock_timeout_s)
