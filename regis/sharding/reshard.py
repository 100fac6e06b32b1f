"""Re-sharding a collection online: S -> S' shards while it keeps answering.

Under the collection's write lock (writers wait; readers are never blocked), ``reshard`` reads the published state
(version V over S shards), writes every live image of it into S' new shard indexes in new folders
(``shard-NNN-g<G>``, G: the collection's re-sharding generation, one more each time): image ``g`` goes to shard
``g % S'`` under the local id ``g // S'`` with its table row, tokens and buddy patches, each new shard's FAISS index
built over its own images with the collection's settings (spec, nprobe, depth, token store, candidate method, images
root) and in its layout (default or compact: ``_writer_options``). Then the new layout is published in ONE step, the
same rename of the collection record that publishes a write: version V + 1, S' shards, their folders
(``regis.sharding.layout``). Readers move to it at their next refresh (the embedded engine and Ray Serve's ingress:
within ``REGIS_INDEX_POLL_S``); a query in flight finishes on the state it started with, whose folders stay on disk
(listed as ``retired`` in the record) until a writer removes them ``RETIRE_GRACE_S`` later. Global ids do not
change, so results before and after are identical in exact mode, and in ANN mode wherever the shards' FAISS indexes
are exact (Flat, the choice for small shards) or probe everything; with IVF shards the candidates of a
re-partitioned index can differ as those of any rebuild do.

A re-sharding killed before the record is replaced leaves the collection as it was (its new folders are read by
nobody and the next re-sharding, which reuses their names, removes them first): ``reshard.shards-written``.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from regis.errors import ConfigError
from regis.faults import crash_point
from regis.indexes.layout import version_name
from regis.indexes.locks import release_flock
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.writer import IndexWriter, _acquire_lock
from regis.sharding.layout import (
    MAX_SHARDS,
    CollectionState,
    collect_retired,
    collection_manifest,
    read_layout,
    read_state,
    stored_layout,
    to_global,
    write_layout,
)


@dataclass
class ReshardReport:
    """What ``reshard`` did: shards before and after, the collection version it published (``version``; None:
    nothing to do), images moved, seconds."""

    collection: str
    shards_before: int
    shards_after: int
    version: int | None
    images: int
    seconds: float

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def _writer_options(collection: Path, manifest) -> dict:
    """The index options every new shard gets: the collection's, from ``manifest`` (its first shard's with a
    version; an automatic FAISS spec stays automatic, chosen for each new shard's size), in the collection's
    layout: the one its shards were written in (``stored_layout``: the FAISS vector codec, and for the compact
    layout the token store "compact", which regis re-picks for each new shard's size), or the compact one
    when its ``collection.json`` asks for it (``CollectionConfig.writer_options``: every shard is rewritten here,
    so a compact collection whose shards were written in the default layout gets it back).

    Raises:
        ConfigError: an unreadable ``collection.json``.
    """
    from regis.indexes.collections import read_config

    config = read_config(collection)
    return {"faiss_spec": None if manifest.faiss.auto else manifest.faiss.spec,
            "nprobe": None if manifest.faiss.auto else manifest.faiss.nprobe,
            "depth": None if manifest.faiss.auto else manifest.faiss.depth,
            "candidates": manifest.faiss.candidates, "token_store": manifest.token_store.spec,
            "images_root": manifest.images_root, **stored_layout(manifest),
            **(config.writer_options() if config is not None else {})}


def _copy_shard(snap: IndexSnapshot, shard: int, num_shards: int, writers: list[IndexWriter], chunk: int) -> int:
    """Put every live image of one old shard (shard ``shard`` of ``num_shards``) into the new shards; returns how
    many."""
    m = snap.manifest
    grid = tuple(m.buddies.grid) if snap.buddies is not None and m.buddies is not None else None
    new_s = len(writers)
    moved = 0
    for local, tokens in snap.store.iter_chunks(chunk):
        glob = to_global(local, shard, num_shards)
        rows = snap.table.get_many(local.tolist())
        buddies = np.asarray(snap.buddies[local]) if grid is not None else None
        tokens = np.asarray(tokens, dtype=np.float32)
        for s in range(new_s):
            pick = np.flatnonzero(glob % new_s == s)
            if not len(pick):
                continue
            w, new_local = writers[s], glob[pick] // new_s
            need = int(new_local.max()) + 1 - w.next_id
            if need > 0:
                w.allocate_ids(need)  # the local ids below stay free (images of other shards, deleted ones)
            w.put([dataclasses.replace(rows[int(local[i])], id=int(n)) for i, n in zip(pick, new_local, strict=True)],
                  tokens[pick], buddies=None if buddies is None else buddies[pick], grid=grid)
        moved += len(local)
    return moved


def reshard(collection: Path | str, num_shards: int, lock_timeout_s: float = 300.0, chunk: int = 4096,
            report: dict | None = None) -> ReshardReport:
    """Re-shard ``collection`` into ``num_shards`` shards, publishing the new layout in one step (module
    docstring).

    Args:
        collection: the sharded collection folder.
        num_shards: S', 1 to 4096.
        lock_timeout_s: how long to wait for the collection's writer, seconds.
        chunk: images copied per step.
        report: JSON-ready report saved in each new shard version (e.g. a job record).

    Returns:
        The report (``version`` None when the collection has ``num_shards`` shards already).

    Raises:
        ConfigError: a bad shard count, or an unreadable ``collection.json``.
        IndexFormatError: not a sharded collection, or no shard has a version yet.
        IndexLockedError: a writer held the collection past ``lock_timeout_s``.
    """
    if not isinstance(num_shards, int) or not 1 <= num_shards <= MAX_SHARDS:
        raise ConfigError(f"num_shards must be between 1 and {MAX_SHARDS}, got {num_shards}")
    collection = Path(collection)
    t0 = time.perf_counter()
    layout = read_layout(collection)
    manifest = collection_manifest(collection)  # also: refuses a collection with no version yet
    lock = _acquire_lock(collection, lock_timeout_s)
    writers: list[IndexWriter] = []
    try:
        layout = read_layout(collection)  # under the lock: the last writer's record
        state = read_state(collection, layout)
        if state.num_shards == num_shards:
            return ReshardReport(str(collection), num_shards, num_shards, None, 0, time.perf_counter() - t0)
        extra = collect_retired(collection, layout)
        generation = int(layout.get("generation", 0)) + 1
        dirs = tuple(f"shard-{s:03d}-g{generation}" for s in range(num_shards))
        for name in dirs:  # leftovers of a re-sharding killed before it published
            shutil.rmtree(collection / name, ignore_errors=True)
        options = _writer_options(collection, manifest)
        writers = [IndexWriter(collection / name, manifest.encoder, manifest.weights, base=None, **options)
                   for name in dirs]
        moved = 0
        for s, name in enumerate(state.names):
            if name is None:
                continue
            snap = IndexSnapshot.open(state.shard_path(collection, s), name)
            try:
                moved += _copy_shard(snap, s, state.num_shards, writers, chunk)
            finally:
                snap.close()
        manifests = [w.prepare(report) for w in writers]
        for w, m in zip(writers, manifests, strict=True):
            if m is not None:
                w.publish(current=True)  # the new folder's own CURRENT: no record lists the folder yet
        crash_point("reshard.shards-written")
        names = tuple(version_name(m.version) if m is not None else None for m in manifests)
        new_state = CollectionState(state.version + 1, names, dirs=dirs)
        retired = [*extra["retired"], {"dirs": [state.dir_name(s) for s in range(state.num_shards)],
                                       "at": time.time()}]
        write_layout(collection, num_shards, int(layout["next_id"]), new_state,
                     {"generation": generation, "retired": retired})
        for w, m in zip(writers, manifests, strict=True):
            if m is not None:
                w.finish()
            else:
                w.abort()
        return ReshardReport(str(collection), state.num_shards, num_shards, new_state.version, moved,
                             round(time.perf_counter() - t0, 3))
    finally:
        for w in writers:
            w.abort()
        release_flock(lock)
