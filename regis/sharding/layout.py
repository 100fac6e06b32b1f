"""The layout of a sharded collection and its id rule.

::

    <collection>/
        shards.json          {"format": "regis-sharded/1", "num_shards": S, "next_id": G}
        shard-000/           an ordinary regis index (CURRENT, versions/, segments/, ...)
        shard-001/
        ...

Image ids are global: image ``g`` lives in shard ``g % S`` under the shard-local id ``g // S`` (so a shard's
ids stay dense, as the token store and FAISS ids ``local_id * T + position`` expect). ``next_id`` is the first
global id never handed out (a lower bound: ``ShardedWriter`` also looks at the shards' own counters).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current, write_json_atomic

SHARDS_FILE = "shards.json"
FORMAT = "regis-sharded/1"
MAX_SHARDS = 4096


def shard_dir(collection: Path | str, shard: int) -> Path:
    """The index directory of shard ``shard``."""
    return Path(collection) / f"shard-{shard:03d}"


def shard_of(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard of each global id: (n,) int64 -> (n,) int64."""
    return np.asarray(ids, dtype=np.int64) % num_shards


def to_local(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard-local id of each global id: (n,) int64 -> (n,) int64."""
    return np.asarray(ids, dtype=np.int64) // num_shards


def to_global(local_ids: np.ndarray, shard: int, num_shards: int) -> np.ndarray:
    """Global id of shard ``shard``'s local ids: (n,) int64 -> (n,) int64."""
    return np.asarray(local_ids, dtype=np.int64) * num_shards + shard


def is_sharded(path: Path | str) -> bool:
    """Whether ``path`` holds a sharded collection (a ``shards.json``)."""
    return (Path(path) / SHARDS_FILE).is_file()


def read_layout(collection: Path | str) -> dict:
    """The collection file: {"format", "num_shards", "next_id"}.

    Raises:
        IndexFormatError: no sharded collection there, or a corrupt file.
    """
    path = Path(collection) / SHARDS_FILE
    try:
        layout = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{collection} is not a sharded collection (no {SHARDS_FILE})") from exc
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"{path} is unreadable or not JSON") from exc
    if layout.get("format") != FORMAT or not isinstance(layout.get("num_shards"), int):
        raise IndexFormatError(f"{path} is not a {FORMAT} collection file")
    return layout


def write_layout(collection: Path | str, num_shards: int, next_id: int) -> None:
    """Write the collection file atomically (new file, then rename)."""
    write_json_atomic(Path(collection) / SHARDS_FILE, {"format": FORMAT, "num_shards": num_shards,
                                                       "next_id": int(next_id)})


def create_collection(collection: Path | str, num_shards: int) -> dict:
    """Create (or open) a collection of ``num_shards`` shards; returns its layout.

    Raises:
        ConfigError: num_shards out of 1..4096, or an existing collection with another shard count, or an
            unsharded index in the folder.
    """
    if not 1 <= num_shards <= MAX_SHARDS:
        raise ConfigError(f"num_shards must be between 1 and {MAX_SHARDS}, got {num_shards}")
    collection = Path(collection)
    if is_sharded(collection):
        layout = read_layout(collection)
        if layout["num_shards"] != num_shards:
            raise ConfigError(f"{collection} has {layout['num_shards']} shards, not {num_shards}; "
                              "re-sharding is not supported: build into a new folder")
        return layout
    if (collection / "CURRENT").exists():
        raise ConfigError(f"{collection} holds an unsharded index; build the sharded collection in a new folder")
    collection.mkdir(parents=True, exist_ok=True)
    write_layout(collection, num_shards, 0)
    return read_layout(collection)


def first_versioned_shard(collection: Path | str) -> Path:
    """The directory of the first shard that has an index version (every shard has the same encoder).

    Raises:
        IndexFormatError: not a sharded collection, or no shard has a version yet.
    """
    layout = read_layout(collection)
    for s in range(layout["num_shards"]):
        path = shard_dir(collection, s)
        if path.is_dir() and read_current(path):
            return path
    raise IndexFormatError(f"no shard of {collection} has an index version yet; build it with "
                           "`regis index build --ray --shards S`")


def collection_manifest(collection: Path | str):
    """The ``Manifest`` of the first shard that has an index version (encoder, weights, images_root).

    Raises:
        IndexFormatError: not a sharded collection, or no shard has a version yet.
    """
    from regis.indexes.manifest import read_manifest

    path = first_versioned_shard(collection)
    return read_manifest(path / VERSIONS_DIR / read_current(path))
