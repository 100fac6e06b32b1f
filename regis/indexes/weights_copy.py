"""Fine-tuned weights kept with the index, by content hash.

An index built from weights in a file (a ``regis train`` run, a ``.safetensors``) records where they were,
``file:/abs/path``: moving or deleting that run directory used to break every index built from it. The
writer now copies the file into the index the first time it commits with those weights::

    INDEX_DIR/weights/<sha256>.safetensors     (or .pt/.pth/.bin: the file's own format, byte for byte)

named by the SHA-256 of the state dict (``Manifest.weights.sha256``, ``regis.models.weights.state_dict_sha256``),
so the same weights are stored once, and opening the index uses this copy first (checksum still checked).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from regis.indexes.layout import TMP_PREFIX, fsync_dir
from regis.models.config import WeightsInfo
from regis.models.weights import ENCODER_WEIGHTS_FILE

WEIGHTS_DIR = "weights"
log = logging.getLogger("regis.indexes")


def source_file(weights: WeightsInfo) -> Path | None:
    """The file a ``file:`` weights source names (a run directory's ``encoder.safetensors``), else None."""
    kind, _, rest = weights.source.partition(":")
    if kind != "file" or not rest:
        return None
    path = Path(rest)
    return path / ENCODER_WEIGHTS_FILE if path.is_dir() else path


def stored_weights(index_dir: Path | str, weights: WeightsInfo) -> Path | None:
    """The index's own copy of ``weights`` (``weights/<sha256>.*``), or None."""
    folder = Path(index_dir) / WEIGHTS_DIR
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob(f"{weights.sha256}.*")):
        if path.is_file() and not path.name.startswith(TMP_PREFIX):
            return path
    return None


def store_weights(index_dir: Path | str, weights: WeightsInfo) -> Path | None:
    """Copy a ``file:`` weights source into the index (atomically: temporary name, fsync, rename), unless a copy
    with this checksum is already there. Returns the stored copy, or None for weights that are not a file
    (hub, package, random) or whose file is no longer readable (the index then keeps recording the path)."""
    have = stored_weights(index_dir, weights)
    if have is not None:
        return have
    source = source_file(weights)
    if source is None:
        return None
    folder = Path(index_dir) / WEIGHTS_DIR
    folder.mkdir(exist_ok=True)
    final = folder / f"{weights.sha256}{source.suffix or '.bin'}"
    tmp = folder / f"{TMP_PREFIX}{final.name}.{os.getpid()}"
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.warning("could not keep a copy of the weights %s in the index: %s", source, exc)
        return None
    fsync_dir(folder)
    return final
