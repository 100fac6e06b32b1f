"""The staging area of a folder build: embeddings of finished batches, kept on disk until the build commits, so
that a build stopped by Ctrl-C, a signal or a crash is picked up by the next run of the same build instead of
re-embedding every image.

    INDEX_DIR/resume/
      encoder.json            the encoder config and weights checksum the staged tokens come from
      batch-<uuid>.npz        one per embedded batch: each image's path, size and mtime at scan time, what
                              decoding found (sha256, width, height, bytes, EXIF facts), tokens (n, T, D) float16
                              (what the index stores), buddies (n, R + 1) int16 and the patch grid

Each batch file is written under a temporary name, flushed and renamed (``regis.indexes.layout``), so a batch is
staged whole or not at all; temporary leftovers are ignored and removed. A staged image is reused only when its
path, size and mtime are those of the new scan and the encoder is the same; the area is removed once the build's
version is committed. It lives beside the index's versions and never touches them: whatever happens to it, the
live version stays as it was.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regis.faults import crash_point
from regis.indexes.layout import TMP_PREFIX, fsync_dir, write_json_atomic

RESUME_DIR = "resume"
ENCODER_FILE = "encoder.json"
log = logging.getLogger("regis.indexer")


@dataclass
class StagedImage:
    """One staged image: the decoded item's facts (``indexer.dataset.ImageFileDataset``) and its tokens.

    Attributes:
        item: {"sha256", "width", "height", "bytes", "exif"} as decoding found them.
        tokens: (T, D) float16.
        buddies: (R + 1,) int16 buddy patches.
        grid: the (h, w) patch grid of ``buddies``.
    """

    item: dict
    tokens: np.ndarray
    buddies: np.ndarray
    grid: tuple[int, int]


class BuildStaging:
    """The staging area of the builds of one index (``INDEX_DIR/resume``); used under the index's write lock.

    Args:
        index_dir: the index directory.
        encoder_key: {"config": ..., "weights_sha256": ...} of the build's encoder: staged batches of another
            encoder are discarded.
    """

    def __init__(self, index_dir: Path | str, encoder_key: dict):
        self.dir = Path(index_dir) / RESUME_DIR
        self.encoder_key = encoder_key

    def load(self, scan: dict[str, tuple[int, float]]) -> dict[str, StagedImage]:
        """The staged images still valid for this scan.

        Args:
            scan: table path -> (bytes, mtime) of the files this build embeds.

        Returns:
            path -> ``StagedImage`` for staged images whose path, size and mtime match ``scan``. A staging area
            of another encoder is removed; an unreadable batch file is skipped (its images are embedded again).
        """
        if not self.dir.is_dir():
            return {}
        try:
            key = json.loads((self.dir / ENCODER_FILE).read_text())
        except (OSError, ValueError):
            key = None
        if key != self.encoder_key:
            log.info("discarding the staged embeddings of another encoder in %s", self.dir)
            self.remove()
            return {}
        out: dict[str, StagedImage] = {}
        for path in sorted(self.dir.glob("batch-*.npz")):
            try:
                out.update(self._read(path, scan))
            except Exception as exc:  # a damaged file costs its images' embedding, not the build
                log.warning("ignoring staged batch %s (%s)", path.name, type(exc).__name__)
        return out

    @staticmethod
    def _read(path: Path, scan: dict[str, tuple[int, float]]) -> dict[str, StagedImage]:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            tokens, buddies, grid = z["tokens"], z["buddies"], tuple(int(g) for g in z["grid"])
        out = {}
        for i, m in enumerate(meta):
            if scan.get(m["path"]) == (m["size"], m["mtime"]):
                out[m["path"]] = StagedImage(m["item"], tokens[i], buddies[i], grid)
        return out

    def save(self, entries: list, items: list[dict], tokens: np.ndarray, buddies: np.ndarray,
             grid: tuple[int, int]) -> None:
        """Stage one embedded batch (atomically: whole or not at all).

        Args:
            entries: the batch's scanned files (``indexer.scan.FileEntry``: path, bytes, mtime).
            items: their decoded items ({"sha256", "width", "height", "bytes", "exif"}).
            tokens: (n, T, D) float; buddies: (n, R + 1) int; grid: the buddies' (h, w) patch grid.
        """
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True)
            fsync_dir(self.dir.parent)
        if not (self.dir / ENCODER_FILE).is_file():
            write_json_atomic(self.dir / ENCODER_FILE, self.encoder_key)
        meta = [{"path": e.path, "size": e.bytes, "mtime": e.mtime,
                 "item": {k: it[k] for k in ("sha256", "width", "height", "bytes", "exif")}}
                for e, it in zip(entries, items, strict=True)]
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                 tokens=np.asarray(tokens, dtype=np.float16), buddies=np.asarray(buddies, dtype=np.int16),
                 grid=np.asarray(grid, dtype=np.int64))
        target = self.dir / f"batch-{uuid.uuid4().hex}.npz"
        tmp = target.with_name(f"{TMP_PREFIX}{target.name}")
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        crash_point("build.staging-unnamed")  # the batch's file written under its temporary name, not renamed
        os.replace(tmp, target)
        fsync_dir(self.dir)
        crash_point("build.batch-staged")  # this batch staged, the build not committed

    def clean_temporary(self) -> None:
        """Remove temporary files of batches that were never renamed into place."""
        if self.dir.is_dir():
            for p in self.dir.glob(f"{TMP_PREFIX}*"):
                p.unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the staging area (after the build's version is committed)."""
        shutil.rmtree(self.dir, ignore_errors=True)
