"""Which folders an indexing job may read: only existing, visible folders inside the configured images root.

A client names a folder relative to the root (or absolute, inside it). Refused: ``..`` anywhere, absolute
paths outside the root, symlinks that lead outside it, hidden folders (a scan skips them, and ``.uploads``
belongs to the service), and anything that is not an existing directory.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from regis.errors import ConfigError

NAME_MAX = 255  # bytes in one file or folder name (Linux, macOS, Windows)


class FolderError(ConfigError):
    """A folder a job may not index.

    Attributes:
        reason: ``forbidden`` (outside the root), ``not_found`` or ``invalid`` (hidden, not a directory, ...).
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def resolve_folder(images_root: Path | str, folder: str) -> tuple[Path, str]:
    """Check ``folder`` against ``images_root``.

    Args:
        images_root: the allowed root.
        folder: relative to the root ("" or "." = the root), or absolute inside it.

    Returns:
        (the folder's resolved absolute path, its path relative to the resolved root in POSIX form, "" for
        the root itself).

    Raises:
        FolderError: the folder is not allowed or does not exist (``reason`` says which).
    """
    if not isinstance(folder, str) or "\x00" in folder or len(folder) > 4096:
        raise FolderError("invalid", "folder must be a path string")
    root = Path(images_root).resolve()
    raw = PurePosixPath(folder.strip() or ".")
    if ".." in raw.parts:
        raise FolderError("forbidden", "folder may not contain '..'")
    candidate = Path(raw) if raw.is_absolute() else root / raw
    if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in raw.parts):
        # no folder can have such a name (ENAMETOOLONG from the file system otherwise)
        raise FolderError("not_found", f"folder {folder[:64]!r}... does not exist under the images root "
                                       f"(a name in it is longer than {NAME_MAX} bytes)")
    try:
        resolved = candidate.resolve()  # follows every symbolic link on the way
        if not resolved.is_relative_to(root):
            raise FolderError("forbidden", "folder is outside the allowed images root")
        rel = resolved.relative_to(root).as_posix() if resolved != root else ""
        if any(part.startswith(".") for part in PurePosixPath(rel).parts):
            raise FolderError("invalid", "hidden folders (names starting with '.') cannot be indexed")
        exists, is_dir = resolved.exists(), resolved.is_dir()
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES...: a folder a job could not read anyway
        raise FolderError("not_found", f"folder {folder[:64]!r} cannot be opened under the images root "
                                       f"({exc.strerror or type(exc).__name__})") from None
    if not exists:
        raise FolderError("not_found", f"folder {rel or '.'!r} does not exist under the images root")
    if not is_dir:
        raise FolderError("invalid", f"{rel!r} is not a folder")
    return resolved, rel
