"""Filtered search latency at 100k images: no filter, a filter keeping 1% of the images, one keeping 50%.

The index is a hard-linked copy of a 100k benchmark index (``bench.data.build_index``; segments are immutable,
so the copy costs no disk), given metadata ``{"pct": id % 100, "half": id % 2 == 0}`` as one new version
(``IndexWriter.update_records``: tokens untouched). For each filter the script reports the latency of
``QueryEngine.search_tokens`` (query tokens given: no encoder) over ``--queries`` queries: mean / p50 / p99 ms,
with the allowed-id set cached (the steady state: one SQL pass per index version and filter), plus the cold
SQL time of the filter (JSON1 over every row). It also checks that every filtered search returns k results that
all pass the filter, and reports recall@k against exact MaxSim over the allowed set for ``--exact`` queries.

Usage::

    nice -n 10 python -m bench.filters --index $REGIS_BENCH_DATA/idx/shared100k-100000-auto-float16 \\
        --queries-file $REGIS_BENCH_DATA/shared100k/q.npy --work /tmp/regis-bench-filters --threads 1

or, from a ``bench.shared`` corpus folder (its index is built with regis's defaults under
``$REGIS_BENCH_DATA/idx`` when absent, the one ``bench.candidates`` builds; queries from its ``q.npy``)::

    python -m bench.filters --source $REGIS_BENCH_DATA/shared100k --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from bench.common import latency_stats, print_machine

FILTERS = {"none": None, "1%": {"pct": 7}, "50%": {"half": True}}


def prepare(src: Path, work: Path) -> Path:
    """A hard-linked copy of ``src`` with the benchmark metadata (reused when already there)."""
    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    index = work / "index"
    if (work / "ready").is_file():
        return index
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src), str(index)], check=True)
    snap = IndexSnapshot.open(index)
    manifest = snap.manifest
    records = list(snap.table.iter_all())
    snap.close()
    with IndexWriter(index, manifest.encoder, manifest.weights) as w:
        w.update_records([ImageRecord(r.id, r.path, r.sha256, r.width, r.height, r.bytes, r.mtime,
                                      {"pct": r.id % 100, "half": r.id % 2 == 0}) for r in records])
        w.commit()
    (work / "ready").write_text("ok\n")
    return index


def index_of_source(source: Path) -> tuple[Path, Path]:
    """(index, queries file) of a ``bench.shared`` corpus folder; builds the index (regis's defaults) if absent."""
    from bench.common import DATA_DIR
    from bench.data import build_index

    info = json.loads((source / "info.json").read_text())
    path = DATA_DIR / "idx" / f"{source.name}-{info['db']}-auto-float16"
    if not (path / "CURRENT").exists():
        db = np.memmap(source / "db.f16", dtype=np.float16, mode="r", shape=(info["db"], info["tokens"], info["dim"]))
        print("built:", json.dumps({"index": str(path), **build_index(path, db)}), flush=True)
    return path, source / "q.npy"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, help="a 100k benchmark index (not modified)")
    ap.add_argument("--queries-file", type=Path, help="(Q, m, D) float32 query tokens (.npy)")
    ap.add_argument("--source", type=Path, help="instead of --index/--queries-file: a bench.shared corpus folder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/regis-bench-filters"))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--exact", type=int, default=5, help="queries checked against exact scoring (filtered)")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--filters", default=",".join(FILTERS), help="which rows: none,1%%,50%%")
    ap.add_argument("--candidates", default=None, help="candidate method (bounded, depth); default: the index's")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from regis.indexes.filters import compile_filter
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.filtered import allowed_ids, exact_over
    from regis.retrieve.query import QueryEngine
    from regis.retrieve.searcher import Searcher

    if args.source:
        args.index, args.queries_file = index_of_source(args.source)
    elif not (args.index and args.queries_file):
        ap.error("give --source, or --index and --queries-file")
    machine = print_machine({"threads": args.threads})
    index = prepare(args.index, args.work)
    q = np.load(args.queries_file)[: args.queries].astype(np.float32)
    snap = IndexSnapshot.open(index)
    engine = QueryEngine.__new__(QueryEngine)  # search_tokens needs only the searcher (no encoder)
    engine.searcher = Searcher(snap, search_threads=1, candidates=args.candidates)
    rows = []
    for label, where in FILTERS.items():
        if label not in args.filters.split(","):
            continue
        cold_ms = None
        n_allowed = len(snap)
        if where is not None:
            sql, params = compile_filter(where)
            t0 = time.perf_counter()
            n_allowed = len(snap.table.ids_where(sql, params))
            cold_ms = (time.perf_counter() - t0) * 1e3
            allowed = allowed_ids(snap, where)  # warm the per-version cache
        for query in q[:3]:  # warm-up
            engine.search_tokens(query, k=args.k, where=where)
        times, ok, scored, depths = [], True, [], set()
        for query in q:
            t0 = time.perf_counter()
            result = engine.search_tokens(query, k=args.k, where=where)
            times.append(time.perf_counter() - t0)
            scored.append(result["num_candidates"])
            depths.add(result["depth"])
            ids = [h["id"] for h in result["results"]]
            ok &= len(ids) == args.k
            if where is not None:
                ok &= bool(np.isin(ids, allowed).all())
        recall = None
        if args.exact:
            pool = allowed if where is not None else snap.store.live_ids
            hits = 0
            checked = q[: args.exact]  # at most --queries of them
            for query in checked:
                want, _ = exact_over(engine.searcher, query, pool, args.k)
                got = [h["id"] for h in engine.search_tokens(query, k=args.k, where=where)["results"]]
                hits += len(set(got) & set(want.tolist()))
            recall = hits / (args.k * len(checked))
        stats = latency_stats(times)
        row = {"filter": label, "allowed": n_allowed, "queries": len(q), "candidates": engine.searcher.candidate_method,
               "first_depth": sorted(depths), "scored_mean": float(np.mean(scored)), **stats, "sql_cold_ms": cold_ms,
               "k_results_all_pass": ok, f"recall@{args.k}_vs_exact_over_allowed": recall}
        rows.append(row)
        print(json.dumps(row))
    snap.close()
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
