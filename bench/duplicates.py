"""How long the duplicates self-join takes on a large collection (issue 26, item 2: 100k images in under 30 min).

The collection: the real tokens of an index built by the encoder (``--real``: e.g. the labelled near-duplicate
set of ``scripts/eval_duplicates.py``, 2,592 real-photo images with the default encoder), then images generated
from them as ``bench.corpus1m`` does (each a token-by-token mix of two real images that are neighbours: the real
neighbourhood and near-duplicate structure, no new content) up to ``--n`` images, written into a regis index with
the writer's default FAISS setting (``bench.data.build_index``, a distinct SHA-256 per image). Generated images
have no files, so the run measures the self-join (every image's tokens searched, both-way exact MaxSim of the
candidates, pairs above the floor), the exact-copy check and the grouping, and counts what verification would do
(the pairs the shipped ``verify_floor`` selects, the images they touch, the feature extractions of the finder's
bounded cache in its locality order). Verification's rates (wall ms per feature extraction, per verified pair)
are measured by a full run with the same thresholds on a copy of an index whose files exist (``--files-index``:
the labelled set's, 2,592 real files); the total is the measured stages plus those counts at those rates,
labelled as an estimate (and as an extrapolation when ``--n`` is below ``--target-n``). Beside it, a bound for a
collection as dense in copies and crops as the labelled set (``dense_bound``): the generated images have no files,
so their pixel comparisons and the group stage's verification of crops are not run.

Then an incremental run: ``--add`` more generated images are committed and only they are searched.

Usage::

    python -m bench.duplicates --real /work/cache/dup-eval/debian-s0/index --n 100000 \\
        --work /tmp/regis-dup-scale --files-index /work/cache/dup-eval/debian-s0/index \\
        --json docs/results/duplicates/scale-100k.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import machine_info, print_json


def real_tokens(index: Path) -> np.ndarray:
    """(N, T, D) float16: every live image's stored tokens of a regis index."""
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    try:
        return np.asarray(snap.store.get(snap.store.live_ids), dtype=np.float16)
    finally:
        snap.close()


def collection(real: np.ndarray, n: int, seed: int, k: int = 10) -> np.ndarray:
    """(n, T, D) float16: the real images, then generated ones (``bench.corpus1m.generate``) up to n."""
    from bench.corpus1m import generate, image_neighbours

    if n <= len(real):
        return real[:n]
    nb = image_neighbours(real, k)
    return np.concatenate([real, generate(real, nb, 0, n - len(real), seed, 0.0)])


def _encoder(db: np.ndarray):
    """The manifest's encoder for ``db`` (N, T, D): the shipped encoder's two framings when T = 20 and D = 256 (a
    two-framing real index, the default of new CNN indexes: the join scores centre-all), else one framing of T."""
    from bench.data import bench_encoder

    two = db.shape[1:] == (20, 256)
    return bench_encoder(db.shape[2], db.shape[1], record="servable" if two else "bench")


def write_index(path: Path, db: np.ndarray) -> dict:
    """A regis index of ``db`` (writer defaults; distinct SHA-256 per image, no files; ``_encoder``); returns
    timings (s)."""
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    if path.exists():
        shutil.rmtree(path)
    config, weights = _encoder(db)
    t0 = time.perf_counter()
    with IndexWriter(path, config, weights) as w:
        ids = w.allocate_ids(len(db))
        for s in range(0, len(db), 10_000):
            part = ids[s:s + 10_000]
            w.put([ImageRecord(int(i), f"img/{i}.jpg", f"{i:064x}", 640, 480, 1, 0.0) for i in part],
                  np.asarray(db[s:s + 10_000]))
        manifest = w.commit()
    return {"build_s": time.perf_counter() - t0, "faiss": manifest.faiss.spec, "nprobe": manifest.faiss.nprobe,
            "depth": manifest.faiss.depth, "token_store": manifest.token_store.spec}


def add_images(path: Path, db: np.ndarray) -> float:
    """Commit ``db`` as new images of the index; returns seconds."""
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    config, weights = _encoder(db)
    t0 = time.perf_counter()
    with IndexWriter(path, config, weights) as w:  # on the current version: adds
        ids = w.allocate_ids(len(db))
        w.put([ImageRecord(int(i), f"img/{i}.jpg", f"{i:064x}", 640, 480, 1, 0.0) for i in ids], db)
        w.commit()
    return time.perf_counter() - t0


def run_once(index: Path, config, threads: int | None, plan: bool = False) -> dict:
    """One ``update_pairs`` (no files: no verification) + grouping; its figures."""
    from regis.duplicates.finder import FEATURE_CACHE, VERIFY_CHUNK, update_pairs
    from regis.duplicates.groups import group_pairs
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    try:
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        run = update_pairs(snap, config, resolve=lambda rec: None, threads=threads)
        t1 = time.perf_counter()
        grouping = group_pairs(run.stored.table, config)
        t2 = time.perf_counter()
        return {"images": int(len(snap.store.live_ids)), "searched": run.searched, "reused_pairs": run.reused,
                "candidate_pairs": len(run.stored.table), "timings_ms": run.timings_ms,
                "join_stages": run.stored.settings.get("join"),
                "group_ms": (t2 - t1) * 1e3, "wall_s": t2 - t0, "cpu_s": time.process_time() - cpu0,
                "duplicate_groups": grouping.counts()["duplicate_groups"],
                "images_per_s": run.searched / max(1e-9, run.timings_ms["join"] / 1e3),
                **({"verification_plan": feature_loads(run.stored.table, config, FEATURE_CACHE, VERIFY_CHUNK)}
                   if plan else {})}
    finally:
        snap.close()


def feature_loads(pairs, config, cache_size: int, chunk: int) -> dict:
    """What verification of a pair table would do under ``config`` without running it: the pairs the gate
    selects (``finder.to_verify``), the images they touch, and how many feature extractions the finder's bounded
    cache would make in its locality order (``finder.locality_order``; the same chunked LRU as ``finder._Features``).
    """
    from collections import OrderedDict

    from regis.duplicates.finder import locality_order, to_verify

    rows = to_verify(pairs, config)
    a, b = pairs.a[rows], pairs.b[rows]
    order = locality_order(a, b)
    cache: OrderedDict[int, None] = OrderedDict()
    loads = 0
    for start in range(0, len(order), chunk):
        part = order[start:start + chunk]
        ids = [int(x) for r in part for x in (a[r], b[r])]
        for i in dict.fromkeys(ids):
            if i not in cache:
                cache[i] = None
                loads += 1
        for i in ids:
            cache.move_to_end(i)
        while len(cache) > max(cache_size, len(ids)):
            cache.popitem(last=False)
    images = int(len(np.unique(np.concatenate([a, b])))) if len(rows) else 0
    return {"candidate_pairs": int(len(pairs)), "pairs_verified": int(len(rows)), "images_touched": images,
            "feature_extractions": loads, "cache_size": cache_size}


def measured_run_with_files(index: Path, work: Path, config) -> dict:
    """A full ``update_pairs`` with ``config`` on a copy of an index whose files exist (the labelled set): the
    measured wall times and the verification's counts and rates (ms per feature extraction, ms per pair)."""
    from regis.duplicates.finder import update_pairs
    from regis.indexes.snapshot import IndexSnapshot

    copy = work / "files-index"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(index, copy, ignore=shutil.ignore_patterns("duplicates"))
    snap = IndexSnapshot.open(copy)
    try:
        t0, cpu0 = time.perf_counter(), time.process_time()
        run = update_pairs(snap, config, full=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        snap.close()
    v = run.stored.settings.get("verification") or {}
    t = run.stored.table
    grouped = (t.by_group == 2) & t.files  # the pairs the group stage added: it verified every one of them
    group_images = int(len(np.unique(np.concatenate([t.a[grouped], t.b[grouped]])))) if grouped.any() else 0
    return {"index": str(index), "images": int(len(run.stored.searched)), "candidate_pairs": len(t),
            "timings_ms": run.timings_ms, "wall_s": wall, "cpu_s": cpu, "verification": v,
            "group_stage": run.stored.settings.get("group_candidates"), "group_images": group_images,
            "ms_per_feature_extraction": v.get("features_ms", 0.0) / max(1, v.get("features_computed", 0)),
            "ms_per_pair_verified": v.get("match_ms", 0.0) / max(1, v.get("pairs_verified", 0)),
            "ms_per_pair_located": v.get("locate_ms", 0.0) / max(1, v.get("pairs_located", 0)),
            "located_per_verified": v.get("pairs_located", 0) / max(1, v.get("pairs_verified", 0))}


def join_compare(index: Path, config, threads: int | None, batches: list[int]) -> dict:
    """The self-join alone (``regis.duplicates.selfjoin.self_join``, the shipped floor and neighbours), image by
    image (``per_image``, the default batch) and vectorised with each of ``batches`` query images per FAISS call,
    one after the other on the same index: wall seconds and each stage's."""
    from regis.duplicates.selfjoin import DEFAULT_BATCH, self_join
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    out = {}
    try:
        runs = [("per_image", True, DEFAULT_BATCH)] + [(f"vectorised/{b}", False, b) for b in batches]
        for name, per_image, batch in runs:
            stats: dict = {}
            t0 = time.perf_counter()
            pairs = self_join(snap, floor=config.floor, neighbours=config.neighbours, depth=config.depth,
                              threads=threads, stats=stats, per_image=per_image, batch=batch)
            out[name] = {"wall_s": time.perf_counter() - t0, "pairs": len(pairs), "stages": stats,
                         "loadavg_1m": os.getloadavg()[0]}
            print(f"join {name}: {out[name]}", file=sys.stderr)
    finally:
        snap.close()
    return out


def estimate_at_rates(full: dict, rates: dict, n: int, target: int) -> dict:
    """``estimate`` with verification's rates given (``--rates``: ms per feature extraction, per pair matched in
    full, per pair searched by template, and the share of verified pairs searched by template) instead of
    measured by a run with real files."""
    measured = {"ms_per_feature_extraction": rates["feature_ms"], "ms_per_pair_verified": rates["match_ms"],
                "ms_per_pair_located": rates["locate_ms"], "located_per_verified": rates["located_share"]}
    out = estimate(full, measured, n, target)
    out["rates"] = rates
    return out


def estimate(full: dict, measured: dict, n: int, target: int) -> dict:
    """Minutes for a full run on ``target`` images: the self-join, exact check and grouping as measured on ``n``
    (scaled by target / n when n is smaller), plus verification of the pairs the gate selected on this collection
    (``verification_plan``: pairs, feature extractions) at the wall rates measured with real files, plus the
    template search of the share of them the run with real files left unverified, at its rate."""
    scale = target / n
    plan = full["verification_plan"]
    t = full["timings_ms"]
    join_s, exact_s, group_s = (t["join"] / 1e3) * scale, (t["exact"] / 1e3) * scale, full["group_ms"] / 1e3 * scale
    feat_s = plan["feature_extractions"] * scale * measured["ms_per_feature_extraction"] / 1e3
    match_s = plan["pairs_verified"] * scale * measured["ms_per_pair_verified"] / 1e3
    # the template search runs on the verified pairs that verification leaves unverified: their share is
    # taken from the run with real files (generated images have no files to verify)
    located = plan["pairs_verified"] * scale * measured.get("located_per_verified", 0.0)
    locate_s = located * measured.get("ms_per_pair_located", 0.0) / 1e3
    total = join_s + exact_s + group_s + feat_s + match_s + locate_s
    what = (f"measured at {target} images except verification" if scale == 1 else
            f"EXTRAPOLATED from {n} images (x{scale:g}; the join's per-image cost grows with the IVF lists)")
    return {"what": what + "; verification: this collection's gated pairs and feature extractions (no files: "
            "generated images) at the rates of the run with real files", "images": target, "join_s": join_s,
            "exact_s": exact_s, "group_s": group_s, "features_s": feat_s, "match_s": match_s,
            "locate_s": locate_s, "pairs_located": located,
            "pairs_verified": plan["pairs_verified"] * scale,
            "feature_extractions": plan["feature_extractions"] * scale, "total_min": total / 60}


def dense_bound(est: dict, measured: dict, target: int) -> dict:
    """``est`` plus what a collection as dense in copies and crops as the labelled set (every photo with 9 copies
    and crops) would add that the generated one cannot show: the exact check's pixel comparisons and the group
    stage, at the run with real files' wall seconds per image, plus a feature extraction for every image of the
    pairs the group stage added (``group_images``: at ``target`` images the run's bounded feature cache would no
    longer hold them from the first verification; the labelled set's 2,592 images fit in it)."""
    scale = target / measured["images"]
    t = measured["timings_ms"]
    exact_s, group_s = t["exact"] / 1e3 * scale, t["copy_groups"] / 1e3 * scale
    refeatures_s = measured["group_images"] * scale * measured["ms_per_feature_extraction"] / 1e3
    total = est["total_min"] + (exact_s + group_s + refeatures_s) / 60
    return {"what": "the estimate plus the exact check and the group stage of a collection as dense in copies and "
            "crops as the labelled set, at the run with real files' per-image wall time, and the group stage's "
            "images described again", "exact_s": exact_s, "group_s": group_s, "refeatures_s": refeatures_s,
            "total_min": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", required=True, help="a regis index whose tokens seed the collection")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--add", type=int, default=200, help="images added for the incremental run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="FAISS threads (default: every core)")
    p.add_argument("--work", default="/tmp/regis-dup-scale")
    p.add_argument("--files-index", help="an index whose files exist (the labelled set's): a full run with the "
                   "shipped thresholds on a copy of it measures verification's rates")
    p.add_argument("--target-n", type=int, default=100_000)
    p.add_argument("--compare-join", help="also time the self-join alone on the same index, image by image and "
                   "vectorised with each of these query batches (e.g. 256,1024)")
    p.add_argument("--rates", help="verification's wall rates for the estimate when no --files-index run measures "
                   "them: FEATURE_MS,MATCH_MS,LOCATE_MS,LOCATED_SHARE (ms per feature extraction, per pair "
                   "matched in full, per pair searched by template; share of verified pairs searched by template)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", dest="overrides",
                   help="a setting or threshold instead of the shipped one (e.g. neighbours=8), repeatable")
    p.add_argument("--json")
    args = p.parse_args()

    from regis.duplicates.config import DuplicateConfig, parse_overrides, shipped_calibration
    from regis.models.registry import DEFAULT_BACKBONE

    load0 = os.getloadavg()[0]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    real = real_tokens(Path(args.real))
    db = collection(real, args.n + args.add, args.seed)
    index = work / f"index-{args.n}"
    built = write_index(index, db[:args.n])
    print(f"index of {args.n} images built in {built['build_s']:.0f} s ({built['faiss']})", file=sys.stderr)
    config = (shipped_calibration(DEFAULT_BACKBONE) or DuplicateConfig()).model_copy(update={"calibration": None})
    config = config.with_overrides(parse_overrides(args.overrides))
    measured = None
    if args.files_index:  # first: verification's rates, with real files
        measured = measured_run_with_files(Path(args.files_index), work, config)
        print(f"run with files: {measured}", file=sys.stderr)
    full = run_once(index, config, args.threads, plan=True)
    print(f"full self-join: {full}", file=sys.stderr)
    compared = (join_compare(index, config, args.threads, [int(x) for x in args.compare_join.split(",")])
                if args.compare_join else None)
    added_s = add_images(index, db[args.n:])
    inc = run_once(index, config, args.threads)
    inc["add_commit_s"] = added_s
    print(f"incremental: {inc}", file=sys.stderr)
    out = {"command": " ".join(["python -m bench.duplicates", *sys.argv[1:]]), "real_images": int(len(real)),
           "n": args.n, "index": built, "config": config.model_dump(exclude={"calibration"}), "full": full,
           "incremental": inc, "machine": machine_info(), "loadavg_1m_at_start": load0,
           "loadavg_1m_at_end": os.getloadavg()[0]}
    if compared is not None:
        out["join_compare"] = compared
    if measured is None and args.rates:
        f, m, loc, share = (float(x) for x in args.rates.split(","))
        out["estimate"] = estimate_at_rates(full, {"feature_ms": f, "match_ms": m, "locate_ms": loc,
                                                   "located_share": share}, args.n, args.target_n)
        print(f"{args.target_n} images: {out['estimate']['total_min']:.1f} min ({out['estimate']['what']}; rates "
              f"given: {args.rates})", file=sys.stderr)
    if measured is not None:
        out["with_files"] = measured
        out["estimate"] = estimate(full, measured, args.n, args.target_n)
        out["estimate"]["dense"] = dense_bound(out["estimate"], measured, args.target_n)
        print(f"{args.target_n} images: {out['estimate']['total_min']:.1f} min ({out['estimate']['what']}); "
              f"as dense as the labelled set: {out['estimate']['dense']['total_min']:.1f} min", file=sys.stderr)
    print_json(out, args.json)


if __name__ == "__main__":
    main()
