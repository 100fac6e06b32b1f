"""A snapshot: one published state of an index or a sharded collection, as one tar file.

What a published state is made of never changes once published (a version directory, the token segments its
manifest lists, the stored weights copy, uploaded files by content hash), and writers only add new files and
later remove old ones. So a snapshot is taken while writes go on, without their lock: the state is read (an
index's CURRENT; a collection's record, ``regis.sharding.layout.read_state``), each of its files is hard-linked
into a hidden folder of the index (``.tmp-snapshot-<uuid>``, on the same filesystem; a link is taken at once
and keeps the file whatever a writer's clean-up does next), and the tar is written from those links, then the
folder is removed. A file that a writer removed between reading the state and linking it (the state was
superseded twice meanwhile, and collected) makes the snapshot start over from the newer state (at most
``ATTEMPTS`` times). Where hard links are not possible (another filesystem, a filesystem without links) the
files are read in place, and the same check (every file of the state still there, the same size) is made
after writing.

Layout of the tar (a regis index or collection folder, as ``restore`` unpacks it)::

    CURRENT, versions/vNNNNNN/..., segments/seg-*.f16, weights/<sha256>.*     an index
    shards.json, shard-000/{CURRENT, versions/..., segments/..., weights/...}  a sharded collection
    collection.json                                 the collection's config, when it has one
    uploads/<ab>/<sha256>.<ext>                     uploaded images of the state (--with-uploads, a collection's
                                                    own uploads folder)
    regis-snapshot.json                             last: {"format", "kind", "version", "images", "created_at",
                                                    "source", "files": {name: {"bytes", "sha256"}}}

``restore`` (``regis.backups.restore``) checks every file against ``files`` while unpacking.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from regis.errors import ConfigError, IndexFormatError
from regis.faults import pause_point
from regis.indexes.layout import (
    CURRENT_FILE,
    SEGMENTS_DIR,
    TMP_PREFIX,
    VERSIONS_DIR,
    fsync_dir,
    read_current,
    version_number,
)

FORMAT = "regis-snapshot/1"
MANIFEST_NAME = "regis-snapshot.json"
CONFIG_FILE = "collection.json"  # regis.indexes.collections.CONFIG_FILE (not imported: no cycle)
UPLOADS_DIR = "uploads"
ATTEMPTS = 5
_CHUNK = 1 << 20


@dataclass
class SnapshotReport:
    """What a snapshot holds: ``kind`` ("index" or "sharded"), the collection ``version`` and ``images`` of the
    state, ``files`` and ``bytes`` in the tar, ``uploads`` files, ``attempts`` (states tried), ``seconds``."""

    path: str
    kind: str
    version: int
    images: int
    files: int
    bytes: int
    uploads: int
    attempts: int
    seconds: float

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


class _Superseded(Exception):
    """A file of the state was collected before it could be linked: start over from the newer state."""


def _state_files(index_dir: Path, name: str, prefix: str) -> tuple[list[tuple[Path, str]], int]:
    """(source path, name in the tar) of every file of version ``name`` of the index ``index_dir``, and its image
    count.

    Raises:
        _Superseded: the version (or its manifest) is gone.
    """
    from regis.indexes.manifest import read_manifest
    from regis.indexes.weights_copy import stored_weights

    vdir = index_dir / VERSIONS_DIR / name
    try:
        manifest = read_manifest(vdir)
        version_files = sorted(p for p in vdir.iterdir() if p.is_file())
    except (IndexFormatError, FileNotFoundError):
        raise _Superseded from None
    out = [(p, f"{prefix}{VERSIONS_DIR}/{name}/{p.name}") for p in version_files]
    out += [(index_dir / SEGMENTS_DIR / seg.file, f"{prefix}{SEGMENTS_DIR}/{seg.file}") for seg in manifest.segments]
    weights = stored_weights(index_dir, manifest.weights)
    if weights is not None:
        out.append((weights, f"{prefix}{weights.parent.name}/{weights.name}"))
    return out, manifest.num_images


def _upload_files(index_dir: Path, name: str, uploads_dir: Path) -> list[tuple[Path, str]]:
    """The stored files of the uploads that version ``name`` of ``index_dir`` lists (those still on disk)."""
    import sqlite3

    from regis.indexes.layout import TABLE_FILE
    from regis.indexes.uploads import UPLOADS_PREFIX, upload_file

    table = index_dir / VERSIONS_DIR / name / TABLE_FILE
    conn = sqlite3.connect(f"file:{table}?mode=ro&immutable=1", uri=True)
    try:
        paths = [r[0] for r in conn.execute("SELECT path FROM images WHERE path LIKE ?", (UPLOADS_PREFIX + "%",))]
    finally:
        conn.close()
    out = []
    for path in paths:
        try:
            stored = upload_file(uploads_dir, path)
        except ConfigError:
            continue
        if stored.is_file():
            out.append((stored, f"{UPLOADS_DIR}/{stored.parent.name}/{stored.name}"))
    return out


def read_published(path: Path) -> tuple[str, int, list[tuple[Path, str]], int, dict]:
    """The state published now in ``path``: (kind, version, files, images, extra tar members as bytes).

    Raises:
        IndexFormatError: no index or collection there, or no version yet.
        _Superseded: a version it names is gone already.
    """
    from regis.sharding.layout import SHARDS_FILE, is_sharded, read_layout, read_state

    if is_sharded(path):
        layout = read_layout(path)
        state = read_state(path, layout)
        if all(n is None for n in state.names):
            raise IndexFormatError(f"{path} holds no image yet: nothing to snapshot")
        files, images = [], 0
        for s, name in enumerate(state.names):
            if name is None:
                continue
            more, n = _state_files(state.shard_path(path, s), name, f"{state.dir_name(s)}/")
            files += more
            images += n
        record = {**layout, "format": "regis-sharded/2", "version": state.version, "shards": list(state.names)}
        record.pop("retired", None)  # folders of an older layout: not in the snapshot
        extra = {SHARDS_FILE: json.dumps(record, indent=2).encode()}
        extra.update({f"{state.dir_name(s)}/{CURRENT_FILE}": f"{n}\n".encode()
                      for s, n in enumerate(state.names) if n is not None})
        return "sharded", state.version, files, images, extra
    name = read_current(path) if path.is_dir() else None
    if name is None:
        raise IndexFormatError(f"{path} holds no index yet: nothing to snapshot")
    files, images = _state_files(path, name, "")
    return "index", version_number(name), files, images, {CURRENT_FILE: f"{name}\n".encode()}


def _versions_of(path: Path, kind: str) -> list[tuple[Path, str]]:
    """(index dir, version name) of every index of the published state (one, or one per shard)."""
    from regis.sharding.layout import read_state

    if kind == "sharded":
        state = read_state(path)
        return [(state.shard_path(path, s), n) for s, n in enumerate(state.names) if n is not None]
    return [(path, read_current(path))]


def _link_all(files: list[tuple[Path, str]], into: Path) -> bool:
    """Hard-link every file into ``into`` under its tar name; False when links are not possible here.

    Raises:
        _Superseded: a file is gone.
    """
    for src, arc in files:
        dest = into / arc
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except FileNotFoundError:
            raise _Superseded from None
        except OSError:  # EXDEV, EPERM, ...: no hard links on this filesystem
            return False
    return True


class _Hashing:
    """A binary file read through, hashing what is read (SHA-256)."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data


def _add_file(tar: tarfile.TarFile, path: Path, arc: str, entries: dict) -> int:
    info = tar.gettarinfo(str(path), arcname=arc)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(path, "rb") as f:
        reader = _Hashing(f)
        tar.addfile(info, reader)
    entries[arc] = {"bytes": info.size, "sha256": reader.sha.hexdigest()}
    return info.size


def _add_bytes(tar: tarfile.TarFile, arc: str, data: bytes, entries: dict | None) -> int:
    import io

    info = tarfile.TarInfo(arc)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))
    if entries is not None:
        entries[arc] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return len(data)


def snapshot(path: Path | str, out: Path | str, uploads_dir: Path | str | None = None) -> SnapshotReport:
    """Write the state published now in the index or sharded collection ``path`` to the tar file ``out``.

    Args:
        path: the index or collection folder (a named collection's folder: its ``collection.json`` goes along).
        out: the tar file to write (``.tar``; ``.tar.gz`` / ``.tgz``: gzip-compressed); written under a
            temporary name and renamed when complete.
        uploads_dir: the uploads folder whose files the state's uploaded images are (e.g. a named collection's
            ``uploads/``); None: the uploaded files are not included (searches need only the index).

    Returns:
        What the snapshot holds.

    Raises:
        IndexFormatError: no index or collection in ``path``, or nothing published yet.
        ConfigError: ``out`` is inside ``path``, or its folder does not exist.
        RuntimeError: the state was superseded and collected ``ATTEMPTS`` times in a row (writes far faster
            than linking a few files: not expected).
    """
    path, out = Path(path).resolve(), Path(out).resolve()
    if out.is_relative_to(path):
        raise ConfigError(f"the snapshot file {out} must not be inside the index {path}")
    if not out.parent.is_dir():
        raise ConfigError(f"folder {out.parent} does not exist")
    t0 = time.perf_counter()
    for attempt in range(1, ATTEMPTS + 1):
        staging = path / f"{TMP_PREFIX}snapshot-{uuid.uuid4().hex}"
        try:
            kind, version, files, images, extra = read_published(path)
            pause_point("snapshot.state-read")
            if uploads_dir is not None:
                for index_dir, name in _versions_of(path, kind):
                    files += _upload_files(index_dir, name, Path(uploads_dir))
            staging.mkdir()
            linked = _link_all(files, staging)
            sources = [(staging / arc if linked else src, arc) for src, arc in files]
            report = _write_tar(path, out, kind, version, images, sources, extra)
            if not linked and any(not src.is_file() for src, _ in files):
                raise _Superseded  # read in place: a file went away while being read
        except _Superseded:
            continue
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        uploads = sum(1 for _, arc in files if arc.startswith(f"{UPLOADS_DIR}/"))
        return SnapshotReport(str(out), kind, version, images, report[0], report[1], uploads, attempt,
                              round(time.perf_counter() - t0, 3))
    raise RuntimeError(f"{path} changed faster than a snapshot could be linked ({ATTEMPTS} attempts)")


def _write_tar(path: Path, out: Path, kind: str, version: int, images: int, sources: list[tuple[Path, str]],
               extra: dict[str, bytes]) -> tuple[int, int]:
    """Write the tar (temporary name, fsync, rename); (members, bytes)."""
    mode = "w:gz" if out.name.endswith((".tar.gz", ".tgz")) else "w"
    tmp = out.with_name(f"{TMP_PREFIX}{out.name}-{uuid.uuid4().hex[:8]}")
    entries: dict[str, dict] = {}
    total = 0
    try:
        with open(tmp, "wb") as raw, tarfile.open(fileobj=raw, mode=mode, format=tarfile.PAX_FORMAT) as tar:
            for arc, data in extra.items():
                total += _add_bytes(tar, arc, data, entries)
            config = path / CONFIG_FILE
            if config.is_file():
                total += _add_file(tar, config, CONFIG_FILE, entries)
            for src, arc in sources:
                total += _add_file(tar, src, arc, entries)
            manifest = {"format": FORMAT, "kind": kind, "version": version, "images": images,
                        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "source": str(path), "files": entries}
            _add_bytes(tar, MANIFEST_NAME, json.dumps(manifest, indent=1).encode(), None)
            tar.close()
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(entries) + 1, total
