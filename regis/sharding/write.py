"""Writing a sharded collection: one ``IndexWriter`` transaction per shard, driven with global image ids.

A ``ShardedWriter`` holds the collection's lock (``<collection>/.lock``), reads the collection record
(``regis.sharding.layout``) under it and opens each shard's transaction at the version the record lists.
``commit`` writes every changed shard's new version in full (``IndexWriter.prepare``: segments, FAISS index,
table, manifest, fsynced; an error there publishes nothing), renames each into its shard's ``versions/``
(``IndexWriter.publish(current=False)``: no reader opens it yet), then publishes the write in ONE step: the new
record (collection version + 1, every shard's version, the next global id) replaces ``shards.json`` by a rename.
Only then are the shards' CURRENT hints written, old versions collected, and the locks released. A writer killed
or failing before the record's rename leaves the collection as it was for every reader; the versions it renamed
are ignored (no record lists them) and removed by their shard's next writer, and the next build (which plans
from what the shards hold) or the retried upload job writes the images again.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from regis.errors import ConfigError
from regis.faults import crash_point
from regis.indexes.layout import VERSIONS_DIR, read_current, version_name, write_current
from regis.indexes.locks import release_flock
from regis.indexes.manifest import Manifest
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter, _acquire_lock
from regis.models.config import EncoderConfig, WeightsInfo
from regis.sharding.layout import (
    CollectionState,
    collect_retired,
    create_collection,
    read_layout,
    read_state,
    shard_of,
    stored_layout,
    to_global,
    to_local,
    write_layout,
)

log = logging.getLogger(__name__)


def new_shard_options(collection: Path | str, state: CollectionState) -> dict[str, str]:
    """The ``IndexWriter`` arguments of a shard's first version in the published state ``state``: the layout of
    the state's first shard with a version (``stored_layout``: a collection's layout is fixed by its first
    version, as an unsharded index's is, so every shard written later matches it), else, before the collection's
    first version, the layout of its ``collection.json`` (``CollectionConfig.writer_options``: {"faiss_codec":
    "compact", "token_store": "compact"} for ``layout: compact``; the file sits in the collection folder, beside
    ``shards.json``, above the shard folders), else {} (no config: regis's defaults).

    Raises:
        ConfigError: an unreadable ``collection.json``.
        IndexFormatError: a shard's manifest the record lists is missing or corrupt.
    """
    from regis.indexes.collections import read_config
    from regis.indexes.manifest import read_manifest

    for s, name in enumerate(state.names):
        if name is not None:
            return stored_layout(read_manifest(state.shard_path(collection, s) / VERSIONS_DIR / name))
    config = read_config(collection)
    return config.writer_options() if config is not None else {}


class ShardedWriter:
    """A write transaction on every shard of a collection, in global ids.

    Args:
        collection: the collection folder (created with ``num_shards`` shards if missing).
        num_shards: S; must equal an existing collection's.
        encoder, weights: the encoder's config and weights info (checked against existing shards).
        **writer_kwargs: passed to each shard's ``IndexWriter`` (faiss_spec, nprobe, images_root, token_store,
            depth, candidates, lock_timeout_s, keep_versions). A shard with no version yet is written in the
            collection's layout (``new_shard_options``: its shards' once one has a version,
            else its ``collection.json``'s), but for a ``faiss_codec`` or ``token_store`` given here; a shard with
            a version keeps its manifest's (``IndexWriter``), as an unsharded index does.

    Attributes:
        state: the collection's published state this transaction started from (``CollectionState``).
        version: the collection's version: ``state.version`` until ``commit``, then the one it published.

    Raises:
        ConfigError: bad shard count (see ``create_collection``), or an unreadable ``collection.json``.
        IndexFormatError: an unreadable ``shards.json``, or a listed shard version without its manifest.
        IndexMismatchError / IndexLockedError: as ``IndexWriter``, for any shard (IndexLockedError also for the
            collection's own lock).
    """

    def __init__(self, collection: Path | str, num_shards: int, encoder: EncoderConfig, weights: WeightsInfo,
                 **writer_kwargs):
        self.collection = Path(collection)
        create_collection(self.collection, num_shards)
        self.num_shards = num_shards
        self.writers: list[IndexWriter] = []
        self._lock_fd: int | None = _acquire_lock(self.collection, writer_kwargs.get("lock_timeout_s", 0.0))
        try:
            layout = read_layout(self.collection)  # under the collection's lock: the last writer's record
            self.state = read_state(self.collection, layout)
            self._extra = collect_retired(self.collection, layout)  # re-sharding's old folders, once unread
            first = {k: v for k, v in new_shard_options(self.collection, self.state).items()
                     if writer_kwargs.get(k) is None}  # a shard's first version: the collection's layout
            for s in range(num_shards):
                kwargs = writer_kwargs if self.state.names[s] is not None else {**writer_kwargs, **first}
                self.writers.append(IndexWriter(self.state.shard_path(self.collection, s), encoder, weights,
                                                base=self.state.names[s], **kwargs))
            if self.state.recorded:
                self._point_currents(self.state.names)  # a writer killed after the record, before the hints
        except BaseException:
            self.abort()
            raise
        self.version = self.state.version
        highest = [int(to_global(np.array([w.next_id - 1]), s, num_shards)[0]) + 1 if w.next_id else 0
                   for s, w in enumerate(self.writers)]
        self.next_id = max(int(layout["next_id"]), *highest)
        self._done = False

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    def records_by_path(self) -> dict[str, ImageRecord]:
        """Every shard's table rows by path, with global ids."""
        out: dict[str, ImageRecord] = {}
        for s, w in enumerate(self.writers):
            for path, rec in w.table.by_path().items():
                out[path] = dataclasses.replace(rec, id=rec.id * self.num_shards + s)
        return out

    def allocate_ids(self, n: int) -> np.ndarray:
        """Hand out ``n`` new global image ids (int64), never used before in this collection."""
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return ids

    def reserve_until(self, next_id: int) -> None:
        """Treat every global id below ``next_id`` as handed out (ids a previous transaction of the same build
        allocated but has not committed yet)."""
        self.next_id = max(self.next_id, int(next_id))

    def _by_shard(self, ids: np.ndarray):
        shards = shard_of(ids, self.num_shards)
        for s in np.unique(shards):
            rows = np.flatnonzero(shards == s)
            yield int(s), rows, to_local(ids[rows], self.num_shards)

    def put(self, records: list[ImageRecord], tokens: np.ndarray, buddies: np.ndarray | None = None,
            grid: tuple[int, int] | None = None) -> None:
        """Store images under their global ids (from ``allocate_ids``, or live ids for new tokens).

        Args:
            records: one ImageRecord per image, ``id`` the global id.
            tokens: (n, T, D) float unit-norm tokens.
            buddies, grid: optional (n, R + 1) buddy patches and their (h, w) grid (``IndexWriter.put``).

        Raises:
            ConfigError: shape mismatch, or an id never allocated.
        """
        if len(records) != len(tokens):
            raise ConfigError(f"{len(records)} records for {len(tokens)} token sets")
        if not records:
            return
        ids = np.array([r.id for r in records], dtype=np.int64)
        if (ids < 0).any() or (ids >= self.next_id).any():
            raise ConfigError("global image ids must come from allocate_ids()")
        for s, rows, local in self._by_shard(ids):
            w = self.writers[s]
            need = int(local.max()) + 1 - w.next_id
            if need > 0:
                w.allocate_ids(need)  # the shard's ids below stay free (images of other shards, failed files)
            w.put([dataclasses.replace(records[r], id=int(i)) for r, i in zip(rows, local, strict=True)],
                  tokens[rows], buddies=None if buddies is None else buddies[rows], grid=grid)

    def update_records(self, records: list[ImageRecord]) -> None:
        """Change table rows (global ids) without touching their tokens."""
        ids = np.array([r.id for r in records], dtype=np.int64)
        for s, rows, local in self._by_shard(ids):
            self.writers[s].update_records(
                [dataclasses.replace(records[r], id=int(i)) for r, i in zip(rows, local, strict=True)])

    def delete(self, ids) -> None:
        """Remove images by global id; unknown ids are ignored."""
        ids = np.asarray(list(ids), dtype=np.int64)
        for s, _, local in self._by_shard(ids):
            self.writers[s].delete(local.tolist())

    def commit(self, report: dict | None = None, next_id: int | None = None) -> list[Manifest | None]:
        """Write every changed shard's new version, rename each into its shard, publish them all with the new
        collection record (one rename; ``version`` + 1), then write the shards' CURRENT hints, collect old
        versions and release the locks (module docstring). An error before the record is replaced leaves the
        collection as it was.

        Args:
            report: JSON-ready build report saved in each new shard version.
            next_id: the next id to record (default: this writer's ``next_id``). A checkpoint of a longer build
                records the end of what it committed, so that a resumed build hands the ids of the files still
                missing out again in the same order (the ids a single uninterrupted build gives them).

        Returns:
            Each shard's new manifest, or None where the shard did not change.

        Raises:
            RuntimeError: already committed or aborted.
            Exception: whatever a shard's writing or renaming, or the record's writing, fails with (the
                transaction is aborted, nothing published).
        """
        if self._done:
            raise RuntimeError("this ShardedWriter is already committed or aborted")
        self._done = True
        renamed: list[IndexWriter] = []
        try:
            manifests = [w.prepare(report) for w in self.writers]
            for w, manifest in zip(self.writers, manifests, strict=True):
                if manifest is not None:
                    w.publish(current=False)  # in versions/, listed by no record yet
                    renamed.append(w)
                    crash_point("sharded.shard-renamed")
            names = tuple(version_name(m.version) if m is not None else name
                          for m, name in zip(manifests, self.state.names, strict=True))
            state = CollectionState(self.state.version + 1 if renamed else self.state.version, names,
                                    dirs=self.state.dirs)
            write_layout(self.collection, self.num_shards, self.next_id if next_id is None else next_id, state,
                         self._extra)
        except BaseException:
            self._withdraw(renamed)
            raise
        self.version = state.version
        crash_point("sharded.record-written")
        try:
            self._point_currents(names)
            for w in self.writers:
                w.finish()  # garbage collection (also of versions a killed writer left), then the lock
        finally:
            self.abort()  # every lock released, also after a failed clean-up
        return manifests

    def _point_currents(self, names) -> None:
        """Make each shard's CURRENT name its version in the record (a hint for tools that open one shard)."""
        for s, name in enumerate(names):
            path = self.state.shard_path(self.collection, s)
            if name is not None and read_current(path) != name:
                write_current(path, name)

    def _withdraw(self, renamed: list[IndexWriter]) -> None:
        """After a failed commit, before the record was replaced: remove the shards' renamed versions (no reader
        sees them) and release every lock. Best effort per shard: an error removing one (logged) must neither
        hide the commit's own error nor keep the other shards' locks held; a version left behind is collected
        by that shard's next write."""
        try:
            for w in renamed:
                try:
                    w.withdraw()
                except Exception:
                    log.exception("could not withdraw the renamed version of %s; its next write collects it", w.dir)
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop every shard's unpublished changes and release every lock."""
        self._done = True
        try:
            for w in self.writers:
                w.abort()
        finally:
            if self._lock_fd is not None:
                release_flock(self._lock_fd)
                self._lock_fd = None


def split_index(index_dir: Path | str, collection: Path | str, num_shards: int, chunk: int = 4096,
                **writer_kwargs) -> list[Manifest | None]:
    """Copy the live images of an unsharded index into a new sharded collection, same ids, tokens and buddy
    patches (when the index stores them: explanations then equal the unsharded index's).

    Args:
        index_dir: the unsharded index.
        collection: the new collection folder.
        num_shards: S.
        chunk: images copied per step.
        **writer_kwargs: as ``ShardedWriter`` (e.g. ``faiss_spec`` for every shard).

    Returns:
        The shards' manifests.

    Raises:
        IndexFormatError: no readable index in ``index_dir``.
    """
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index_dir)
    try:
        m = snap.manifest
        writer_kwargs.setdefault("images_root", m.images_root)
        grid = tuple(m.buddies.grid) if snap.buddies is not None and m.buddies is not None else None
        with ShardedWriter(collection, num_shards, m.encoder, m.weights, **writer_kwargs) as w:
            w.allocate_ids(m.next_id)
            for ids, tokens in snap.store.iter_chunks(chunk):
                recs = snap.table.get_many(ids.tolist())
                buddies = np.asarray(snap.buddies[ids]) if grid is not None else None
                w.put([recs[int(i)] for i in ids], np.asarray(tokens, dtype=np.float32), buddies=buddies, grid=grid)
            return w.commit()
    finally:
        snap.close()


class _CollectionTable:
    """The read side of an ``IndexWriter``'s table (``get``, ``get_many``, ``get_by_paths``) over every shard of
    a ``CollectionWriter``, in global ids (the rows of this transaction's view)."""

    def __init__(self, writer: ShardedWriter):
        self.writer = writer

    def _global(self, shard: int, rec: ImageRecord) -> ImageRecord:
        return dataclasses.replace(rec, id=rec.id * self.writer.num_shards + shard)

    def get_many(self, ids) -> dict[int, ImageRecord]:
        """Rows of global ``ids``, keyed by global id; unknown ids are absent."""
        ids = np.asarray(list(ids), dtype=np.int64)
        out: dict[int, ImageRecord] = {}
        for s, _, local in self.writer._by_shard(ids):
            for rec in self.writer.writers[s].table.get_many(local.tolist()).values():
                g = self._global(s, rec)
                out[g.id] = g
        return out

    def get(self, image_id: int) -> ImageRecord | None:
        """The row of global id ``image_id`` (None: none)."""
        return self.get_many([int(image_id)]).get(int(image_id))

    def by_path(self) -> dict[str, ImageRecord]:
        """Every row by path (every shard), with global ids."""
        return self.writer.records_by_path()

    def get_by_paths(self, paths) -> dict[str, ImageRecord]:
        """Rows by path (any shard), with global ids."""
        paths = list(paths)
        out: dict[str, ImageRecord] = {}
        for s, w in enumerate(self.writer.writers):
            out.update({p: self._global(s, rec) for p, rec in w.table.get_by_paths(paths).items()})
        return out


@dataclasses.dataclass(frozen=True)
class CollectionVersion:
    """What ``CollectionWriter.commit`` published: ``version``, the collection's new version (its record's, what
    ``regis.sharding.engine.ShardedView.version`` serves)."""

    version: int


class CollectionWriter(ShardedWriter):
    """A ``ShardedWriter`` on an existing collection with the part of ``IndexWriter``'s interface that the
    service's writes and folder builds use (``indexer.uploads.add_images`` / ``delete_images``,
    ``indexer.metadata``, ``indexer.build.build_index``): ``table``, ``is_live``, ``base`` and ``prefix_paths``
    in global ids, and ``commit`` returning the collection's new version. It holds every shard's write lock
    until it commits or aborts.

    Args:
        collection: the collection folder (``read_layout`` gives S).
        encoder, weights: the collection's encoder config and weights record (checked against each shard's).
        **writer_kwargs: as ``IndexWriter`` (``lock_timeout_s``, ...).

    Raises:
        IndexFormatError: not a sharded collection.
        IndexMismatchError / IndexLockedError: as ``IndexWriter``, for any shard.
    """

    def __init__(self, collection: Path | str, encoder: EncoderConfig, weights: WeightsInfo, **writer_kwargs):
        super().__init__(collection, read_layout(collection)["num_shards"], encoder, weights, **writer_kwargs)
        self.table = _CollectionTable(self)

    @property
    def base(self) -> Manifest | None:
        """The manifest of the first shard that has a version in the state this transaction started from (the
        collection's encoder, FAISS settings and images root, which every shard shares); None: no image yet."""
        return next((w.base for w in self.writers if w.base is not None), None)

    def prefix_paths(self, prefix: str, exclude_prefix: str, folder_key: str | None = None) -> None:
        """``IndexWriter.prefix_paths`` on every shard (a folder build whose images root widens)."""
        for w in self.writers:
            w.prefix_paths(prefix, exclude_prefix, folder_key)

    def is_live(self, image_id: int) -> bool:
        """Whether global id ``image_id`` has tokens in this transaction's view."""
        if not 0 <= int(image_id) < 2**62:
            return False
        s = int(shard_of(int(image_id), self.num_shards))
        return self.writers[s].is_live(int(to_local(np.array([int(image_id)]), self.num_shards)[0]))

    def commit(self, report: dict | None = None, next_id: int | None = None) -> CollectionVersion | None:
        """Publish every changed shard (``ShardedWriter.commit``); the collection's new version, or None when no
        shard changed."""
        manifests = super().commit(report, next_id)
        if all(m is None for m in manifests):
            return None
        return CollectionVersion(self.version)
