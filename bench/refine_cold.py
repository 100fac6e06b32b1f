"""How many float16 rows the rerank re-scores, with the float16 segments out of the page cache (issue 24).

The searcher re-scores ``max(refine x k, refine_share x candidates)`` of the candidates the SQ4 codes ranked on the
float16 tokens on disk (``Searcher.refine_rows``). When those rows are not in the page cache (a collection larger
than the cache, or a fresh server) every row is a read. This opens each ``--index`` (built by ``bench.million``),
and for each ``--shares`` value in turn, ``--rounds`` times alternated: drops the segment files' pages
(``posix_fadvise DONTNEED``, ``bench.million.evict``), runs the corpus's queries one by one on one thread, and
prints their cold p50 / p99 ms and recall@10 against the cached exact top-10 (``bench.data.ground_truth``'s file).

Usage::

    python -m bench.refine_cold --index $REGIS_BENCH_DATA/idx/tok1m-regis-1000000-auto-default-servable \\
        --source $REGIS_BENCH_DATA/tok1m-regis --shares 0.4,0.0 --rounds 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import gt_path, latency_stats, print_machine, recall_at_k, timed_searches


def cold_rows(index: Path, source: Path, shares: list[float], rounds: int, queries: int, k: int = 10) -> list[dict]:
    """One row per (round, share): cold p50 / p99 ms and recall@10 (see module docstring)."""
    import faiss
    import torch

    from bench.million import evict
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    q = np.load(source / "q.npy")[:queries]
    snap = IndexSnapshot.open(index)
    gt = np.load(gt_path(source.name, snap.manifest.num_images, len(q)))["ids"]
    segments = [index / "segments" / s.file for s in snap.manifest.segments]
    rows = []
    for rnd in range(rounds):
        for share in shares:
            searcher = Searcher(snap, refine_share=share)
            evict(segments)
            lat, found, _ = timed_searches(searcher, q, k)
            st = latency_stats(lat)
            rows.append({"index": index.name, "round": rnd, "refine_share": share, "cold_p50_ms": st["p50_ms"],
                         "cold_p99_ms": st["p99_ms"], "recall@10": recall_at_k(found, gt, k)})
            print("row:", json.dumps(rows[-1]), flush=True)
    snap.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, action="append", required=True, help="a bench.million index (repeatable)")
    p.add_argument("--source", type=Path, action="append", required=True, help="its corpus (one per --index)")
    p.add_argument("--shares", default="0.4,0.0", help="refine_share values, alternated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--queries", type=int, default=300)
    args = p.parse_args()
    if len(args.index) != len(args.source):
        raise SystemExit("give one --source per --index")
    print_machine({"bench": "refine_cold"})
    for index, source in zip(args.index, args.source, strict=True):
        cold_rows(index, source, [float(x) for x in args.shares.split(",")], args.rounds, args.queries)


if __name__ == "__main__":
    main()
