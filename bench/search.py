"""Search benchmark: QPS and p50/p99 latency against recall@10 of the exact MaxSim ranking.

For each FAISS spec it builds a regis index from the corpus tokens (``bench.data.build_index``: the real
``IndexWriter``), then sweeps nprobe x candidate depth and measures, over the 1,000 queries:

- single-query latency (``Searcher.search``, one query at a time, no encoding): p50, p99, and QPS = 1 / mean;
- batched QPS (``Searcher.search_batch``, ``--batch`` queries per call);
- recall@10: |top-10 & exact top-10| / 10, the exact top-10 from ``bench.data.ground_truth`` (float32 MaxSim
  over every database image).

Before each point (and the exact mode) ``--warmup`` (default 10; 0: none) untimed single-query searches run and
are discarded (``bench.common.warm_up``), so lazy first-call work and cold caches stay out of p50 / p99; each
row records the count (``warmup_queries``).

Rows: one JSON line each (``row:``), then a markdown table. Indexes are cached under
``$REGIS_BENCH_DATA/idx`` (``--rebuild`` to redo; the build time is printed when built).

Usage::

    python -m bench.search --specs "IVF1024,SQ8;IVF4096,SQ8" --nprobes 8,16,32 --depths 32,64,128
    python -m bench.search --source /work/perf-data/synth1m --n-db 1000000   # the 1M run (GPU machine)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import DATA_DIR, latency_stats, print_machine, recall_at_k, timed_searches, warm_up


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def run_point(searcher, q: np.ndarray, gt: np.ndarray, k: int, depth: int | None, nprobe: int | None,
              batch: int, single: bool = True, warmup: int = 10) -> dict:
    """Measure one (depth, nprobe) point: single-query latencies, batched QPS, recall@k, mean candidates.

    ``warmup`` untimed single-query searches come first (``bench.common.warm_up``: the first queries of ``q``,
    results discarded), in none of the figures; the row records the count (``warmup_queries``).

    Raises:
        ValueError: ``warmup`` < 0.
    """
    found = np.full((len(q), k), -1, dtype=np.int64)
    lat = []
    if single:
        lat, found, _ = timed_searches(searcher, q, k, warmup=warmup, depth=depth, nprobe=nprobe)
    else:
        warm_up(searcher, q, warmup, k, depth=depth, nprobe=nprobe)
    t0 = time.perf_counter()
    batched = []
    for start in range(0, len(q), batch):
        batched += searcher.search_batch(q[start : start + batch], k=k, depth=depth, nprobe=nprobe)
    batch_s = time.perf_counter() - t0
    bfound = np.full((len(q), k), -1, dtype=np.int64)
    for i, r in enumerate(batched):
        bfound[i, : len(r.ids)] = r.ids
    out = {"recall@10": recall_at_k(found if single else bfound, gt, k),
           "batched_qps": len(q) / batch_s, "batched_recall@10": recall_at_k(bfound, gt, k),
           "candidates": float(np.mean([r.num_candidates for r in batched])), "warmup_queries": warmup}
    if single:
        out.update(latency_stats(lat))
        out["single_qps"] = len(q) / sum(lat)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default="fmnist", help="fmnist, or a bench.synth output folder")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--n-db", type=int, default=None)
    p.add_argument("--n-queries", type=int, default=1000)
    p.add_argument("--specs", default="auto", help="FAISS specs separated by ';' ('auto' = regis's choice)")
    p.add_argument("--token-store", default=None, help="token store of the built indexes (float16, PQ96, ...)")
    p.add_argument("--nprobes", default="", help="comma list; empty = the manifest default")
    p.add_argument("--depths", default="", help="comma list; empty = the manifest default")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--exact", action="store_true", help="also time regis's exact mode (brute force)")
    p.add_argument("--no-single", action="store_true", help="batched QPS only (faster sweeps)")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch and FAISS threads (default: all cores)")
    p.add_argument("--search-threads", type=int, default=None,
                   help="FAISS threads of one query's candidate search (default: regis's, 1; 0 = every core)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed single-query searches before each timed sweep point and the exact mode, "
                        "recorded as warmup_queries (0: none)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = p.parse_args()
    if args.warmup < 0:
        p.error(f"--warmup {args.warmup}: it must be >= 0")

    import faiss
    import torch

    from bench.data import build_index, ground_truth, load_corpus
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    if args.threads:
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    db, q = load_corpus(args.dim, args.n_db, args.n_queries, args.source)
    tag = "fmnist" if args.source == "fmnist" else Path(args.source).name
    print_machine({"bench": "search", "source": tag, "db_images": len(db), "queries": len(q),
                   "tokens": db.shape[1], "dim": db.shape[2], "warmup_queries": args.warmup})
    gt, gt_s = ground_truth(db, q, tag)
    print(f"ground truth: exact float32 MaxSim over {len(db)} images, {gt_s:.1f} s for {len(q)} queries", flush=True)
    rows = []
    for spec in args.specs.split(";"):
        name = f"{tag}-{len(db)}-{spec.replace(',', '_')}-{args.token_store or 'float16'}"
        path = DATA_DIR / "idx" / name
        built = None
        if args.rebuild or not (path / "CURRENT").exists():
            built = build_index(path, db, None if spec == "auto" else spec, token_store=args.token_store)
            print("built:", json.dumps({"index": name, **built}), flush=True)
        snap = IndexSnapshot.open(path)
        searcher = Searcher(snap) if args.search_threads is None else Searcher(
            snap, search_threads=args.search_threads or None)
        m = snap.manifest
        nprobes = _ints(args.nprobes) or [None]
        depths = _ints(args.depths) or [None]
        for nprobe in nprobes:
            if nprobe is not None and faiss.try_extract_index_ivf(snap.faiss) is None and nprobe != nprobes[0]:
                continue  # nprobe means nothing to a Flat / HNSW index
            for depth in depths:
                res = run_point(searcher, q, gt, args.k, depth, nprobe, args.batch, single=not args.no_single,
                                warmup=args.warmup)
                row = {"system": "regis", "spec": m.faiss.spec, "token_store": m.token_store.spec,
                       "nprobe": nprobe or m.faiss.nprobe, "depth": depth or m.faiss.depth, **res}
                if built:
                    row["build_s"] = built["build_s"]
                rows.append(row)
                print("row:", json.dumps(row), flush=True)
        if args.exact:
            lat, _, _ = timed_searches(searcher, q[:50], args.k, warmup=args.warmup, mode="exact")
            row = {"system": "regis exact mode", "spec": "-", "token_store": "float16", "nprobe": "-",
                   "depth": "-", "recall@10": 1.0, **latency_stats(lat), "single_qps": len(lat) / sum(lat),
                   "warmup_queries": args.warmup}
            rows.append(row)
            print("row:", json.dumps(row), flush=True)
        snap.close()
    print("\n| system | FAISS spec | store | nprobe | depth | candidates | recall@10 | p50 ms | p99 ms | QPS 1-query "
          "| QPS batched |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(key, fmt, r=r):
            return format(r[key], fmt) if isinstance(r.get(key), (int, float)) else "-"
        print(f"| {r['system']} | {r['spec']} | {r['token_store']} | {r['nprobe']} | {r['depth']} | "
              f"{f('candidates', '.0f')} | {f('recall@10', '.4f')} | {f('p50_ms', '.2f')} | {f('p99_ms', '.2f')} | "
              f"{f('single_qps', '.0f')} | {f('batched_qps', '.0f')} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
