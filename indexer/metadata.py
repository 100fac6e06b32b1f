"""User metadata at build time: a CSV or JSONL file of rows keyed by image path, and per-image sidecar files
(``photo.jpg.json``); the file facts (folder, name, extension, EXIF date and camera) are added by the build."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from regis.errors import ConfigError
from regis.images.exif import FACTS_KEY  # the build's file facts live under this key; user metadata may not set it
from regis.indexes import json_values

SIDECAR_SUFFIX = ".json"
MAX_METADATA_BYTES = json_values.MAX_METADATA_BYTES


def _number(text: str):
    """A CSV cell as a number when it is one regis stores (a 64-bit integer, a finite float), else the text: a
    20-digit barcode or "NaN" stays a string."""
    try:
        value = int(text)
    except ValueError:
        pass
    else:
        return value if json_values.INT64_MIN <= value <= json_values.INT64_MAX else text
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def load_metadata_file(path: Path | str) -> dict[str, dict]:
    """Rows of a ``.csv`` (header with a ``path`` column; numbers parsed, empty cells left out) or ``.jsonl`` /
    ``.ndjson`` file (one object per line with a ``path`` key), keyed by path relative to the folder built.

    Raises:
        ConfigError: unreadable file, unknown extension, a row without ``path``, a value regis does not store
            (``regis.indexes.json_values``: NaN, a lone surrogate, 33 levels deep...); the message names the file
            and line (and the value's path).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read metadata file {path}: {type(exc).__name__}") from None
    rows: list[dict] = []
    if suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "path" not in reader.fieldnames:
            raise ConfigError(f"{path}: a metadata CSV needs a header with a 'path' column")
        rows = [{k: _number(v) for k, v in row.items() if k and v not in (None, "")} for row in reader]
    elif suffix in (".jsonl", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json_values.loads(line, "metadata", max_bytes=MAX_METADATA_BYTES)
            except json_values.InvalidValueError as exc:
                raise ConfigError(f"{path}:{n}: {exc}") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{n}: each line must be a JSON object")
            rows.append(row)
    else:
        raise ConfigError(f"{path}: metadata files are .csv or .jsonl")
    out: dict[str, dict] = {}
    for n, row in enumerate(rows, 1):
        key = row.pop("path", None)
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{path}: row {n} has no 'path'")
        row.pop(FACTS_KEY, None)
        try:
            json_values.check_value(row, "metadata", max_bytes=MAX_METADATA_BYTES)
        except json_values.InvalidValueError as exc:
            raise ConfigError(f"{path}: row {n}: {exc}") from None
        out[Path(key).as_posix().lstrip("./") if key.startswith("./") else Path(key).as_posix()] = row
    return out


def read_sidecar(image: Path) -> dict | None:
    """The JSON object in ``image`` + ".json" (e.g. ``photo.jpg.json``), None if there is none.

    Raises:
        ConfigError: a sidecar that is not a JSON object, is larger than 64 KiB or holds a value regis does not
            store (``regis.indexes.json_values``); the message names it.
    """
    sidecar = image.with_name(image.name + SIDECAR_SUFFIX)
    try:
        if sidecar.stat().st_size > MAX_METADATA_BYTES:
            raise ConfigError(f"{sidecar}: metadata sidecar larger than {MAX_METADATA_BYTES} bytes")
        value = json_values.loads(sidecar.read_bytes(), "metadata", max_bytes=MAX_METADATA_BYTES)
    except FileNotFoundError:
        return None
    except json_values.InvalidValueError as exc:
        raise ConfigError(f"{sidecar}: {exc}") from None
    except OSError:
        raise ConfigError(f"{sidecar}: not a readable JSON metadata sidecar") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{sidecar}: a metadata sidecar must hold a JSON object")
    value.pop(FACTS_KEY, None)
    return value


def merge_patch(stored: dict, patch: dict) -> dict:
    """JSON merge patch (RFC 7396, top level): keys of ``patch`` replace those of ``stored``, a null removes one;
    the file facts (``file``) cannot be changed."""
    out = dict(stored)
    for key, value in patch.items():
        if key == FACTS_KEY:
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def update_metadata(index_dir: Path | str, image_id: int, patch: dict, replace: bool = False,
                    lock_timeout_s: float = 0.0, job_id: str | None = None) -> dict:
    """Change one image's user metadata as one new index version (tokens untouched). Needs no encoder.

    Args:
        index_dir: the index directory.
        image_id: the image.
        patch: a JSON merge patch (``merge_patch``), or with ``replace`` the new user metadata.
        replace: replace the user metadata instead of patching it (file facts kept either way).
        job_id: the queued job this runs for, recorded with the new version with this call's result
            (``indexer.job_record``).

    Returns:
        {"version": the new version (None: nothing changed or no such image), "id", "found", "metadata"}.

    Raises:
        IndexFormatError: there is no index.
        IndexLockedError: another writer holds the index past ``lock_timeout_s``.
        ConfigError: ``patch``, or the metadata it makes, is not a value regis stores (``json_values``: NaN, a
            lone surrogate, over 32 levels or 64 KiB...); nothing is written.
    """
    from indexer.job_record import job_record
    from indexer.writers import open_live_writer
    from regis.indexes.table import ImageRecord

    with open_live_writer(index_dir, lock_timeout_s) as w:
        rec = w.table.get(image_id) if w.is_live(image_id) else None
        if rec is None:
            w.abort()
            return {"version": None, "id": image_id, "found": False, "metadata": None}
        facts = rec.metadata.get(FACTS_KEY)
        base = {} if replace else {k: v for k, v in rec.metadata.items() if k != FACTS_KEY}
        meta = merge_patch(base, json_values.check_value(patch, "metadata", max_bytes=MAX_METADATA_BYTES))
        json_values.check_value(meta, "metadata", max_bytes=MAX_METADATA_BYTES)
        if facts is not None:
            meta[FACTS_KEY] = facts
        if meta != rec.metadata:
            w.update_records([ImageRecord(rec.id, rec.path, rec.sha256, rec.width, rec.height, rec.bytes,
                                          rec.mtime, meta)])
        result = {"id": image_id, "found": True, "metadata": meta}
        committed = w.commit({"result": result, **job_record(job_id, index_dir)} if job_id else None)
    return {"version": committed.version if committed else None, **result}
