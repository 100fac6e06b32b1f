"""Checks shared by the dataset loaders: expected counts and files present, with messages naming what is off."""

from __future__ import annotations

from pathlib import Path

from training.data.images import ImageFiles
from training.errors import DatasetError

SKIP_HINT = "pass --skip-count-check to use a partial or modified copy on purpose"


def check_count(dataset: str, what: str, found: int, expected: int | None, where: Path) -> None:
    """Raise ``DatasetError`` unless ``found == expected`` (``expected`` None: no check).

    Args:
        dataset: e.g. "CUB-200-2011".
        what: e.g. "train images (classes 0-99)".
        found, expected: the counts.
        where: the file or folder the count came from (named in the message).
    """
    if expected is not None and found != expected:
        raise DatasetError(
            f"{dataset} at {where}: found {found:,} {what}, expected {expected:,}; "
            f"the copy is incomplete or not the standard release ({SKIP_HINT})"
        )


def check_files_exist(dataset: str, images: ImageFiles, where: Path) -> None:
    """Raise ``DatasetError`` naming the first missing files when any image of ``images`` is not on disk."""
    missing = images.missing_files()
    if missing:
        shown = ", ".join(str(p) for p in missing[:3])
        raise DatasetError(
            f"{dataset} at {where}: {len(missing):,} of {len(images):,} image files listed in the annotations "
            f"are missing (e.g. {shown})"
        )


def find_root(root: Path, marker: str, subdirs: tuple[str, ...]) -> Path | None:
    """``root`` or the first of ``root / subdir`` that holds ``marker`` (a file name), else None."""
    for cand in (root, *(root / s for s in subdirs)):
        if (cand / marker).is_file():
            return cand
    return None


def read_table(path: Path, columns: int, skip: int = 0) -> list[list[str]]:
    """Whitespace-separated rows of a text annotation file.

    Args:
        path: the file.
        columns: how many fields each row must have.
        skip: header lines to skip.

    Raises:
        DatasetError: the file is missing or a row has the wrong number of fields (names the line).
    """
    if not path.is_file():
        raise DatasetError(f"annotation file {path} does not exist")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno <= skip or not line.strip():
                continue
            fields = line.split()
            if len(fields) != columns:
                raise DatasetError(
                    f"{path} line {lineno}: expected {columns} fields, got {len(fields)}: {line.strip()!r}"
                )
            rows.append(fields)
    return rows


def parse_int(value: str, path: Path, what: str) -> int:
    """``int(value)`` or a ``DatasetError`` naming the file and field."""
    try:
        return int(value)
    except ValueError as exc:
        raise DatasetError(f"{path}: {what} {value!r} is not an integer") from exc
