"""Writing an index: one transaction -> one new, complete version, published atomically.

Usage::

    with IndexWriter(index_dir, encoder.config, encoder.weights_info) as w:
        ids = w.allocate_ids(len(batch))
        w.put(records, tokens)          # new images, or new tokens for existing ids
        w.put(records, tokens, buddies=b, grid=(h, w))  # ... with their buddy patches (match explanations)
        w.delete([7, 9])
        manifest = w.commit()           # None when nothing changed

Only one writer per index directory at a time (an exclusive ``flock`` on ``.lock``). New token rows go into
a fresh segment file; the table, locations and FAISS index are written into a temporary version directory
that is renamed into place, and CURRENT is replaced last. A writer killed anywhere leaves the previous
version live; the leftovers are removed by the next writer.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from regis.errors import ConfigError, IndexFormatError, IndexMismatchError
from regis.faults import crash_point
from regis.indexes import codes as token_codes
from regis.indexes import faiss_index
from regis.indexes.layout import (
    BUDDIES_FILE,
    FAISS_FILE,
    LOCATIONS_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    REPORT_FILE,
    SEGMENTS_DIR,
    TABLE_FILE,
    TMP_PREFIX,
    VERSIONS_DIR,
    fsync_dir,
    fsync_file,
    read_current,
    version_name,
    write_current,
)
from regis.indexes.locks import acquire_flock, release_flock
from regis.indexes.manifest import BuddyInfo, FaissInfo, Manifest, SegmentInfo, TokenStoreInfo, read_manifest
from regis.indexes.npy import load_npy
from regis.indexes.store import TOKEN_DTYPE, TokenStore, empty_locations
from regis.indexes.table import ImageRecord, ImageTable
from regis.indexes.weights_copy import store_weights
from regis.models.config import EncoderConfig, WeightsInfo

DEFAULT_KEEP_VERSIONS = 3
FROM_CURRENT = "<CURRENT>"  # IndexWriter's default base: the version CURRENT names
# Token segments one version may reference. Every write adds a segment and every open version maps each of its
# segments (one file descriptor each), so past this many the small ones are merged (``_compact_segments``).
MAX_SEGMENTS = 8
_ADD_CHUNK = 16384  # images per FAISS add call while rebuilding


def _acquire_lock(index_dir: Path, timeout_s: float) -> int:
    """The write lock of an index (or a sharded collection's) folder: ``acquire_flock`` on its lock file."""
    return acquire_flock(index_dir / LOCK_FILE, timeout_s,
                         f"another process is writing to the index {index_dir}; try again later")


def _published_versions(index_dir: Path) -> list[int]:
    vdir = index_dir / VERSIONS_DIR
    if not vdir.is_dir():
        return []
    out = []
    for p in vdir.iterdir():
        if p.name.startswith("v") and p.name[1:].isdigit():
            out.append(int(p.name[1:]))
    return sorted(out)


class IndexWriter:
    """A write transaction on an index directory (see module docstring).

    Args:
        index_dir: the index directory (created if missing).
        encoder: the encoder config the tokens come from; must match an existing index's.
        weights: the encoder's weights info; its checksum must match an existing index's.
        faiss_spec: FAISS factory spec to use; None keeps an explicit spec of the base index, or lets regis
            choose by size (``faiss_index.auto_spec``).
        nprobe: default IVF probes recorded in the manifest (None: keep the base's while the FAISS spec stays the
            same, else the tuned default for the spec, ``faiss_index.default_nprobe``).
        images_root: absolute path of the indexed folder, recorded in the manifest (None: keep the base's).
        keep_versions: published versions kept on disk after a commit (>= 1).
        lock_timeout_s: how long to wait for another writer to finish.
        token_store: what the ANN rerank reads: "float16" (the segments), "pq" (``RR{D},PQ{D/4}``), "compact"
            (``codes.compact_store``, re-picked by size at every write: ``TokenStoreInfo.rule``) or a FAISS codec
            spec such as "PQ96" (``regis.indexes.codes``); None keeps the base's (an index written with float16
            stays float16; a compact one stays compact), else ``codes.default_store``.
        depth: default candidate depth k' recorded in the manifest (None: keep the base's while the FAISS spec
            stays the same, else ``faiss_index.default_depth``).
        candidates: candidate method recorded in the manifest, "bounded" or "depth"
            (``regis.retrieve.candidates``); None keeps the base's, else "bounded".
        faiss_codec: the IVF vector codec regis sizes its spec with (``faiss_index.auto_spec``), e.g. ``PQ32x4fsr``
            (the compact layout, docs/SCALE.md; "compact": ``faiss_index.compact_codec``): the lists still follow the
            collection's size, the codec stays as it grows; recorded in the manifest (``FaissInfo.codec``). None:
            the base's, else regis's. Ignored under an explicit ``faiss_spec``.
        k_factor: FAISS neighbours fetched per query token, as a multiple of the depth, re-ranked on the token
            store's codes (``FaissInfo.k_factor``); None: keep the base's while the FAISS spec stays the same, else
            ``faiss_index.default_k_factor`` (4 for FAISS codes of at most 1 bit per dimension, else 1).
        base: the version this transaction starts from: ``FROM_CURRENT`` (the one CURRENT names), a version
            name, or None (an empty index). A sharded collection's writer passes the version its collection
            record lists (``regis.sharding.layout``), which CURRENT may lag behind.

    Raises:
        IndexLockedError: another writer holds the lock past the timeout.
        IndexMismatchError: the existing index was built with another encoder config or weights.
        ConfigError: bad arguments.
    """

    def __init__(
        self,
        index_dir: Path | str,
        encoder: EncoderConfig,
        weights: WeightsInfo,
        faiss_spec: str | None = None,
        nprobe: int | None = None,
        images_root: str | None = None,
        keep_versions: int = DEFAULT_KEEP_VERSIONS,
        lock_timeout_s: float = 0.0,
        token_store: str | None = None,
        depth: int | None = None,
        candidates: str | None = None,
        base: str | None = FROM_CURRENT,
        k_factor: int | None = None,
        faiss_codec: str | None = None,
    ):
        if keep_versions < 1:
            raise ConfigError(f"keep_versions must be >= 1, got {keep_versions}")
        if token_store is not None:
            token_store = token_codes.check_spec(token_store, encoder.dim)
        if depth is not None and depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        self._token_store_arg = token_store
        self._depth_arg = depth
        if k_factor is not None and k_factor < 1:
            raise ConfigError(f"k_factor must be >= 1, got {k_factor}")
        self._k_factor_arg = k_factor
        if faiss_codec == faiss_index.COMPACT:
            faiss_codec = faiss_index.compact_codec(encoder.dim)
        if faiss_codec is not None:
            faiss_index.new_index(f"IVF256,{faiss_codec}", encoder.dim)  # a codec FAISS can build: checked now
        self._codec_arg = faiss_codec
        if candidates is not None and candidates not in ("depth", "bounded"):
            raise ConfigError(f"candidates must be 'depth' or 'bounded', got {candidates!r}")
        self._candidates_arg = candidates
        self._nprobe_arg = nprobe
        self.dir = Path(index_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / SEGMENTS_DIR).mkdir(exist_ok=True)
        (self.dir / VERSIONS_DIR).mkdir(exist_ok=True)
        self._lock_fd: int | None = _acquire_lock(self.dir, lock_timeout_s)
        try:
            self._open(encoder, weights, faiss_spec, nprobe, images_root, keep_versions, base)
        except BaseException:
            self._release()
            raise

    def _open(self, encoder, weights, faiss_spec, nprobe, images_root, keep_versions, base) -> None:
        self.encoder = encoder
        self.weights = weights
        self.keep_versions = keep_versions
        self.T = encoder.tokens_per_image
        self.D = encoder.dim
        base_name = read_current(self.dir) if base == FROM_CURRENT else base
        self.base: Manifest | None = read_manifest(self.dir / VERSIONS_DIR / base_name) if base_name else None
        base_dir = self.dir / VERSIONS_DIR / base_name if base_name else None
        if self.base is not None:
            if self.base.encoder != encoder or self.base.weights.sha256 != weights.sha256:
                differing = [f"{k} {a!r} vs {b!r}" for k, (a, b) in self.base.encoder.differences(encoder).items()]
                if self.base.weights.sha256 != weights.sha256:  # named too when the config differs as well
                    differing.append("the weights")
                differing = ", ".join(differing)
                raise IndexMismatchError(
                    f"the index in {self.dir} was built with encoder {self.base.encoder.backbone} "
                    f"(weights {self.base.weights.source}, sha256 {self.base.weights.sha256[:12]}, "
                    f"N = {self.base.encoder.roi_size}, tokens {self.base.encoder.token_set}); it cannot take tokens "
                    f"from {encoder.backbone} (weights {weights.source}, sha256 {weights.sha256[:12]}, "
                    f"N = {encoder.roi_size}, tokens {encoder.token_set}); they differ in {differing} (index vs "
                    "encoder). Build into a new index directory."
                )
        self.explicit_spec = faiss_spec or (self.base.faiss.spec if self.base and not self.base.faiss.auto else None)
        if faiss_spec:
            faiss_index.new_index(faiss_spec, self.D)  # validate the spec now, not at commit
        self.nprobe = nprobe or (self.base.faiss.nprobe if self.base else FaissInfo.model_fields["nprobe"].default)
        self.images_root = images_root or (self.base.images_root if self.base else None)
        self.version = max([self.base.version if self.base else 0, *_published_versions(self.dir)]) + 1
        self.tmp_dir = self.dir / VERSIONS_DIR / f"{TMP_PREFIX}{version_name(self.version)}-{uuid.uuid4().hex[:8]}"
        self.tmp_dir.mkdir()
        if base_dir is not None:
            shutil.copyfile(base_dir / TABLE_FILE, self.tmp_dir / TABLE_FILE)
            self.locations = load_npy(base_dir / LOCATIONS_FILE)
            self.segments = list(self.base.segments)
            self.next_id = self.base.next_id
        else:
            self.locations = empty_locations(0)
            self.segments = []
            self.next_id = 0
        self.table = ImageTable(self.tmp_dir / TABLE_FILE, readonly=False)
        self._base_dir = base_dir
        self.buddies, self.buddy_grid = self._load_buddies(base_dir)
        self._seg_name = f"seg-{uuid.uuid4().hex}.f16"
        self._seg_tmp = self.dir / SEGMENTS_DIR / f"{TMP_PREFIX}{self._seg_name}"
        self._seg_file = None
        self._seg_rows = 0
        self._removed: set[int] = set()  # ids whose tokens must leave the FAISS index
        self._added: list[int] = []  # ids whose tokens are in the new segment
        self._changed = False
        self._done = False
        self._prepared: Manifest | None = None
        self._published = False  # renamed into versions/
        self._made_live = False  # ... and CURRENT names it

    def _load_buddies(self, base_dir: Path | None) -> tuple[np.ndarray | None, tuple[int, int] | None]:
        """The base version's buddy patches, sized like ``locations`` (None when it has none)."""
        if base_dir is None or self.base is None or self.base.buddies is None:
            return None, None
        try:
            stored = load_npy(base_dir / self.base.buddies.file)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{base_dir / self.base.buddies.file} is missing or corrupt") from exc
        out = np.full((len(self.locations), self.encoder.buddies_per_image), -1, dtype=np.int16)
        n = min(len(stored), len(out))
        out[:n] = stored[:n]
        return out, tuple(self.base.buddies.grid)

    def _put_buddies(self, ids: np.ndarray, buddies, grid) -> None:
        """Record the buddy patches of ``ids`` (-1 rows when the caller gave none)."""
        if buddies is None:
            if self.buddies is not None:
                self.buddies[ids] = -1
            return
        grid = (int(grid[0]), int(grid[1]))
        if self.buddies is None:
            self.buddies = np.full((len(self.locations), self.encoder.buddies_per_image), -1, dtype=np.int16)
            self.buddy_grid = grid
        elif grid != self.buddy_grid:
            raise ConfigError(f"buddy patches on a {grid} grid cannot join an index on a {self.buddy_grid} grid")
        self.buddies[ids] = buddies

    # ----------------------------------------------------------------- transaction API
    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    def allocate_ids(self, n: int) -> np.ndarray:
        """Hand out ``n`` new image ids (int64), never used before in this index."""
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        if len(self.locations) < self.next_id:
            grown = empty_locations(max(self.next_id, 2 * len(self.locations)))
            grown[: len(self.locations)] = self.locations
            self.locations = grown
            if self.buddies is not None:
                more = np.full((len(grown), self.buddies.shape[1]), -1, dtype=np.int16)
                more[: len(self.buddies)] = self.buddies
                self.buddies = more
        return ids

    def is_live(self, image_id: int) -> bool:
        """Whether ``image_id`` currently has tokens in this transaction's view."""
        return 0 <= image_id < len(self.locations) and self.locations[image_id, 0] >= 0

    def put(self, records: list[ImageRecord], tokens: np.ndarray, buddies: np.ndarray | None = None,
            grid: tuple[int, int] | None = None) -> None:
        """Store images: new ids (from ``allocate_ids``) or new tokens for live ids.

        Args:
            records: one ImageRecord per image, ``id`` set.
            tokens: (n, T, D) float (stored as float16), unit-norm tokens from the index's encoder.
            buddies: optional (n, R + 1) int buddy patches (``RegisEncoder.encode_with_buddies``; R + 1 per framing,
                ``EncoderConfig.buddies_per_image``), stored in ``buddies.npy`` for match explanations; without
                them these images' rows read -1 (unknown).
            grid: the (h, w) patch grid ``buddies`` index; required with ``buddies``.

        Raises:
            ConfigError: shape mismatch, an id that was never allocated, buddies without a grid or on
                another grid than the index's.
        """
        if tokens.ndim != 3 or tokens.shape[1:] != (self.T, self.D) or tokens.shape[0] != len(records):
            raise ConfigError(
                f"expected tokens of shape ({len(records)}, {self.T}, {self.D}), got {tuple(tokens.shape)}"
            )
        if buddies is not None:
            buddies = np.asarray(buddies)
            want = (len(records), self.encoder.buddies_per_image)
            if buddies.shape != want or grid is None:
                raise ConfigError(f"expected buddies of shape {want} and their grid, got {buddies.shape}, {grid}")
        if not records:
            return
        ids = np.array([r.id for r in records], dtype=np.int64)
        if (ids < 0).any() or (ids >= self.next_id).any():
            raise ConfigError("image ids must come from allocate_ids()")
        self._put_buddies(ids, buddies, grid)
        if self._seg_file is None:
            self._seg_file = open(self._seg_tmp, "wb")  # noqa: SIM115 (closed in commit/abort)
        self._seg_file.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes())
        seg_index = len(self.segments)
        for i, image_id in enumerate(ids):
            if self.locations[image_id, 0] >= 0:
                self._removed.add(int(image_id))
            self.locations[image_id] = (seg_index, self._seg_rows + i)
        self._seg_rows += len(ids)
        self._added.extend(int(i) for i in ids)
        self.table.upsert(records)
        self._changed = True

    def update_records(self, records: list[ImageRecord]) -> None:
        """Change table rows of live images without touching their tokens (e.g. a new mtime)."""
        if records:
            self.table.upsert(records)
            self._changed = True

    def prefix_paths(self, prefix: str, exclude_prefix: str, folder_key: str | None = None) -> None:
        """Put ``prefix`` before every table path that does not start with ``exclude_prefix`` (the index's
        images root moved up to a parent folder; ids and tokens stay); see ``ImageTable.prefix_paths``."""
        if self.table.prefix_paths(prefix, exclude_prefix, folder_key):
            self._changed = True

    def delete(self, ids) -> None:
        """Remove images by id; unknown or already-deleted ids are ignored."""
        live = [int(i) for i in ids if self.is_live(int(i))]
        if not live:
            return
        for image_id in live:
            self.locations[image_id] = (-1, -1)
            self._removed.add(image_id)
            if self.buddies is not None:
                self.buddies[image_id] = -1
        self.table.delete(live)
        self._changed = True

    def abort(self) -> None:
        """Drop everything this transaction wrote; the live version is untouched. After ``publish`` (before
        ``finish``) nothing is dropped: the lock is released."""
        if self._done:
            self._release()
            return
        try:
            self._drop_temporary()
        finally:
            self._release()

    def _drop_temporary(self) -> None:
        """Remove this transaction's unpublished files (its segment and version under construction)."""
        self._done = True
        if self._seg_file is not None:
            self._seg_file.close()
        self._seg_tmp.unlink(missing_ok=True)
        self.table.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def commit(self, report: dict | None = None) -> Manifest | None:
        """Publish the new version; returns its manifest, or None (and aborts) when nothing changed
        (``prepare``, ``publish``, ``finish``).

        Args:
            report: optional JSON-ready build report, saved as ``build_report.json`` in the version.
        """
        manifest = self.prepare(report)
        if manifest is None:
            self.abort()
            return None
        self.publish()
        self.finish()
        return manifest

    def prepare(self, report: dict | None = None) -> Manifest | None:
        """The first step of ``commit``: write the new version in full (segments, FAISS index, table, manifest,
        all fsynced) without publishing it; its manifest, or None when nothing changed (the transaction is
        still open then). A writer of several indexes (``regis.sharding.write``) prepares each before it
        publishes any, so an error in one publishes nothing.

        Raises:
            RuntimeError: already committed, prepared or aborted.
            Exception: whatever writing fails with (the transaction is then aborted).
        """
        if self._done or self._prepared is not None:
            raise RuntimeError("this IndexWriter is already committed, prepared or aborted")
        if not self._changed:
            return None
        try:
            self._prepared = self._write_version(report)
        except BaseException:
            self.abort()
            raise
        return self._prepared

    def publish(self, current: bool = True) -> None:
        """Make the prepared version live (rename it into ``versions/``, then replace CURRENT); the lock is
        kept until ``finish`` (or ``abort``).

        Args:
            current: False: only rename the version into ``versions/``; the caller makes it live another way
                (a sharded collection's record, ``regis.sharding.write``) and calls ``withdraw`` if it cannot.
                Until then no reader opens it, and the next writer removes it if it was never made live.

        Raises:
            RuntimeError: not prepared.
            OSError: the rename or CURRENT could not be written (the transaction is then aborted, the live
                version untouched).
        """
        if self._prepared is None or self._done:
            raise RuntimeError("publish() needs a prepared, unpublished IndexWriter")
        try:
            self._publish(current)
        except BaseException:
            self.abort()
            raise
        self._done = self._published = True
        self._made_live = current

    def withdraw(self) -> None:
        """After ``publish(current=False)``: remove the renamed version (the caller could not make it live)
        and release the lock."""
        if self._published and not self._made_live:
            shutil.rmtree(self.dir / VERSIONS_DIR / version_name(self.version), ignore_errors=True)
            self._published = False
        self.abort()

    def finish(self) -> None:
        """After ``publish``: drop the versions and segments no kept version needs, and release the lock. On
        a transaction that changed nothing (``prepare`` returned None): drop its temporary files, collect the
        garbage around the version it started from (e.g. versions a killed writer renamed but never made live),
        and release the lock."""
        try:
            if not self._done:
                self._drop_temporary()
            self._collect_garbage()
        finally:
            self._release()

    # ----------------------------------------------------------------- commit steps
    def _finish_segment(self) -> None:
        if self._seg_file is None:
            return
        self._seg_file.flush()
        os.fsync(self._seg_file.fileno())
        self._seg_file.close()
        self._seg_file = None
        os.replace(self._seg_tmp, self.dir / SEGMENTS_DIR / self._seg_name)
        fsync_dir(self.dir / SEGMENTS_DIR)
        self.segments.append(SegmentInfo(file=self._seg_name, rows=self._seg_rows))

    def _compact_segments(self, max_segments: int = MAX_SEGMENTS) -> None:
        """Bound the segments this version references: past ``max_segments``, merge every segment but the
        largest into one new segment holding only their live rows (deleted and replaced rows are dropped), and
        point ``locations`` at it. Segment files are immutable: the merged ones stay for the kept older
        versions and are garbage-collected with them. Tiered like an LSM: the big base segment is rewritten
        only when it is the small one."""
        if len(self.segments) <= max_segments:
            return
        largest = max(range(len(self.segments)), key=lambda i: self.segments[i].rows)
        merged = [i for i in range(len(self.segments)) if i != largest]
        store = self._store()
        seg_of = self.locations[: self.next_id, 0]
        ids = np.flatnonzero(np.isin(seg_of, merged))  # live ids stored in the merged segments, ascending
        name = f"seg-{uuid.uuid4().hex}.f16"
        tmp = self.dir / SEGMENTS_DIR / f"{TMP_PREFIX}{name}"
        with open(tmp, "wb") as f:
            for _, tokens in store.iter_chunks(_ADD_CHUNK, ids):
                f.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / SEGMENTS_DIR / name)
        fsync_dir(self.dir / SEGMENTS_DIR)
        remap = np.full(len(self.segments), -1, dtype=np.int64)
        remap[largest] = 0
        live = seg_of >= 0
        new_seg = seg_of.copy()
        new_seg[live] = remap[seg_of[live]]
        new_seg[ids] = 1
        self.locations[: self.next_id, 0] = new_seg
        self.locations[ids, 1] = np.arange(len(ids), dtype=np.int64)
        self.segments = [self.segments[largest], SegmentInfo(file=name, rows=len(ids))]

    def _store(self) -> TokenStore:
        return TokenStore(self.dir / SEGMENTS_DIR, self.segments, self.locations[: self.next_id], self.T, self.D)

    def _build_faiss(self, store: TokenStore, spec: str):
        index = faiss_index.new_index(spec, self.D)
        live = store.live_ids
        if faiss_index.needs_training(index):
            want = max(faiss_index.min_training_vectors(index), 1)
            n_images = min(len(live), -(-want // self.T))
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(live, size=n_images, replace=False)) if n_images < len(live) else live
            vectors = store.get(sample).reshape(-1, self.D).astype(np.float32)
            if len(vectors) < faiss_index.min_training_vectors(index):
                raise ConfigError(
                    f"FAISS spec {spec!r} needs {faiss_index.min_training_vectors(index)} training vectors, "
                    f"the index has {len(vectors)}: use fewer IVF lists or Flat"
                )
            faiss_index.train(index, vectors)
        for ids, tokens in store.iter_chunks(_ADD_CHUNK):
            faiss_index.add_tokens(index, ids, tokens)
        return index

    def _update_faiss(self, store: TokenStore, spec: str):
        base_ok = self.base is not None and self.base.faiss.spec == spec and self._base_dir is not None
        if not base_ok:
            return self._build_faiss(store, spec)
        index = faiss_index.read(self._base_dir / FAISS_FILE)
        try:
            faiss_index.remove_images(index, np.array(sorted(self._removed), dtype=np.int64), self.T)
        except RuntimeError:  # index type without remove_ids (HNSW): rebuild from the store
            return self._build_faiss(store, spec)
        added = np.array(sorted(i for i in set(self._added) if self.locations[i, 0] >= 0), dtype=np.int64)
        for start in range(0, len(added), _ADD_CHUNK):
            part = added[start : start + _ADD_CHUNK]
            faiss_index.add_tokens(index, part, store.get(part))
        return index

    def _write_codes(self, store: TokenStore) -> TokenStoreInfo:
        """Write codec.faiss + codes.npy for a compressed token store; reuses the base's codec (encoding only
        the new rows) while the spec stays the same, else trains one on a sample of the live tokens."""
        live = store.live_ids
        arg = self._token_store_arg
        rule = token_codes.COMPACT if arg == token_codes.COMPACT else (
            None if arg or self.base is None else self.base.token_store.rule)
        if rule == token_codes.COMPACT:
            spec = token_codes.compact_store(len(live) * self.T, self.D)
        else:
            spec = arg or (self.base.token_store.spec if self.base else token_codes.default_store(self.D))
        if spec == token_codes.FLOAT16:
            return TokenStoreInfo()
        codes_path = self._base_dir / token_codes.CODES_FILE if self._base_dir is not None else None
        reuse = self.base is not None and self.base.token_store.spec == spec and codes_path.is_file()
        if reuse:
            codec = token_codes.read_codec(self._base_dir / token_codes.CODEC_FILE)
            base_codes = load_npy(codes_path, mmap_mode="r")
            todo = np.array(sorted(i for i in set(self._added) if self.locations[i, 0] >= 0), dtype=np.int64)
        else:
            rng = np.random.default_rng(0)
            n_train = min(len(live), token_codes.TRAIN_IMAGES)
            sample = np.sort(rng.choice(live, size=n_train, replace=False)) if n_train < len(live) else live
            codec = token_codes.train_codec(spec, store.get(sample).reshape(-1, self.D).astype(np.float32))
            base_codes = None
            todo = live
        cs = token_codes.code_size(codec)
        codes = np.zeros((self.next_id, self.T, cs), dtype=np.uint8)
        if base_codes is not None:
            codes[: len(base_codes)] = base_codes
        for start in range(0, len(todo), _ADD_CHUNK):
            part = todo[start : start + _ADD_CHUNK]
            codes[part] = token_codes.encode(codec, store.get(part))
        dead = np.ones(self.next_id, dtype=bool)
        dead[live] = False
        codes[dead] = 0
        token_codes.write_codec(codec, self.tmp_dir / token_codes.CODEC_FILE)
        np.save(self.tmp_dir / token_codes.CODES_FILE, codes)
        same = self.base is not None and self.base.token_store.spec == spec
        if same:  # an existing index keeps its own refine rule
            refine, share = self.base.token_store.refine, self.base.token_store.refine_share
        else:
            refine, share = token_codes.DEFAULT_REFINE, token_codes.DEFAULT_REFINE_SHARE
        return TokenStoreInfo(spec=spec, code_size=cs, refine=refine, refine_share=share, rule=rule)

    def _write_version(self, report: dict | None) -> Manifest:
        self._finish_segment()
        self._compact_segments()
        store_weights(self.dir, self.weights)  # fine-tuned weights travel with the index (by content hash)
        crash_point("writer.segment-written")
        store = self._store()
        num_images = len(store)
        auto = self.explicit_spec is None
        # an index regis sized keeps the vector codec it was written with as it grows (an SQ8 index written
        # before wide tokens got fast-scan PQ stays SQ8: no rebuild of its FAISS index for that alone)
        codec = self._codec_arg or (self.base.faiss.codec if self.base is not None else None)
        kept_codec = codec or (faiss_index.spec_codec(self.base.faiss.spec) if self.base is not None else None)
        spec = self.explicit_spec or faiss_index.auto_spec(num_images, self.T, self.D, kept_codec,
                                                           self.encoder.framings)
        index = self._update_faiss(store, spec)
        if index.ntotal != num_images * self.T:
            raise RuntimeError(f"FAISS holds {index.ntotal} vectors, expected {num_images * self.T}")
        faiss_index.write(index, self.tmp_dir / FAISS_FILE)
        same_spec = self.base is not None and self.base.faiss.spec == spec
        nprobe = self._nprobe_arg or (self.base.faiss.nprobe if same_spec else faiss_index.default_nprobe(spec))
        depth = self._depth_arg or (self.base.faiss.depth if same_spec else faiss_index.default_depth(spec))
        candidates = self._candidates_arg or (self.base.faiss.candidates if self.base else "bounded")
        k_factor = self._k_factor_arg or (self.base.faiss.k_factor if same_spec
                                          else faiss_index.default_k_factor(spec, self.D))
        token_store = self._write_codes(store)
        np.save(self.tmp_dir / LOCATIONS_FILE, self.locations[: self.next_id])
        buddies = None
        if self.buddies is not None:
            np.save(self.tmp_dir / BUDDIES_FILE, self.buddies[: self.next_id])
            buddies = BuddyInfo(file=BUDDIES_FILE, grid=self.buddy_grid)
        self.table.commit()
        self.table.close()
        manifest = Manifest(
            version=self.version,
            parent_version=self.base.version if self.base else None,
            created_at=Manifest.now(),
            encoder=self.encoder,
            weights=self.weights,
            tokens_per_image=self.T,
            dim=self.D,
            faiss=FaissInfo(spec=spec, ntotal=int(index.ntotal), nprobe=nprobe, auto=auto, depth=depth,
                            candidates=candidates, k_factor=k_factor, codec=codec),
            num_images=num_images,
            next_id=self.next_id,
            segments=self.segments,
            images_root=self.images_root,
            token_store=token_store,
            buddies=buddies,
        )
        (self.tmp_dir / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
        if report is not None:
            report = {**report, "version": self.version}
            (self.tmp_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        for name in os.listdir(self.tmp_dir):
            fsync_file(self.tmp_dir / name)
        fsync_dir(self.tmp_dir)
        return manifest

    def _publish(self, current: bool = True) -> None:
        final = self.dir / VERSIONS_DIR / version_name(self.version)
        os.replace(self.tmp_dir, final)
        fsync_dir(self.dir / VERSIONS_DIR)
        if not current:
            return
        crash_point("writer.version-renamed")
        try:
            write_current(self.dir, version_name(self.version))
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)  # never published: CURRENT still names the old version
            raise

    def _collect_garbage(self) -> None:
        """Keep the live version (this transaction's once published, else its base) and its
        ``keep_versions - 1`` nearest ancestors (the parent chain); drop every other version directory (older
        ones, and leftovers of writers that died before publishing), temporary files, and the segments no kept
        version references."""
        versions_dir = self.dir / VERSIONS_DIR
        keep: dict[int, Manifest] = {}
        version: int | None = self.version if self._published else (self.base.version if self.base else None)
        while version is not None and len(keep) < self.keep_versions:
            try:
                manifest = read_manifest(versions_dir / version_name(version))
            except IndexFormatError:  # an ancestor already gone or damaged ends the chain
                break
            keep[version] = manifest
            version = manifest.parent_version
        for p in versions_dir.iterdir():
            is_version = p.name.startswith("v") and p.name[1:].isdigit()
            if p.name.startswith(TMP_PREFIX) or (is_version and int(p.name[1:]) not in keep):
                shutil.rmtree(p, ignore_errors=True)
        referenced = {seg.file for manifest in keep.values() for seg in manifest.segments}
        for p in (self.dir / SEGMENTS_DIR).iterdir():
            if p.name not in referenced:
                p.unlink(missing_ok=True)

    def _release(self) -> None:
        if self._lock_fd is not None:
            release_flock(self._lock_fd)
            self._lock_fd = None
