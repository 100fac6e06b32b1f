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

A re-sharded collection (``regis.sharding.reshard``) keeps its new shards in new folders, which its record names
(``"dirs": ["shard-000-g1", ...]``, generation ``"generation": 1``): the new layout is published with the same
one rename as a write, and readers of the state before keep the folders they read. Those old folders are listed
under ``"retired"`` ({"dirs", "at": seconds since the epoch}) and removed by a writer once ``RETIRE_GRACE_S`` has
passed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, IndexFormatError
from regis.indexes.layout import VERSIONS_DIR, read_current, version_number, write_json_atomic

SHARDS_FILE = "shards.json"
FORMAT = "regis-sharded/2"
OLD_FORMAT = "regis-sharded/1"  # no record: each shard's CURRENT is its live version
MAX_SHARDS = 4096
RETIRE_GRACE_S = 600.0  # a re-sharded collection's old folders stay this long for the readers of the state before
_DIR_NAME = re.compile(r"^shard-\d{3,4}(-g\d{1,6})?$")  # shard-NNN, or shard-NNN-gG after re-sharding


def default_dir_name(shard: int) -> str:
    """The folder name of shard ``shard`` of a collection never re-sharded: ``shard-NNN``."""
    return f"shard-{shard:03d}"


def shard_dir(collection: Path | str, shard: int, state: CollectionState | None = None) -> Path:
    """The index directory of shard ``shard`` in the published state ``state`` (default: the one published now;
    a re-sharded collection keeps its shards in folders its record names, ``CollectionState.dirs``)."""
    state = state if state is not None else read_state(collection)
    return state.shard_path(collection, shard)


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
    dirs = layout.get("dirs")
    if dirs is not None and (not isinstance(dirs, list) or len(dirs) != layout["num_shards"]
                             or not all(isinstance(d, str) and _DIR_NAME.match(d) for d in dirs)):
        raise IndexFormatError(f"{path} has invalid shard folders (dirs)")
    return layout


@dataclass(frozen=True)
class CollectionState:
    """A published state of a collection: ``version`` (the collection's) and ``names``, the version name of
    each shard (None: an empty shard); ``recorded``: read from the record (False: an old collection, read from
    the shards' CURRENT files); ``dirs``: each shard's folder name, () for the default ``shard-NNN`` (a
    re-sharded collection's shards live in new folders, ``regis.sharding.reshard``)."""

    version: int
    names: tuple[str | None, ...]
    recorded: bool = True
    dirs: tuple[str, ...] = ()

    @property
    def num_shards(self) -> int:
        """S, the shards of this state."""
        return len(self.names)

    def dir_name(self, shard: int) -> str:
        """The folder name of shard ``shard``."""
        return self.dirs[shard] if self.dirs else default_dir_name(shard)

    def shard_path(self, collection: Path | str, shard: int) -> Path:
        """The index directory of shard ``shard``."""
        return Path(collection) / self.dir_name(shard)


def read_state(collection: Path | str, layout: dict | None = None) -> CollectionState:
    """The collection's published state: its record, or for a collection without one (format 1) each shard's
    CURRENT with the sum of their versions.

    Raises:
        IndexFormatError: not a sharded collection, or a corrupt file.
    """
    layout = layout or read_layout(collection)
    if layout["format"] == FORMAT:
        return CollectionState(layout["version"], tuple(layout["shards"]), dirs=tuple(layout.get("dirs") or ()))
    names = []
    for s in range(layout["num_shards"]):
        path = Path(collection) / default_dir_name(s)
        names.append(read_current(path) if path.is_dir() else None)
    return CollectionState(sum(version_number(n) for n in names), tuple(names), recorded=False)


def write_layout(collection: Path | str, num_shards: int, next_id: int, state: CollectionState,
                 extra: dict | None = None) -> None:
    """Write the collection file with its record ``state`` atomically (new file, fsync, one rename): the step
    that publishes a write. ``extra``: more keys of the record (``generation``, ``retired``: re-sharding's)."""
    if len(state.names) != num_shards:
        raise ValueError(f"{len(state.names)} shard versions for {num_shards} shards")
    record = {"format": FORMAT, "num_shards": num_shards, "next_id": int(next_id), "version": int(state.version),
              "shards": list(state.names)}
    if state.dirs:
        record["dirs"] = list(state.dirs)
    record.update({k: v for k, v in (extra or {}).items() if v})
    write_json_atomic(Path(collection) / SHARDS_FILE, record)


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
                              "change it with `regis collections reshard`")
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
            return state.shard_path(collection, s), name
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


def stored_layout(manifest) -> dict[str, str]:
    """The ``IndexWriter`` arguments that write a new index in the layout the index of ``manifest`` (a
    ``Manifest``) was written in: its FAISS vector codec (``FaissInfo.codec``, when it records one: the compact
    layout's ``PQ{D/8}x4fsr``, or a ``--faiss-codec``) and, for the compact layout, ``token_store="compact"``
    (``TokenStoreInfo.rule``: regis re-picks the store by the new index's size). {} for the default layout."""
    from regis.indexes.codes import COMPACT

    options = {"token_store": COMPACT} if manifest.token_store.rule == COMPACT else {}
    if manifest.faiss.codec is not None:
        options["faiss_codec"] = manifest.faiss.codec
    return options


def collect_retired(collection: Path | str, layout: dict, now: float | None = None) -> dict:
    """Remove the shard folders a re-sharding retired more than ``RETIRE_GRACE_S`` ago (the writer calls this
    under the collection's lock); returns the record's re-sharding keys to write back: {"generation", "retired"}
    (the retirements not yet collected)."""
    import shutil
    import time

    now = time.time() if now is None else now
    keep = []
    for entry in layout.get("retired") or []:
        if now - float(entry.get("at", 0)) < RETIRE_GRACE_S:
            keep.append(entry)
            continue
        for name in entry.get("dirs", []):
            if _DIR_NAME.match(str(name)) and name not in (layout.get("dirs") or []):
                shutil.rmtree(Path(collection) / name, ignore_errors=True)
    return {"generation": layout.get("generation", 0), "retired": keep}
