"""The bounded method's extra images, re-scored two ways, on one index: ``Searcher.rank_extra`` (float16 for the
codes' best refine x k only, today's rule) against the index's share rule (``refine_share`` x extras, the rule
before ``rank_extra``), alternated ``--reps`` times in one process, on one thread: recall@10 of the exact ranking
(``bench.million``'s cached ground truth), p50 / p99 / mean ms of the whole ``Searcher.search``, and how many
extras the queries had::

    python -m bench.extras_share --index $REGIS_BENCH_DATA/idx/tok1m-regis-1000000-auto-default-servable \\
        --source $REGIS_BENCH_DATA/tok1m-regis --gt $REGIS_BENCH_DATA/gt-tok1m-regis-1000000x300.npz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import latency_stats, print_machine, recall_at_k, timed_searches


def run(searcher, queries: np.ndarray, gt: np.ndarray, k: int) -> dict:
    """recall@k against ``gt`` (Q, >= k) and the p50 / p99 / mean ms of each ``search`` call (``bench.common``)."""
    seconds, found, _ = timed_searches(searcher, queries, k)
    return {"recall@10": recall_at_k(found, gt, k), **latency_stats(seconds)}


def main() -> None:
    import faiss
    import torch

    from bench.data import load_corpus
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--source", type=Path, required=True, help="the bench.corpus1m folder (its queries)")
    p.add_argument("--gt", type=Path, required=True, help="bench.million's gt-*.npz for these queries")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    print_machine({"bench": "extras_share", "index": str(args.index)})
    _, q = load_corpus(source=str(args.source))
    q = np.asarray(q[: args.queries], dtype=np.float32)
    gt = np.load(args.gt)["ids"][: len(q)]
    snap = IndexSnapshot.open(args.index)
    searcher = Searcher(snap)
    extras = []
    rank_extra = searcher.rank_extra
    searcher.rank_extra = lambda query, extra, k: (extras.append(len(extra)), rank_extra(query, extra, k))[1]
    for x in q:  # warm: page cache, FAISS and torch first calls; counts the extras
        searcher.search(x, k=10)
    counts = np.array(extras + [0] * (len(q) - len(extras)))
    share_rule = lambda query, extra, k: searcher._rank(query, extra, k)  # noqa: E731 - the index's share
    rows = {"rank_extra (refine x k)": [], f"share {searcher.refine_share}": []}
    for _ in range(args.reps):
        searcher.rank_extra = rank_extra
        rows["rank_extra (refine x k)"].append(run(searcher, q, gt, 10))
        searcher.rank_extra = share_rule
        rows[f"share {searcher.refine_share}"].append(run(searcher, q, gt, 10))
    out = {"index": str(args.index), "queries": len(q), "extras_mean": float(counts.mean()),
           "extras_p50_p90_p99": np.percentile(counts, [50, 90, 99]).tolist(),
           "queries_with_extras": float((counts > 0).mean()), "rows": rows}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    snap.close()


if __name__ == "__main__":
    main()
