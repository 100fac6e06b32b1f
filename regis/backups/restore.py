"""A new index or sharded collection from a snapshot file (``regis.backups.snapshot``).

The tar is unpacked into a hidden folder beside the target (``.tmp-restore-<uuid>``), every member checked
against the snapshot's list (name, size, SHA-256; members outside it, links, devices, absolute paths or ``..``
are refused), the result opened as an index (every shard, for a collection), and only then renamed to the
target: a restore that fails leaves nothing behind, and never touches an existing folder. The restored state is
the snapshot's exactly (same versions, ids, tokens, FAISS indexes, tables), so it answers every search as the
source did; its writers go on from there. The manifests keep the source's images root: point
``REGIS_IMAGES_ROOT`` (or ``--images-root``) at the images on the new machine to serve their files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from regis.backups.snapshot import FORMAT, MANIFEST_NAME, UPLOADS_DIR
from regis.errors import ConfigError, IndexFormatError
from regis.indexes.layout import TMP_PREFIX, fsync_dir

_CHUNK = 1 << 20


@dataclass
class RestoreReport:
    """What was restored: ``path``, ``kind`` ("index" or "sharded"), the ``version`` and ``images`` of the state,
    ``files`` unpacked, ``uploads`` (files placed in ``uploads_dir``)."""

    path: str
    kind: str
    version: int
    images: int
    files: int
    uploads: int

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def read_snapshot_manifest(snapshot_file: Path | str) -> dict:
    """The snapshot's own manifest (``regis-snapshot.json``: format, kind, version, images, files).

    Raises:
        IndexFormatError: not a regis snapshot, or an unreadable one.
    """
    try:
        with tarfile.open(snapshot_file, mode="r:*") as tar:
            member = tar.getmember(MANIFEST_NAME)
            manifest = json.loads(tar.extractfile(member).read())
    except (OSError, KeyError, tarfile.TarError, ValueError, AttributeError) as exc:
        raise IndexFormatError(f"{snapshot_file} is not a readable regis snapshot ({type(exc).__name__})") from None
    if manifest.get("format") != FORMAT or manifest.get("kind") not in ("index", "sharded"):
        raise IndexFormatError(f"{snapshot_file} is not a {FORMAT} snapshot")
    return manifest


def _safe_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise IndexFormatError(f"snapshot member {name[:200]!r} has an unsafe path")
    return p


def _unpack(snapshot_file: Path, into: Path, files: dict) -> int:
    """Unpack every listed member into ``into``, checking sizes and SHA-256; the number unpacked.

    Raises:
        IndexFormatError: a member not listed, not a regular file, of another size or hash, or one missing.
    """
    seen = set()
    with tarfile.open(snapshot_file, mode="r:*") as tar:
        for member in tar:
            if member.name == MANIFEST_NAME:
                continue
            rel = _safe_name(member.name)
            want = files.get(member.name)
            if want is None or not member.isfile():
                raise IndexFormatError(f"snapshot member {member.name[:200]!r} is not one of its files")
            dest = into.joinpath(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            sha, size = hashlib.sha256(), 0
            with tar.extractfile(member) as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            if size != want["bytes"] or sha.hexdigest() != want["sha256"]:
                raise IndexFormatError(f"snapshot member {member.name[:200]!r} is damaged (size or SHA-256 differ)")
            seen.add(member.name)
    missing = sorted(set(files) - seen)
    if missing:
        raise IndexFormatError(f"the snapshot lacks {len(missing)} of its files, e.g. {missing[0][:200]!r}")
    return len(seen)


def _check_opens(path: Path, kind: str) -> None:
    """Open the restored state as a reader would (every shard of a collection).

    Raises:
        IndexFormatError: it does not open.
    """
    if kind == "sharded":
        from regis.sharding.search import ShardedSearcher

        ShardedSearcher(path).close()
    else:
        from regis.indexes.snapshot import IndexSnapshot

        IndexSnapshot.open(path).close()


def restore(snapshot_file: Path | str, target: Path | str, uploads_dir: Path | str | None = None) -> RestoreReport:
    """Restore a snapshot into the new folder ``target``.

    Args:
        snapshot_file: the tar written by ``regis.backups.snapshot.snapshot``.
        target: the index or collection folder to create (must not exist).
        uploads_dir: where the snapshot's uploaded files go (None: ``target/uploads``, a named collection's
            uploads folder).

    Returns:
        What was restored.

    Raises:
        ConfigError: ``target`` exists.
        IndexFormatError: not a regis snapshot, a damaged or incomplete one, or one that does not open.
    """
    snapshot_file, target = Path(snapshot_file), Path(target).resolve()
    if target.exists():
        raise ConfigError(f"{target} exists already: restore into a new name")
    manifest = read_snapshot_manifest(snapshot_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f"{TMP_PREFIX}restore-{target.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        count = _unpack(snapshot_file, staging, manifest["files"])
        uploads = staging / UPLOADS_DIR
        placed = sum(1 for p in uploads.rglob("*") if p.is_file()) if uploads.is_dir() else 0
        if placed and uploads_dir is not None and Path(uploads_dir).resolve() != target / UPLOADS_DIR:
            for p in sorted(uploads.rglob("*")):
                if p.is_file():
                    dest = Path(uploads_dir) / p.relative_to(uploads)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if not dest.exists():
                        shutil.copy2(p, dest)
            shutil.rmtree(uploads)
        _check_opens(staging, manifest["kind"])
        staging.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return RestoreReport(str(target), manifest["kind"], int(manifest["version"]), int(manifest["images"]), count,
                         placed)
