"""Duplicate finding over one index version: the self-join, the exact-copy check and the geometric verification,
incremental from the pairs stored with an earlier version.

``update_pairs`` is what ``regis duplicates`` and ``GET /v1/.../duplicates`` run:

1. the newest stored pairs of a version <= this one with the same candidate settings (``regis.duplicates.store``)
   are kept for the images that are still live and unchanged (same SHA-256);
2. only the other images (new, or changed since) are searched (``regis.duplicates.selfjoin.self_join``): their
   pairs with every live image;
3. new pairs with the same SHA-256 are exact copies; pairs of the same size whose tokens agree to
   ``exact_tokens`` are decoded and compared pixel by pixel; every pair whose two images carry different EXIF
   exposure times is marked two shots (``mark_shots``: never an edited copy);
4. new pairs whose token scores reach ``verify_floor`` are verified geometrically (``regis.duplicates.geometry``)
   when both files can be read, on ``workers`` threads (OpenCV and FAISS release the GIL); each image's features
   are computed once into a bounded cache, the pairs taken in an order that keeps pairs of one image together;
   those it does not verify (fewer than ``min_inliers`` inliers) get the template search
   (``regis.duplicates.template``) from the same cached images; stored pairs that never had it (a file written
   before it existed) get it on the next run;
5. candidates through the duplicate groups (``group_candidates``): every pair within a small duplicate group; a
   crop found with confidence in one image paired with every image that contains that one: its copies (exact and
   edited) and, through crops found with confidence in turn, their containers and their copies; and the crops found
   with confidence in one group paired with each other. Pairs not yet candidates are scored from the stored
   tokens and checked as above; every such pair is verified and searched by template whatever its token scores
   (``PairTable.by_group``), and its evidence alone decides its relation; repeated while it finds more (at most
   ``GROUP_ROUNDS`` times);
6. the table is stored with this version.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np

from regis.duplicates import relations as rel
from regis.duplicates import store
from regis.duplicates.config import AT_LEAST_FIELDS, AT_MOST_FIELDS, DuplicateConfig
from regis.duplicates.geometry import LocalFeatures, features_or_none, prefilter, verify_pair
from regis.duplicates.groups import copy_groups
from regis.duplicates.selfjoin import score_pairs, self_join
from regis.duplicates.store import PairTable, StoredPairs
from regis.duplicates.template import REFINE_BELOW_RULE, locate
from regis.errors import ImageDecodeError
from regis.images.exif import captured_at
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord

FileResolver = Callable[[ImageRecord], Path | None]  # where an image's file is (None: not available)
Progress = Callable[[str, int, int], None]  # (stage, done, total)
FEATURE_CACHE = 4096  # images whose local features are kept in memory during verification (~80 KB each)
VERIFY_CHUNK = 512  # pairs verified per step (pairs sorted by their first image, so features are reused)


@dataclass
class DuplicateRun:
    """What ``update_pairs`` did and found.

    Attributes:
        stored: the pairs of this version (also on disk).
        searched: images searched by the run that made them (the new and changed ones; every image on a full run).
        reused: pairs it kept from the stored run of ``from_version``.
        from_version: the index version the reused pairs were computed on (None: a full run).
        timings_ms: {"join", "exact", "verify", "total"} of that run.
        computed_now: False when the pairs were stored already (the facts above are the stored run's).
    """

    stored: StoredPairs
    searched: int
    reused: int
    from_version: int | None
    timings_ms: dict = field(default_factory=dict)
    computed_now: bool = True

    @classmethod
    def of(cls, stored: StoredPairs) -> DuplicateRun:
        """The facts of a stored run."""
        s = stored.settings
        return cls(stored, int(s.get("searched", 0)), int(s.get("reused_pairs", 0)), s.get("from_version"),
                   dict(s.get("timings_ms") or {}), computed_now=False)


def index_file_resolver(snapshot: IndexSnapshot, uploads_dir: Path | str | None = None,
                        images_root: Path | str | None = None) -> FileResolver:
    """Files of an index: uploads in ``uploads_dir`` (default: the index's default uploads folder), the others
    below ``images_root`` (default: the manifest's); paths that escape their folder or files that are gone give
    None."""
    from regis.indexes.uploads import default_uploads_dir, is_upload_path, upload_file

    root = images_root or snapshot.manifest.images_root
    root = Path(root).resolve() if root else None
    uploads = Path(uploads_dir) if uploads_dir else default_uploads_dir(snapshot.index_dir, root)

    def resolve(rec: ImageRecord) -> Path | None:
        try:
            if is_upload_path(rec.path):
                path = upload_file(uploads, rec.path)
            elif root is None:
                return None
            else:
                path = (root / rec.path).resolve()
                if not path.is_relative_to(root):
                    return None
        except (ValueError, OSError):
            return None
        return path if path.is_file() else None

    return resolve


def _live(snapshot: IndexSnapshot) -> tuple[np.ndarray, np.ndarray, dict[int, ImageRecord]]:
    ids = snapshot.store.live_ids
    records = snapshot.table.get_many(ids.tolist())
    ids = np.array([i for i in ids.tolist() if i in records], dtype=np.int64)
    sha = np.array([records[i].sha256 for i in ids.tolist()], dtype="S64")
    return ids, sha, records


def _reusable(snapshot: IndexSnapshot, config: DuplicateConfig, full: bool) -> StoredPairs | None:
    if full:
        return None
    prev = store.latest(snapshot.index_dir, snapshot.version)
    if prev is None:
        return None
    stored, wanted = dict(prev.settings.get("candidates") or {}), config.candidate_settings()
    stored.setdefault("verify_floor", None)  # pairs stored before the field: every candidate verified
    stored.setdefault("verify_ceiling", None)  # ... with no ceiling
    stored.setdefault("prefilter", None)  # ... every one matched in full
    for name in AT_MOST_FIELDS:  # pairs stored above a higher floor (or verified above a higher one): again
        have, want = stored.pop(name, None), wanted.pop(name)
        lowest = {"verify_floor": -2.0, "prefilter": -1}.get(name)  # None: every pair verified / matched in full
        have = lowest if have is None else have
        if have is None or (want is not None and have > want) or (want is None and have != lowest):
            return None
    for name in AT_LEAST_FIELDS:  # pairs stored with a lower ceiling (fewer verified) than a call's: again
        have, want = stored.pop(name, None), wanted.pop(name)
        if have is not None and (want is None or have < want):
            return None
    return prev if stored == wanted else None


def stored_pairs(snapshot: IndexSnapshot, config: DuplicateConfig) -> StoredPairs | None:
    """The pairs stored for ``snapshot``'s very version that ``config`` can use (None: a run is needed)."""
    prev = _reusable(snapshot, config, full=False)
    return prev if prev is not None and prev.version == snapshot.version else None


def _same_pixels(pa: Path | None, pb: Path | None) -> bool:
    from regis.images.decode import decode_image

    if pa is None or pb is None:
        return False
    try:
        return bool(np.array_equal(np.asarray(decode_image(pa).image), np.asarray(decode_image(pb).image)))
    except (ImageDecodeError, OSError):
        return False


def _exact(pairs: PairTable, records: dict[int, ImageRecord], resolve: FileResolver, config: DuplicateConfig,
           workers: int = 1) -> None:
    """Mark the exact copies among ``pairs`` in place: the same SHA-256, or the same pixels (decoded when their
    sizes match and their tokens agree to ``exact_tokens`` both ways; the pairs compared on ``workers`` threads)."""
    todo: list[tuple[int, Path | None, Path | None]] = []
    for k in range(len(pairs)):
        ra, rb = records[int(pairs.a[k])], records[int(pairs.b[k])]
        if ra.sha256 == rb.sha256:
            pairs.exact[k] = True
        elif ((ra.width, ra.height) == (rb.width, rb.height)
              and min(pairs.s_ab[k], pairs.s_ba[k]) >= config.exact_tokens):
            todo.append((k, resolve(ra), resolve(rb)))
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:  # decoding releases the GIL
        same = list(pool.map(lambda job: _same_pixels(job[1], job[2]), todo))
    for (k, _, _), equal in zip(todo, same, strict=True):
        pairs.exact[k] = equal


class _Features:
    """Local features of images by id, computed on demand, the ``cache_size`` most recent kept; counts how many
    it computed and the time spent (every image once when the cache holds them all)."""

    def __init__(self, records: dict[int, ImageRecord], resolve: FileResolver, config: DuplicateConfig,
                 cache_size: int = FEATURE_CACHE):
        self.records, self.resolve, self.config, self.cache_size = records, resolve, config, cache_size
        self.cache: OrderedDict[int, LocalFeatures | None] = OrderedDict()
        self.computed, self.seconds = 0, 0.0

    def many(self, ids: list[int], pool: ThreadPoolExecutor) -> dict[int, LocalFeatures | None]:
        t0 = time.perf_counter()
        missing = [i for i in dict.fromkeys(ids) if i not in self.cache]
        paths = [self.resolve(self.records[i]) for i in missing]
        side, n = self.config.verify_side, self.config.features
        for i, feats in zip(missing, pool.map(lambda p: features_or_none(p, side, n), paths), strict=True):
            self.cache[i] = feats
        self.computed += len(missing)
        out = {}
        for i in ids:
            self.cache.move_to_end(i)
            out[i] = self.cache[i]
        while len(self.cache) > max(self.cache_size, len(ids)):
            self.cache.popitem(last=False)
        self.seconds += time.perf_counter() - t0
        return out


def mark_shots(pairs: PairTable, records: dict[int, ImageRecord]) -> None:
    """Set ``pairs.shots`` in place: both images' records carry an EXIF exposure time (``file.captured_at``,
    ``regis.images.exif``) and they differ (two shots: ``relations`` never calls them edited copies). From the
    records of the run's index version, so a metadata update (a new version) is seen by the next run."""
    if len(pairs) == 0:
        return
    ids = np.unique(np.concatenate([pairs.a, pairs.b]))
    when = {i: captured_at(records[i].metadata) if i in records else None for i in ids.tolist()}
    ta = [when[int(x)] for x in pairs.a]
    tb = [when[int(x)] for x in pairs.b]
    pairs.shots[:] = [x is not None and y is not None and x != y for x, y in zip(ta, tb, strict=True)]


def to_verify(pairs: PairTable, config: DuplicateConfig) -> np.ndarray:
    """Rows of ``pairs`` to verify geometrically: not exact copies, token scores at or above ``verify_floor`` in
    either direction (every other row when it is None; and every row ``by_group``) and below ``verify_ceiling``
    in one (when set)."""
    want = ~pairs.exact
    if config.verify_floor is not None:
        want &= (np.maximum(pairs.s_ab, pairs.s_ba) >= config.verify_floor) | (pairs.by_group > 0)
    if config.verify_ceiling is not None:
        want &= np.minimum(pairs.s_ab, pairs.s_ba) < config.verify_ceiling
    return np.flatnonzero(want)


def locality_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An order of the pairs (a[k], b[k]) in which pairs sharing an image come close together, so a bounded
    feature cache computes each image's features about once: images renumbered by reverse Cuthill-McKee
    (scipy) on the pair graph, pairs sorted by their images' new numbers.

    Returns:
        (p,) int64 permutation of the pairs.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    if len(a) == 0:
        return np.zeros(0, dtype=np.int64)
    nodes, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    ia, ib = inv[:len(a)], inv[len(a):]
    n = len(nodes)
    graph = coo_matrix((np.ones(2 * len(a), np.int8), (np.concatenate([ia, ib]), np.concatenate([ib, ia]))),
                       shape=(n, n)).tocsr()
    rank = np.empty(n, dtype=np.int64)
    rank[reverse_cuthill_mckee(graph, symmetric_mode=True)] = np.arange(n)
    lo, hi = np.minimum(rank[ia], rank[ib]), np.maximum(rank[ia], rank[ib])
    return np.lexsort((hi, lo)).astype(np.int64)


def template_sized(pairs: PairTable, records: dict[int, ImageRecord], config: DuplicateConfig) -> np.ndarray:
    """(p,) bool: the pairs whose smaller image, by its longest side in pixels (as indexed), is below
    ``config.template_max_side`` (every pair when it is None; an image without a record counts as 0 px)."""
    if config.template_max_side is None:
        return np.ones(len(pairs), dtype=bool)
    ids = np.unique(np.concatenate([pairs.a, pairs.b])) if len(pairs) else np.zeros(0, np.int64)
    side = {i: max(records[i].width, records[i].height) if i in records else 0 for i in ids.tolist()}
    small = np.minimum([side[int(i)] for i in pairs.a], [side[int(i)] for i in pairs.b])
    return small < config.template_max_side


def template_gated(pairs: PairTable, config: DuplicateConfig) -> np.ndarray:
    """(p,) bool: the pairs inside the template search's token gate: MaxSim per token at or above
    ``template_floor`` in either direction (every pair when it is None), or paired ``by_group``."""
    if config.template_floor is None:
        return np.ones(len(pairs), dtype=bool)
    return (np.maximum(pairs.s_ab, pairs.s_ba) >= config.template_floor) | (pairs.by_group > 0)


def refine_bar(config: DuplicateConfig) -> float:
    """The template search's ``refine_from`` for a run with ``config``: ``template_ncc`` - ``REFINE_BELOW_RULE``
    (-inf when the crop rule is off: every direction at full size). A direction whose half-size peak is below it
    cannot pass the rule: on the labelled set's 18,110 searched pairs no figure changed and the CPU per pair fell
    21 % (``bench.duplicates_template_steps --variants 20r``; docs/DUPLICATES.md, Scale)."""
    return -np.inf if config.template_ncc is None else float(config.template_ncc - REFINE_BELOW_RULE)


def to_locate(pairs: PairTable, config: DuplicateConfig, records: dict[int, ImageRecord]) -> np.ndarray:
    """Rows of an already verified table that still need the template search: searched by a run, files
    readable, gated like ``to_verify`` and by ``template_sized``, not verified (fewer than ``min_inliers``
    inliers), and never searched or searched with a higher bar than this call's ``refine_bar`` (a lower
    ``template_ncc`` than the run's: a peak reported at half size could now decide; not when the rule is off)."""
    if not (config.verify and config.template):
        return np.zeros(0, dtype=np.int64)
    want = np.zeros(len(pairs), dtype=bool)
    want[to_verify(pairs, config)] = True
    want &= template_gated(pairs, config)
    want &= template_sized(pairs, records, config)
    stale = pairs.located & (pairs.refine_from > np.float32(refine_bar(config)) + 1e-6)
    stale &= config.template_ncc is not None  # the crop rule off: no peak decides anything
    return np.flatnonzero(want & pairs.files & (~pairs.located | stale) & (pairs.inliers < config.min_inliers))


def _verify(pairs: PairTable, records: dict[int, ImageRecord], resolve: FileResolver, config: DuplicateConfig,
            workers: int, progress: Progress | None, rows_all: np.ndarray | None = None,
            match: bool = True, feats: _Features | None = None) -> dict:
    """Verify ``rows_all`` (default: the rows ``to_verify`` selects) geometrically, in place
    (``regis.duplicates.geometry.verify_pair``; ``match`` False: only the template search, of every row given),
    and search the ones it leaves unverified by template (``config.template``); returns counts and wall times:
    {"pairs_verified", "pairs_located", "features_computed", "images", "features_ms", "match_ms", "locate_ms"}
    (features: those this call computed). ``feats``: the run's feature cache, shared by its calls so that an
    image verified again by the group stage is not decoded and described again (None: a cache of this call's)."""
    rows_all = to_verify(pairs, config) if rows_all is None else rows_all
    order = rows_all[locality_order(pairs.a[rows_all], pairs.b[rows_all])]
    sized = template_sized(pairs, records, config) & template_gated(pairs, config)
    bar = refine_bar(config)
    feats = feats if feats is not None else _Features(records, resolve, config)
    computed0, seconds0 = feats.computed, feats.seconds
    spent = {"match": 0.0, "locate": 0.0}
    located = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(order), VERIFY_CHUNK):
            rows = order[start:start + VERIFY_CHUNK]
            got = feats.many([int(x) for r in rows for x in (pairs.a[r], pairs.b[r])], pool)
            wall0, cpu = time.perf_counter(), {"match": 0.0, "locate": 0.0}

            def one(r: int, got=got):
                fa, fb = got[int(pairs.a[r])], got[int(pairs.b[r])]
                t0 = time.perf_counter()
                pre, v = int(pairs.pre[r]), None
                if match and fa and fb:
                    if config.prefilter is not None:  # without a prefilter every pair is matched in full: the
                        pre = prefilter(fa, fb)       # first match would only be stored (-1: not run)
                    if config.prefilter is None or pre >= config.prefilter:
                        v = verify_pair(fa, fb)
                t1 = time.perf_counter()
                loc = None
                if (config.template and sized[r] and fa and fb and fa.thumb is not None and fb.thumb is not None
                        and (not match or v is None or v.inliers < config.min_inliers)):
                    loc = locate(fa.thumb, fb.thumb, refine_from=None if bar == -np.inf else bar)
                return r, fa is not None and fb is not None, pre, v, loc, t1 - t0, time.perf_counter() - t1

            for r, files, pre, v, loc, t_match, t_loc in pool.map(one, rows):
                pairs.files[r], pairs.pre[r] = files, pre
                cpu["match"] += t_match
                cpu["locate"] += t_loc
                if v is not None:
                    pairs.matches[r], pairs.inliers[r] = v.matches, v.inliers
                    pairs.cover_a[r], pairs.cover_b[r] = v.cover_a, v.cover_b
                    pairs.quad_ab[r], pairs.quad_ba[r], pairs.residual[r] = v.quad_a_in_b, v.quad_b_in_a, v.residual
                if loc is not None:
                    pairs.located[r], pairs.box[r] = True, loc.box
                    pairs.ncc_ab[r], pairs.ncc_ba[r] = loc.ncc_ab, loc.ncc_ba
                    pairs.refine_from[r] = bar
                    located += 1
            wall = time.perf_counter() - wall0  # the chunk's wall time, split by the threads' time in each step
            for step in spent:
                spent[step] += wall * cpu[step] / max(1e-12, cpu["match"] + cpu["locate"])
            if progress is not None:
                progress("verify", min(start + VERIFY_CHUNK, len(order)), len(order))
    images = len(np.unique(np.concatenate([pairs.a[rows_all], pairs.b[rows_all]]))) if len(rows_all) else 0
    return {"pairs_verified": int(len(rows_all)) if match else 0, "pairs_located": located,
            "features_computed": feats.computed - computed0, "images": images,
            "features_ms": (feats.seconds - seconds0) * 1e3,
            "match_ms": spent["match"] * 1e3, "locate_ms": spent["locate"] * 1e3}


SURE_CROP_NCC = 0.85  # a crop pair is sure enough to pair its crop with every image containing its container when its
# template peak reaches this (or it was verified geometrically). Chosen on the labelled set's calibration split (seed
# 0) as the other thresholds: the highest crop precision within 0.002 of the best crop direction (0.80-0.98 tried,
# python -m bench.duplicates_group_variants, docs/results/duplicates/group-variants-closed-seed0.json). Lower values
# pair more small crops of plain backgrounds, found in unrelated photos, with those photos' copies (false crops).
MAX_CLOSED_GROUP = 16  # images: the largest duplicate group whose pairs are all verified (``closed_group_pairs``)
GROUP_ROUNDS = 3  # rounds of ``group_candidates``: a round's verified pairs can make crops sure for the next


def closed_group_pairs(group: dict[int, list[int]], max_size: int = MAX_CLOSED_GROUP) -> set[tuple[int, int]]:
    """Every pair of members of each duplicate group of at most ``max_size`` images: copies of one photo are
    copies of each other, but the self-join pairs an image only with its ``neighbours`` best candidates.

    Args:
        group: image id -> its group's members (``groups.copy_groups``).

    Returns:
        {(a, b)} with a < b (groups of one image give none; larger groups than ``max_size`` none: a chain of
        false edges must not cost a number of verifications quadratic in its length).
    """
    out: set[tuple[int, int]] = set()
    for members in {tuple(m) for m in group.values() if 1 < len(m) <= max_size}:  # members ascending
        out.update(combinations(members, 2))
    return out


def group_candidates(pairs: PairTable, config: DuplicateConfig, chain: bool = True,
                     closed: bool = True, siblings: bool = True) -> np.ndarray:
    """The pairs that link a sure crop to every image that contains it through the duplicate groups, and the
    pairs within each small duplicate group.

    For every crop pair of ``pairs`` (relations under ``config``) that is sure (its template peak >=
    ``SURE_CROP_NCC`` in either direction, or at least ``min_inliers`` inliers), its crop is paired with every
    member of its container's group (exact and edited copies) and, where a member is itself a sure crop of another
    image, with that image's group in turn (containment is transitive: a crop of a crop of a photo is a crop of
    the photo). A crop of one copy of a photo is a crop of every copy; the self-join keeps each image's
    ``neighbours`` best pairs, and a small crop's tokens can rank unrelated photos above its containers (or score
    them below the token gates).

    Within a duplicate group (``closed``), every pair of members not yet verified is verified too
    (``closed_group_pairs``), so that each copy is reported as a copy of every other, not only of those among its
    ``neighbours`` best candidates; and so is every pair of sure crops of one group (``siblings``): one may lie
    in the other.

    Args:
        chain: follow containment through crops of crops (False: the copies of each direct container only).
        closed: add the pairs within each duplicate group of at most ``MAX_CLOSED_GROUP`` images.
        siblings: add the pairs of sure crops of one group (``sibling_crop_pairs``).

    Returns:
        (k, 2) int64 (a, b) with a < b, sorted: pairs already in ``pairs`` (the sure ones among them) and new ones.
    """
    if len(pairs) == 0:
        return np.zeros((0, 2), np.int64)
    relation, container = rel.classify(pairs, config)
    sure = (relation == rel.CROP) & ((np.maximum(pairs.ncc_ab, pairs.ncc_ba) >= SURE_CROP_NCC)
                                     | (pairs.inliers >= config.min_inliers))
    group = copy_groups(pairs, relation)
    out = closed_group_pairs(group) if closed else set()
    inside: dict[int, set[int]] = {}  # a sure crop -> the images it was found in
    for r in np.flatnonzero(sure).tolist():
        outer = int(container[r])
        inner = int(pairs.b[r]) if outer == int(pairs.a[r]) else int(pairs.a[r])
        inside.setdefault(inner, set()).add(outer)
    crops_of: dict[tuple[int, ...], set[int]] = {}  # a group -> the sure crops that lie in it
    for inner, direct in inside.items():
        reached, todo = set(), list(direct)
        while todo:  # the containers' groups, and the containers of their members, transitively
            for q in group[todo.pop()]:
                if q not in reached:
                    reached.add(q)
                    todo.extend(inside.get(q, ()) if chain else ())
        out.update((min(inner, q), max(inner, q)) for q in reached if q not in group[inner])
        for q in reached:
            crops_of.setdefault(tuple(group[q]), set()).add(inner)
    if siblings:
        out.update(sibling_crop_pairs(crops_of.values(), group))
    return np.array(sorted(out), np.int64).reshape(-1, 2)


def sibling_crop_pairs(crop_sets, group: dict[int, list[int]],
                       max_size: int = MAX_CLOSED_GROUP) -> set[tuple[int, int]]:
    """Every pair of sure crops of one photo (of one duplicate group) that are not copies of each other: a
    smaller crop often lies inside a larger one, and the self-join need not have paired them.

    Args:
        crop_sets: for each group, the sure crops that lie in it (sets of image ids).
        group: image id -> its group's members (``groups.copy_groups``).

    Returns:
        {(a, b)} with a < b (none from a set larger than ``max_size``).
    """
    out: set[tuple[int, int]] = set()
    for crops in crop_sets:
        if len(crops) > max_size:
            continue
        out.update((a, b) for a, b in combinations(sorted(crops), 2) if b not in group.get(a, (a,)))
    return out


def _group_round(snapshot: IndexSnapshot, pairs: PairTable, records: dict[int, ImageRecord], resolve: FileResolver,
                 config: DuplicateConfig, decide: DuplicateConfig, workers: int,
                 progress: Progress | None, feats: _Features | None = None) -> tuple[PairTable, int, int]:
    """One round of ``group_candidates`` of ``pairs`` (decided under ``decide``): the rows it names are marked
    ``by_group`` in place and verified or searched where the token gates had kept them out (under ``config``);
    the pairs not in ``pairs`` yet are scored from the stored tokens as the self-join scores its candidates,
    checked for exact copies and verified (``feats``: the run's feature cache, ``_verify``). Returns (the new
    pairs, rows marked, new pairs)."""
    found = group_candidates(pairs, decide)
    at = {(int(a), int(b)): r for r, (a, b) in enumerate(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True))}
    rows = np.array([at.get((int(a), int(b)), -1) for a, b in found], np.int64)
    marked = rows[rows >= 0]
    marked = marked[pairs.by_group[marked] == 0]
    pairs.by_group[marked] = 1
    if config.verify and len(marked):
        unmatched = np.intersect1d(to_verify(pairs, config), marked[~pairs.files[marked]])
        if len(unmatched):  # kept out by verify_floor: matched in full, then searched
            _verify(pairs, records, resolve, config, workers, progress, unmatched, feats=feats)
        unsearched = np.intersect1d(to_locate(pairs, config, records), marked)
        if len(unsearched):  # matched, but kept out of the template search by template_floor
            _verify(pairs, records, resolve, config, workers, progress, unsearched, match=False, feats=feats)
    found = found[rows < 0]
    new = PairTable.empty(len(found))
    if len(found) == 0:
        return new, len(marked), 0
    new.a, new.b, new.by_group[:] = found[:, 0], found[:, 1], 2
    new.s_ab, new.s_ba = score_pairs(snapshot, new.a, new.b)
    _exact(new, records, resolve, config, workers)
    mark_shots(new, records)
    if config.verify:
        _verify(new, records, resolve, config, workers, progress, feats=feats)
    return new, len(marked), len(new)


def _group_pairs(snapshot: IndexSnapshot, pairs: PairTable, records: dict[int, ImageRecord], resolve: FileResolver,
                 config: DuplicateConfig, decide: DuplicateConfig, workers: int,
                 progress: Progress | None, feats: _Features | None = None) -> tuple[PairTable, dict]:
    """``pairs`` with the rounds of ``_group_round`` applied (at most ``GROUP_ROUNDS``, until one finds nothing);
    returns the table and {"rounds", "marked", "added", "features_computed"} (``feats``: the run's feature
    cache; None: one for these rounds)."""
    feats = feats if feats is not None else _Features(records, resolve, config)
    computed0 = feats.computed
    facts = {"rounds": 0, "marked": 0, "added": 0}
    for _ in range(GROUP_ROUNDS):
        new, marked, added = _group_round(snapshot, pairs, records, resolve, config, decide, workers, progress,
                                          feats)
        if marked == 0 and added == 0:
            break
        pairs = PairTable.concat([pairs, new])
        facts = {"rounds": facts["rounds"] + 1, "marked": facts["marked"] + marked, "added": facts["added"] + added}
    return pairs, {**facts, "features_computed": feats.computed - computed0}


def update_pairs(snapshot: IndexSnapshot, config: DuplicateConfig, resolve: FileResolver | None = None,
                 full: bool = False, workers: int | None = None, threads: int | None = None,
                 progress: Progress | None = None, groups_by: DuplicateConfig | None = None) -> DuplicateRun:
    """The pair table of ``snapshot``'s version: stored already, or computed incrementally (module docstring).

    Args:
        snapshot: the index version.
        config: thresholds and settings: stored pairs are reused when they were made with the same candidate
            settings and a floor no higher than this one.
        resolve: where an image's file is (None: ``index_file_resolver(snapshot)``).
        full: search every image again, ignoring stored pairs.
        workers: verification threads (None: every core).
        threads: FAISS threads of the self-join (None: every core).
        progress: called with (stage, done, total) as the stages advance ("search", "verify").
        groups_by: the thresholds that decide the crops and copies through which candidates are added
            (``group_candidates``; None: ``config``; the labelled set's evaluation runs with low gates and
            passes the shipped thresholds here).

    Returns:
        A ``DuplicateRun``; its pairs are saved in ``INDEX_DIR/duplicates`` (only one run at a time updates them:
        a second waits for the first and then finds its result).

    Raises:
        IndexLockedError: another run held the duplicates lock too long.
    """
    resolve = resolve or index_file_resolver(snapshot)
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    with store.run_lock(snapshot.index_dir):
        prev = _reusable(snapshot, config, full)
        if prev is not None and prev.version == snapshot.version:
            records = _live(snapshot)[2]
            mark_shots(prev.table, records)  # files written before the field: read from this version's records
            missing = to_locate(prev.table, config, records)
            if len(missing) == 0:
                return DuplicateRun.of(prev)
            # pairs stored before the template search (or outside a former call's gates): search them, store again
            got = _verify(prev.table, records, resolve, config, workers, progress, missing, match=False)
            prev.settings["template_added"] = got
            store.save(snapshot.index_dir, prev)
            return DuplicateRun.of(prev)
        ids, sha, records = _live(snapshot)
        if prev is not None:
            known = dict(zip(prev.searched.tolist(), prev.sha256.tolist(), strict=True))
            kept = np.array([known.get(i) == s for i, s in zip(ids.tolist(), sha.tolist(), strict=True)], bool)
            keep_ids = ids[kept]
            old = prev.table.take(np.isin(prev.table.a, keep_ids) & np.isin(prev.table.b, keep_ids))
            query = ids[~kept]
        else:
            old, query = PairTable.empty(), ids
        feats = _Features(records, resolve, config)  # one cache for the run: verification and the group stage
        missing = to_locate(old, config, records)
        if len(missing):  # kept pairs stored before the template search
            _verify(old, records, resolve, config, workers, progress, missing, match=False, feats=feats)
        t1 = time.perf_counter()
        join_stats: dict = {}
        cand = self_join(snapshot, query, floor=config.floor, neighbours=config.neighbours, depth=config.depth,
                         threads=threads, progress=(lambda d, n: progress("search", d, n)) if progress else None,
                         stats=join_stats)
        new = PairTable.empty(len(cand))
        new.a, new.b, new.s_ab, new.s_ba = cand.a, cand.b, cand.s_ab, cand.s_ba
        t2 = time.perf_counter()
        _exact(new, records, resolve, config, workers)
        t3 = time.perf_counter()
        verified = _verify(new, records, resolve, config, workers, progress, feats=feats) if config.verify else None
        t4 = time.perf_counter()
        table = PairTable.concat([old, new])
        mark_shots(table, records)  # the kept pairs too: their images' metadata may have changed since
        table, grouped = _group_pairs(snapshot, table, records, resolve, config, groups_by or config, workers,
                                      progress, feats)
        t5 = time.perf_counter()
        timings = {"join": (t2 - t1) * 1e3, "exact": (t3 - t2) * 1e3, "verify": (t4 - t3) * 1e3,
                   "copy_groups": (t5 - t4) * 1e3, "total": (time.perf_counter() - t0) * 1e3}
        settings = {"candidates": config.candidate_settings(), "searched": int(len(query)), "timings_ms": timings,
                    "from_version": prev.version if prev is not None else None, "reused_pairs": len(old),
                    "verification": verified, "join": join_stats, "group_candidates": grouped}
        stored = StoredPairs(snapshot.version, table, ids, sha, settings)
        store.save(snapshot.index_dir, stored)
        return DuplicateRun(stored, int(len(query)), len(old), prev.version if prev is not None else None, timings)
