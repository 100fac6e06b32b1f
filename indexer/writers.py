"""Opening the writer of an index or of a sharded collection (the writes that uploads, deletes and metadata
changes share)."""

from __future__ import annotations

from pathlib import Path

from regis.errors import IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current
from regis.indexes.manifest import read_manifest
from regis.indexes.writer import IndexWriter


def layout_options(index_dir: str | Path) -> dict[str, str]:
    """The ``IndexWriter`` arguments that the layout of the unsharded collection in ``index_dir`` asks for
    (``CollectionConfig.writer_options``) while it has no index version yet; {} once it has one (its manifest
    keeps the layout it was written with: ``FaissInfo.codec``, ``TokenStoreInfo.rule``), for a folder that is no
    collection (no ``collection.json``, a deleted one's tombstone), and for a sharded collection, whose writer
    gives each shard's first version the collection's layout itself (``regis.sharding.write.ShardedWriter``,
    ``regis.sharding.write.new_shard_options``).

    Raises:
        ConfigError: an unreadable ``collection.json``.
    """
    from regis.indexes.collections import read_config
    from regis.sharding.layout import is_sharded

    index_dir = Path(index_dir)
    if not index_dir.is_dir() or read_current(index_dir) is not None or is_sharded(index_dir):
        return {}
    config = read_config(index_dir)
    return config.writer_options() if config is not None else {}


def open_writer(index_dir: str | Path, encoder, weights, **writer_kwargs):
    """The writer of an index: ``IndexWriter``, or for a sharded collection a ``CollectionWriter`` (the same
    interface in global ids, over every shard; ``regis.sharding.write``). A collection's first version is
    written in the collection's layout (``layout_options``), and so is each shard's first version in a sharded
    collection (its shards' layout once one has a version, else its ``collection.json``'s:
    ``regis.sharding.write.new_shard_options``), but for a codec or store ``writer_kwargs`` name; a version
    after that keeps its manifest's.

    Raises:
        IndexMismatchError / IndexLockedError: as ``IndexWriter``.
        ConfigError: an unreadable ``collection.json``.
    """
    from regis.sharding.layout import is_sharded

    if is_sharded(index_dir):
        from regis.sharding.write import CollectionWriter

        return CollectionWriter(index_dir, encoder, weights, **writer_kwargs)
    for key, value in layout_options(index_dir).items():
        if writer_kwargs.get(key) is None:
            writer_kwargs[key] = value
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
