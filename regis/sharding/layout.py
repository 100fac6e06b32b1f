"""The layout of a sharded collection and its id rule.

::

    <collection>/
        shards.json          the collection record: {"format": "regis-sharded/2", "num_shards": S, "next_id": G,
                             "version": V, "shards": ["v000004", null, "v000007", ...]}
        .lock                flock'ed by the collection's one writer (``regis.sharding.write``)
        shard-000/           an ordinary regis index (CURRENT, versions/, segments/, ...)
        shard-001/
        ...

The record is the collection's published state: ``version`` (V, one more per write) and the version of every
shard (``shards[s]``, None: the shard holds no image yet). Readers open each shard at the version listed there,
not at the shard's own CURRENT, and a writer publishes a write over several shards by replacing the record (a new
file, fsynced, renamed over it: ``write_json_atomic``), so readers see all of a write or none of it. A shard's
CURRENT is a hint written after the record (a shard directory stays an ordinary index for tools that open it);
shard versions newer than the record's are leftovers of a writer that died before replacing the record: nothing
reads them and that shard's next writer removes them.

Collections written before the record existed (``"format": "regis-sharded/1"``, no ``version`` / ``shards``)
are read as their shards' CURRENT files say, with the sum of the shards' versions as the collection version;
their first write creates the record (with a version above that sum).

Image ids are global: image ``g`` lives in shard ``g % S`` under the shard-local id ``g // S`` (so a shard's
ids stay dense, as the token store and FAISS ids ``local_id * T + position`` expect). ``next_id`` is the first
global id never handed out (a lower bound: ``ShardedWriter`` also looks at the shards' own counters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current, version_number, write_json_atomic

SHARDS_FILE = "shards.json"
FORMAT = "regis-sharded/2"
OLD_FORMAT = "regis-sharded/1"  # no record: each shard's CURRENT is its live version
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
    """The collection file: {"format", "num_shards", "next_id"} and, from format 2 on, "version" and "shards"
    (the record: ``read_state``).

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
    if layout.get("format") not in (FORMAT, OLD_FORMAT) or not isinstance(layout.get("num_shards"), int):
        raise IndexFormatError(f"{path} is not a {FORMAT} collection file")
    if layout["format"] == FORMAT and (not isinstance(layout.get("version"), int)
                                       or not isinstance(layout.get("shards"), list)
                                       or len(layout["shards"]) != layout["num_shards"]):
        raise IndexFormatError(f"{path} has no valid collection record (version, shards)")
    return layout


@dataclass(frozen=True)
class CollectionState:
    """A published state of a collection: ``version`` (the collection's) and ``names``, the version name of
    each shard (None: an empty shard); ``recorded``: read from the record (False: an old collection, read from
    the shards' CURRENT files)."""

    version: int
    names: tuple[str | None, ...]
    recorded: bool = True


def read_state(collection: Path | str, layout: dict | None = None) -> CollectionState:
    """The collection's published state: its record, or for a collection without one (format 1) each shard's
    CURRENT with the sum of their versions.

    Raises:
        IndexFormatError: not a sharded collection, or a corrupt file.
    """
    layout = layout or read_layout(collection)
    if layout["format"] == FORMAT:
        return CollectionState(layout["version"], tuple(layout["shards"]))
    names = []
    for s in range(layout["num_shards"]):
        path = shard_dir(collection, s)
        names.append(read_current(path) if path.is_dir() else None)
    return CollectionState(sum(version_number(n) for n in names), tuple(names), recorded=False)


def write_layout(collection: Path | str, num_shards: int, next_id: int, state: CollectionState) -> None:
    """Write the collection file with its record ``state`` atomically (new file, fsync, one rename): the step
    that publishes a write."""
    if len(state.names) != num_shards:
        raise ValueError(f"{len(state.names)} shard versions for {num_shards} shards")
    write_json_atomic(Path(collection) / SHARDS_FILE, {"format": FORMAT, "num_shards": num_shards,
                                                       "next_id": int(next_id), "version": int(state.version),
                                                       "shards": list(state.names)})


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
    write_layout(collection, num_shards, 0, CollectionState(0, (None,) * num_shards))
    return read_layout(collection)


def first_versioned_shard(collection: Path | str) -> Path:
    """The directory of the first shard that has an index version (every shard has the same encoder).

    Raises:
        IndexFormatError: not a sharded collection, or no shard has a version yet.
    """
    return _first_version(collection)[0]


def _first_version(collection: Path | str) -> tuple[Path, str]:
    state = read_state(collection)
    for s, name in enumerate(state.names):
        if name is not None:
            return shard_dir(collection, s), name
    raise IndexFormatError(f"no shard of {collection} has an index version yet; build it with "
                           "`regis index build --ray --shards S`")


def collection_manifest(collection: Path | str):
    """The ``Manifest`` of the first shard that has an index version (encoder, weights, images_root).

    Raises:
        IndexFormatError: not a sharded collection, or no shard has a version yet.
    """
    from regis.indexes.manifest import read_manifest

    path, name = _first_version(collection)
    return read_manifest(path / VERSIONS_DIR / name)
