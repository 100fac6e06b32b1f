"""The pair table of a duplicates run, and where it is kept: with the index version it was computed on.

    INDEX_DIR/duplicates/
      config.json               the index's thresholds (``regis.duplicates.config``)
      pairs-v000007.npz         the pair table computed on index version 7, and which images it searched
      .lock                     flock'ed by the one run updating the pairs

Each pairs file holds every candidate pair's raw evidence (token scores both ways, exact-copy check,
verification), not its relation, so thresholds can change without recomputing. A run on version 9 starts from
the newest file of an earlier version made with the same candidate settings and searches only the images added or
changed since (``regis.duplicates.finder``). Files are written under a temporary name and renamed; the two newest
are kept.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from regis.duplicates.config import DUPLICATES_DIR
from regis.indexes.layout import version_name, write_bytes_atomic
from regis.indexes.locks import acquire_flock, release_flock

PAIRS_PREFIX = "pairs-"
KEEP_FILES = 2
LOCK_FILE = ".lock"


@dataclass
class PairTable:
    """Candidate pairs (a < b) and their evidence; every array has one row per pair.

    Attributes:
        a, b: int64 image ids.
        s_ab, s_ba: float32 MaxSim per token, S(a, b) / T and S(b, a) / T.
        exact: bool, the same bytes or the same pixels.
        matches: int32 local-feature matches that passed the ratio test (0: not verified).
        inliers: int32 homography inliers (0: not verified, or no homography).
        cover_a, cover_b: float32 fraction of a's frame inside b, of b's frame covered by a (0 when unverified).
        quad_ab, quad_ba: (p, 4, 2) float32 each frame's corners in the other's frame, normalised to [0, 1].
        residual: float32 median inlier reprojection error / longer side.
        files: bool, both images' files could be read (verification was possible).
        located: bool, the template search ran on the pair (``regis.duplicates.template``; pairs stored before it
            existed read as False, and a later run searches the ones its config selects).
        ncc_ab, ncc_ba: float32 best normalised cross correlation of a found inside b, of b inside a (0: not run).
        box: (p, 4) float32 the better direction's window (x0, y0, x1, y1) in its container, normalised.
        pre: int32 the cheap first match's count (``geometry.prefilter``; -1: not run, the pair was matched in
            full directly).
        refine_from: float32 the bar of the pair's template search (``template.locate(refine_from=)``): a
            direction whose half-size peak was below it reports that peak, not a full-size one (-inf: every
            direction at full size, as in files written before the bar existed).
        by_group: int8, the pair links a crop found with confidence to an image that contains it through the
            duplicate groups (``finder.group_candidates``): verified, searched and decided whatever its token scores
            (the candidate floor and the verification and template gates do not apply). 0: no; 1: a candidate of
            the self-join; 2: added by the group stage (not a candidate of the join); 0 in files written before.
        shots: bool, both images carry an EXIF exposure time (``regis.images.exif``: ``captured_at``) and they
            differ: two shots, never edited copies of one photo (set by ``finder.mark_shots`` from the image
            records on every run; False in files written before it existed).
    """

    a: np.ndarray
    b: np.ndarray
    s_ab: np.ndarray
    s_ba: np.ndarray
    exact: np.ndarray
    matches: np.ndarray
    inliers: np.ndarray
    cover_a: np.ndarray
    cover_b: np.ndarray
    quad_ab: np.ndarray
    quad_ba: np.ndarray
    residual: np.ndarray
    files: np.ndarray
    located: np.ndarray
    ncc_ab: np.ndarray
    ncc_ba: np.ndarray
    box: np.ndarray
    pre: np.ndarray
    refine_from: np.ndarray
    by_group: np.ndarray
    shots: np.ndarray

    @classmethod
    def empty(cls, p: int = 0) -> PairTable:
        """A table of ``p`` pairs, all fields zero."""
        return cls(np.zeros(p, np.int64), np.zeros(p, np.int64), np.zeros(p, np.float32), np.zeros(p, np.float32),
                   np.zeros(p, bool), np.zeros(p, np.int32), np.zeros(p, np.int32), np.zeros(p, np.float32),
                   np.zeros(p, np.float32), np.zeros((p, 4, 2), np.float32), np.zeros((p, 4, 2), np.float32),
                   np.zeros(p, np.float32), np.zeros(p, bool), np.zeros(p, bool), np.zeros(p, np.float32),
                   np.zeros(p, np.float32), np.zeros((p, 4), np.float32), np.full(p, -1, np.int32),
                   np.full(p, -np.inf, np.float32), np.zeros(p, np.int8), np.zeros(p, bool))

    def __len__(self) -> int:
        return len(self.a)

    def take(self, keep) -> PairTable:
        """The rows selected by a bool mask or index array."""
        return PairTable(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})

    @classmethod
    def concat(cls, parts: list[PairTable]) -> PairTable:
        """The rows of every part, in order."""
        if not parts:
            return cls.empty()
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    def arrays(self) -> dict[str, np.ndarray]:
        """Field name -> array."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class StoredPairs:
    """A pairs file: the table, the images the run had searched (with their SHA-256) and its settings.

    Attributes:
        version: the index version the pairs were computed on.
        table: the pairs.
        searched: (n,) int64 image ids whose tokens were searched (every live image of that version).
        sha256: (n,) the searched images' SHA-256 (hex, bytes ``S64``): an image whose file changed is searched
            again.
        settings: the candidate settings (``DuplicateConfig.candidate_settings``) and run facts (timings).
    """

    version: int
    table: PairTable
    searched: np.ndarray
    sha256: np.ndarray
    settings: dict


def folder(index_dir: Path | str) -> Path:
    """``INDEX_DIR/duplicates``."""
    return Path(index_dir) / DUPLICATES_DIR


def _file(index_dir: Path | str, version: int) -> Path:
    return folder(index_dir) / f"{PAIRS_PREFIX}{version_name(version)}.npz"


def stored_versions(index_dir: Path | str) -> list[int]:
    """The index versions that have a pairs file, ascending."""
    d = folder(index_dir)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        stem = p.name[len(PAIRS_PREFIX):-len(".npz")] if p.name.startswith(PAIRS_PREFIX) else ""
        if p.name.endswith(".npz") and stem.startswith("v") and stem[1:].isdigit():
            out.append(int(stem[1:]))
    return sorted(out)


def save(index_dir: Path | str, stored: StoredPairs) -> Path:
    """Write a pairs file atomically and keep only the ``KEEP_FILES`` newest; returns its path."""
    path = _file(index_dir, stored.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, searched=stored.searched, sha256=stored.sha256,
             settings=np.array(json.dumps(stored.settings)), **stored.table.arrays())
    write_bytes_atomic(path, buf.getvalue())
    for old in stored_versions(index_dir)[:-KEEP_FILES]:
        if old != stored.version:
            _file(index_dir, old).unlink(missing_ok=True)
    return path


def load(index_dir: Path | str, version: int) -> StoredPairs | None:
    """The pairs file of ``version``, or None when there is none or it is unreadable (it is then recomputed)."""
    path = _file(index_dir, version)
    try:
        with np.load(path, allow_pickle=False) as z:
            blank = PairTable.empty(len(z["a"]))  # fields a file written before them lacks: not computed
            table = PairTable(**{f.name: z[f.name] if f.name in z.files else getattr(blank, f.name)
                                 for f in fields(PairTable)})
            return StoredPairs(version, table, z["searched"], z["sha256"], json.loads(str(z["settings"])))
    except (OSError, ValueError, KeyError):
        return None


def latest(index_dir: Path | str, up_to: int) -> StoredPairs | None:
    """The newest readable pairs file of a version <= ``up_to`` (None: none)."""
    for version in reversed(stored_versions(index_dir)):
        if version <= up_to:
            found = load(index_dir, version)
            if found is not None:
                return found
    return None


@contextlib.contextmanager
def run_lock(index_dir: Path | str, timeout_s: float = 600.0):
    """Hold the duplicates lock of an index (one run updates its pairs at a time; the others wait).

    Raises:
        IndexLockedError: another run held it for ``timeout_s`` seconds.
    """
    d = folder(index_dir)
    d.mkdir(parents=True, exist_ok=True)
    fd = acquire_flock(d / LOCK_FILE, timeout_s, f"another duplicates run is updating {d}; try again later",
                       poll_s=0.2)
    try:
        yield
    finally:
        release_flock(fd)
