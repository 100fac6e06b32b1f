"""How long the duplicates self-join takes on a large collection (issue 26, item 2: 100k images in under 30 min).

The collection: the real tokens of an index built by the encoder (``--real``: e.g. the labelled near-duplicate
set of ``scripts/eval_duplicates.py``, 2,592 real-photo images with the default encoder), then images generated
from them as ``bench.corpus1m`` does (each a token-by-token mix of two real images that are neighbours: the real
neighbourhood and near-duplicate structure, no new content) up to ``--n`` images, written into a regis index with
the writer's default FAISS setting (``bench.data.build_index``, a distinct SHA-256 per image). Generated images
have no files, so the run measures the self-join (every image's tokens searched, both-way exact MaxSim of the
candidates, pairs above the floor), the exact-copy check and the grouping; geometric verification (ORB + MAGSAC on
the files of each candidate pair) is priced separately from a run that had files (``--verify-from``: the JSON of
``scripts/eval_duplicates.py``: ms per verified pair, candidate pairs per image), and the total for 100k images
is an extrapolation from these measured rates, labelled as such.

Then an incremental run: ``--add`` more generated images are committed and only they are searched.

Usage::

    python -m bench.duplicates --real /work/cache/dup-eval/debian-s0/index --n 20000 \\
        --work /tmp/regis-dup-scale --verify-from docs/results/duplicates/debian.json \\
        --json docs/results/duplicates/scale-20k.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import machine_info


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


def write_index(path: Path, db: np.ndarray) -> dict:
    """A regis index of ``db`` (writer defaults; distinct SHA-256 per image, no files); returns timings (s)."""
    from bench.data import bench_encoder
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    if path.exists():
        shutil.rmtree(path)
    config, weights = bench_encoder(db.shape[2], db.shape[1])
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
    from bench.data import bench_encoder
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    config, weights = bench_encoder(db.shape[2], db.shape[1])
    t0 = time.perf_counter()
    with IndexWriter(path, config, weights) as w:  # on the current version: adds
        ids = w.allocate_ids(len(db))
        w.put([ImageRecord(int(i), f"img/{i}.jpg", f"{i:064x}", 640, 480, 1, 0.0) for i in ids], db)
        w.commit()
    return time.perf_counter() - t0


def run_once(index: Path, config, threads: int | None) -> dict:
    """One ``update_pairs`` (no files: no verification) + grouping; its figures."""
    from regis.duplicates.finder import update_pairs
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
                "group_ms": (t2 - t1) * 1e3, "wall_s": t2 - t0, "cpu_s": time.process_time() - cpu0,
                "duplicate_groups": grouping.counts()["duplicate_groups"],
                "images_per_s": run.searched / max(1e-9, run.timings_ms["join"] / 1e3)}
    finally:
        snap.close()


def verification_rates(path: Path) -> dict:
    """ms per candidate pair (exact check + verification, files decoded on ``cores`` threads) and candidate pairs
    per image, from an ``eval_duplicates.py`` JSON."""
    d = json.loads(path.read_text())
    run = d["run"]
    images, pairs = d["images"], run["candidate_pairs"]
    t = run["timings_ms"]
    return {"source": str(path), "images": images, "candidate_pairs": pairs, "pairs_per_image": pairs / images,
            "verify_ms": t["verify"], "exact_ms": t["exact"], "join_ms": t["join"],
            "ms_per_pair": (t["verify"] + t["exact"]) / max(1, pairs), "note": d["run"].get("note", "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", required=True, help="a regis index whose tokens seed the collection")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--add", type=int, default=200, help="images added for the incremental run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="FAISS threads (default: every core)")
    p.add_argument("--work", default="/tmp/regis-dup-scale")
    p.add_argument("--verify-from", help="eval_duplicates.py JSON to price verification from")
    p.add_argument("--target-n", type=int, default=100_000)
    p.add_argument("--json")
    args = p.parse_args()

    from regis.duplicates.config import DuplicateConfig, shipped_calibration
    from regis.models.registry import DEFAULT_BACKBONE

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    real = real_tokens(Path(args.real))
    db = collection(real, args.n + args.add, args.seed)
    index = work / f"index-{args.n}"
    built = write_index(index, db[:args.n])
    print(f"index of {args.n} images built in {built['build_s']:.0f} s ({built['faiss']})", file=sys.stderr)
    config = (shipped_calibration(DEFAULT_BACKBONE) or DuplicateConfig()).model_copy(update={"calibration": None})
    full = run_once(index, config, args.threads)
    print(f"full self-join: {full}", file=sys.stderr)
    added_s = add_images(index, db[args.n:])
    inc = run_once(index, config, args.threads)
    inc["add_commit_s"] = added_s
    print(f"incremental: {inc}", file=sys.stderr)
    out = {"command": " ".join(["python -m bench.duplicates", *sys.argv[1:]]), "real_images": int(len(real)),
           "n": args.n, "index": built, "config": config.model_dump(exclude={"calibration"}), "full": full,
           "incremental": inc, "machine": machine_info(), "loadavg_1m_at_end": os.getloadavg()[0]}
    if args.verify_from:
        rates = verification_rates(Path(args.verify_from))
        n = args.target_n
        join_s = n / full["images_per_s"]
        pairs = rates["pairs_per_image"] * n
        verify_s = pairs * rates["ms_per_pair"] / 1e3
        out["extrapolation"] = {
            "what": f"NOT MEASURED at {n}: the self-join at the rate measured at {args.n} images (per image rate "
                    "held constant: the IVF lists grow with n, so this is a lower bound for the join) plus "
                    "verification at the labelled set's pairs per image and ms per pair",
            "images": n, "join_s": join_s, "candidate_pairs": pairs, "verify_s": verify_s,
            "total_min": (join_s + verify_s) / 60, "rates": rates}
        print(f"extrapolated to {n}: {out['extrapolation']['total_min']:.1f} min", file=sys.stderr)
    text = json.dumps(out, indent=1, default=float)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
