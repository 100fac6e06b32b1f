"""Candidate methods (issue 15): recall@10 of the exact MaxSim ranking and single-query latency, one run.

For each corpus (``--sources``, ';'-separated):

- ``shared:DIR``: a ``bench.shared`` corpus (many images share near-identical tokens);
- ``real:DIR``: a real-token corpus folder of ``bench.corpus`` + ``bench.project`` (``info.json``,
  ``db384.f16``, ``q384.npy``);

it builds (or reuses, under ``$REGIS_BENCH_DATA/idx``) a regis index with regis's defaults, computes the exact
top-10 (``bench.data.ground_truth``, cached), then runs every method of ``--methods`` on every query
(``method:depth``, e.g. ``depth:64`` = regis before issue 15, ``bounded:64`` = the default now), one query at a
time on one thread, the methods interleaved query by query so the load of a shared machine falls on all of
them alike. It prints one ``row:`` JSON line per (corpus, method), a markdown table, and ``check:`` lines for
issue 15's targets: recall@10 >= 0.99 with the defaults on every corpus, and the default's p50 no more than 2x
``depth:64``'s on the real corpus. ``--exact N`` also times regis's exact mode (every image scored) on N queries,
the cost the candidates avoid.

Usage::

    python -m bench.candidates --sources "shared:$REGIS_BENCH_DATA/shared100k;real:$REGIS_BENCH_DATA/corpus" \\
        --methods "depth:64;depth:256;bounded:64;bounded:32" --exact 20
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, DATA_DIR, latency_stats, print_machine, recall_at_k

DEFAULT_METHOD = "bounded:64"  # regis's defaults now (candidates "bounded", depth 64)
BEFORE_METHOD = "depth:64"  # regis's defaults before issue 15


def load_source(source: str, n_queries: int | None) -> tuple[str, str, np.ndarray, np.ndarray]:
    """(kind, tag, db (N, T, D) float16 memmap, queries (Q, T, D) float32) of ``kind:DIR``."""
    kind, _, folder = source.partition(":")
    root = Path(folder)
    info = json.loads((root / "info.json").read_text())
    if kind == "shared":
        shape = (info["db"], info["tokens"], info["dim"])
        db = np.memmap(root / "db.f16", dtype=np.float16, mode="r", shape=shape)
        q = np.load(root / "q.npy")
    elif kind == "real":
        dim = 384
        db = np.memmap(root / f"db{dim}.f16", dtype=np.float16, mode="r",
                       shape=(info["db"], info["tokens_per_image"], dim))
        q = np.load(root / f"q{dim}.npy")
    else:
        raise SystemExit(f"unknown source kind {kind!r} (shared:DIR or real:DIR)")
    # the tags of bench.search, so both scripts share the cached ground truth and indexes
    tag = root.name if kind == "shared" else "fmnist" if root == CORPUS_DIR else f"fmnist-{root.parent.name}"
    return kind, tag, db, q[:n_queries]


def parse_methods(spec: str) -> list[tuple[str, int]]:
    """"depth:64;bounded:64" -> [("depth", 64), ("bounded", 64)]."""
    out = []
    for part in spec.split(";"):
        name, _, depth = part.partition(":")
        out.append((name, int(depth)))
    return out


def measure(searcher, q: np.ndarray, gt: np.ndarray, methods: list[tuple[str, int]], k: int = 10) -> list[dict]:
    """Single-query search of every query by every method, interleaved; returns one result dict per method."""
    found = {m: np.full((len(q), k), -1, dtype=np.int64) for m in methods}
    lat = {m: [] for m in methods}
    cands = {m: [] for m in methods}
    for name, depth in methods:  # warm-up
        searcher.search(q[0], k=k, depth=depth, candidates=name)
    for i in range(len(q)):
        for m in methods:
            t0 = time.perf_counter()
            r = searcher.search(q[i], k=k, depth=m[1], candidates=m[0])
            lat[m].append(time.perf_counter() - t0)
            found[m][i, : len(r.ids)] = r.ids
            cands[m].append(r.num_candidates)
    rows = []
    for m in methods:
        row = {"method": m[0], "depth": m[1], "recall@10": recall_at_k(found[m], gt, k),
               "candidates_mean": float(np.mean(cands[m])), "candidates_p99": float(np.percentile(cands[m], 99)),
               **latency_stats(lat[m]), "single_qps": len(q) / sum(lat[m])}
        if m[0] == "bounded" and ("depth", m[1]) in methods:  # share of queries the range search added images to
            row["queries_with_range_search"] = float(np.mean(np.asarray(cands[m]) > np.asarray(cands[("depth", m[1])])))
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sources", required=True, help="';'-separated shared:DIR / real:DIR")
    p.add_argument("--methods", default="depth:64;depth:256;bounded:64;bounded:32")
    p.add_argument("--n-queries", type=int, default=None)
    p.add_argument("--exact", type=int, default=0, help="also time exact mode on this many queries")
    p.add_argument("--threads", type=int, default=1, help="torch and FAISS threads")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import faiss
    import torch

    from bench.data import build_index, ground_truth
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    methods = parse_methods(args.methods)
    print_machine({"bench": "candidates", "sources": args.sources, "methods": args.methods})
    rows = []
    for source in args.sources.split(";"):
        kind, tag, db, q = load_source(source, args.n_queries)
        gt, gt_s = ground_truth(db, q, tag)
        print(f"{tag}: {len(db)} images, {len(q)} queries; exact top-10 in {gt_s:.1f} s", flush=True)
        path = DATA_DIR / "idx" / f"{tag}-{len(db)}-auto-float16"
        built = None
        if not (path / "CURRENT").exists():
            built = build_index(path, db)
            print("built:", json.dumps({"index": path.name, **built}), flush=True)
        snap = IndexSnapshot.open(path)
        searcher = Searcher(snap)
        info = {"corpus": tag, "kind": kind, "images": len(db), "queries": len(q), "spec": snap.manifest.faiss.spec,
                "nprobe": snap.manifest.faiss.nprobe, "load_1m_before": round(os.getloadavg()[0], 2)}
        for r in measure(searcher, q, gt, methods):
            row = {**info, **r}
            rows.append(row)
            print("row:", json.dumps(row), flush=True)
        if args.exact:
            lat = []
            for i in range(min(args.exact, len(q))):
                t0 = time.perf_counter()
                searcher.search(q[i], k=10, mode="exact")
                lat.append(time.perf_counter() - t0)
            row = {**info, "method": "exact mode", "depth": "-", "recall@10": 1.0, "candidates_mean": float(len(db)),
                   **latency_stats(lat), "single_qps": len(lat) / sum(lat)}
            rows.append(row)
            print("row:", json.dumps(row), flush=True)
        snap.close()
    print("\n| corpus | images | FAISS spec | nprobe | candidates | depth | recall@10 | candidates mean / p99 | "
          "queries with range search | p50 ms | p99 ms | QPS 1-query |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rs = r.get("queries_with_range_search")
        print(f"| {r['corpus']} | {r['images']} | {r['spec']} | {r['nprobe']} | {r['method']} | {r['depth']} | "
              f"{r['recall@10']:.4f} | {r['candidates_mean']:.0f} / {r.get('candidates_p99', r['candidates_mean']):.0f}"
              f" | {'-' if rs is None else f'{rs:.3f}'} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['single_qps']:.1f} |")
    default_name, default_depth = parse_methods(DEFAULT_METHOD)[0]
    before_name, before_depth = parse_methods(BEFORE_METHOD)[0]
    for tag in dict.fromkeys(r["corpus"] for r in rows):
        by = {(r["method"], r["depth"]): r for r in rows if r["corpus"] == tag}
        new, old = by.get((default_name, default_depth)), by.get((before_name, before_depth))
        if new:
            print("check:", json.dumps({"corpus": tag, "default_recall@10": round(new["recall@10"], 4),
                                        "recall_ok": new["recall@10"] >= 0.99}))
        if new and old:  # issue 15 bounds the latency on the real-token corpus only
            ratio = new["p50_ms"] / old["p50_ms"]
            line = {"corpus": tag, "p50_default_ms": round(new["p50_ms"], 2), "p50_before_ms": round(old["p50_ms"], 2),
                    "p50_ratio": round(ratio, 2)}
            if new["kind"] == "real":
                line["p50_ok"] = ratio <= 2.0
            print("check:", json.dumps(line))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
