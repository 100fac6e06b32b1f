"""Recall@10 and one-thread p50 of one index at several search depths of its HNSW coarse quantizer (issue 24).

The depth is ``regis.indexes.faiss_index.QUANTIZER_EF_SEARCH`` (passed per call as max(it, nprobe)); this script
sets it per row, then runs ``bench.million.sweep`` (the same queries and exact top-10 as ``bench.million``).

Usage::

    python -m bench.quantizer_ef --index $REGIS_BENCH_DATA/idx/tok1m-256-1000000-auto-default-servable \
        --source $REGIS_BENCH_DATA/tok1m-256 --n 1000000 --ef 64,128,256 --sweep "32:64:16:0.4,48:64:16:0.4"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import print_machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--source", type=Path, required=True)
    p.add_argument("--n", type=int, required=True, help="images in the index (the first n of --source)")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--ef", default="64,128,256", help="quantizer search depths, comma list")
    p.add_argument("--sweep", default="32:64:16:0.4,48:64:16:0.4", help="bench.million --sweep rows")
    args = p.parse_args()
    import faiss
    import torch

    from bench.data import ground_truth
    from bench.million import corpus_slice, sweep
    from regis.indexes import faiss_index
    from regis.indexes.snapshot import IndexSnapshot

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    print_machine({"bench": "quantizer_ef", "index": args.index.name})
    db, q, tag = corpus_slice(args.source, args.n, "first")
    q = q[: args.queries]
    gt, _ = ground_truth(db, q, tag)  # cached by bench.million / bench.search; computed here if missing
    snap = IndexSnapshot.open(args.index)
    try:
        sweep(snap, q, gt, 10, args.sweep.split(",")[0])  # warm-up: pages in, caches filled
        for ef in (int(x) for x in args.ef.split(",")):
            faiss_index.QUANTIZER_EF_SEARCH = ef
            for row in sweep(snap, q, gt, 10, args.sweep):
                print("row:", json.dumps({"quantizer_ef_search": ef, **row}), flush=True)
    finally:
        snap.close()


if __name__ == "__main__":
    main()
