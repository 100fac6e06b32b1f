"""Walking an image folder and comparing it with what the index holds."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from regis.images.decode import SUPPORTED_EXTENSIONS
from regis.indexes.table import ImageRecord


@dataclass(frozen=True)
class FileEntry:
    """An image file found by the scan.

    Attributes:
        path: path relative to the scanned root, POSIX separators (the image table's key).
        abspath: absolute path.
        bytes: file size in bytes.
        mtime: modification time, seconds since the epoch.
    """

    path: str
    abspath: Path
    bytes: int
    mtime: float


def scan_folder(root: Path, exclude: tuple[Path, ...] = (), confine_to: Path | None = None) -> list[FileEntry]:
    """Every supported image file below ``root``, sorted by relative path.

    Hidden files and folders (names starting with ".") are skipped, symlinked folders are not followed,
    symlinked files are kept only when their target lies inside ``confine_to`` (default ``root``: a link must
    not let a scan read files outside the folder it may read), and folders in ``exclude`` (e.g. an index
    directory inside the image folder) are pruned.
    Extensions: jpg, jpeg, png, webp, bmp, tif, tiff, gif (case-insensitive).
    """
    root = Path(root).resolve()
    confine = Path(confine_to).resolve() if confine_to is not None else root
    excluded = {Path(p).resolve() for p in exclude}
    out: list[FileEntry] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and (here / d).resolve() not in excluded)
        for name in filenames:
            if name.startswith(".") or Path(name).suffix.lower() not in SUPPORTED_EXTENSIONS:
                continue
            abspath = here / name
            try:
                st = abspath.stat()
            except OSError:  # vanished or a dangling link: not an image we can index
                continue
            if not abspath.is_file():
                continue
            if abspath.is_symlink() and not _inside(abspath, confine):
                continue  # a symlinked file leading out of the scanned folder: never read it
            out.append(FileEntry(abspath.relative_to(root).as_posix(), abspath, st.st_size, st.st_mtime))
    out.sort(key=lambda e: e.path)
    return out


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve(strict=True).is_relative_to(root)
    except (OSError, RuntimeError):  # dangling, a loop, or unreadable
        return False


def file_sha256(path: Path, block: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class ChangePlan:
    """What an incremental build must do.

    Attributes:
        new: files not in the index.
        modified: files whose size or mtime differ from the index (content may still be the same).
        unchanged: files with the same size and mtime.
        deleted: indexed images whose file is gone.
    """

    new: list[FileEntry] = field(default_factory=list)
    modified: list[tuple[FileEntry, ImageRecord]] = field(default_factory=list)
    unchanged: list[FileEntry] = field(default_factory=list)
    deleted: list[ImageRecord] = field(default_factory=list)


def plan_changes(entries: list[FileEntry], existing: dict[str, ImageRecord]) -> ChangePlan:
    """Compare a scan with the image table (keyed by relative path)."""
    plan = ChangePlan()
    seen = set()
    for entry in entries:
        seen.add(entry.path)
        rec = existing.get(entry.path)
        if rec is None:
            plan.new.append(entry)
        elif rec.bytes == entry.bytes and abs(rec.mtime - entry.mtime) < 1e-6:
            plan.unchanged.append(entry)
        else:
            plan.modified.append((entry, rec))
    plan.deleted = [rec for path, rec in existing.items() if path not in seen]
    return plan
