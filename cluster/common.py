"""What the Ray deployments and the Ray build share: the collection's encoder record."""

from __future__ import annotations

from pathlib import Path

from regis.errors import IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current
from regis.indexes.manifest import Manifest, read_manifest
from regis.sharding.layout import read_layout, shard_dir


def collection_manifest(collection: Path | str) -> Manifest:
    """The manifest of the first shard that has an index version (every shard has the same encoder).

    Raises:
        IndexFormatError: not a sharded collection, or no shard has a version yet.
    """
    layout = read_layout(collection)
    for s in range(layout["num_shards"]):
        name = read_current(shard_dir(collection, s)) if shard_dir(collection, s).is_dir() else None
        if name:
            return read_manifest(shard_dir(collection, s) / VERSIONS_DIR / name)
    raise IndexFormatError(f"no shard of {collection} has an index version yet; build it with "
                           "`regis index build --ray --shards S`")
