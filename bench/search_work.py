"""Search work per query on ``bench.service``'s serving indexes: candidates reranked and CPU time of the batched
search path (``Searcher.search_batch`` in batches of 4, 1 FAISS thread, 1 torch thread: what the batched server's
search thread does), for the bench's photo queries encoded by each index's own encoder (15 tokens for today's
two-pass default, 10 for the one-pass variant). No HTTP, no encoding in the timed part.

Usage::

    python -m bench.search_work --n-db 10000 --tokens synthetic,corpus --variants default,one-pass
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.common import print_machine


def measure(index, repeats: int = 5, batch: int = 4) -> dict:
    """Candidates per query (mean, min, max) and search CPU ms per query of ``index`` for 16 photo queries."""
    import torch

    from bench.indexing import JPEG_DIR, make_photos
    from regis.retrieve.query import QueryEngine
    from regis.retrieve.searcher import Searcher

    torch.set_num_threads(1)
    make_photos(64)
    engine = QueryEngine.open(index)
    queries = np.stack([engine.encode_bytes(f.read_bytes())[0]
                        for f in sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]])
    searcher = Searcher(engine.snapshot)
    n = [r.num_candidates for r in searcher.search_batch(queries, k=10, threads=1)]
    t0 = time.process_time()
    for _ in range(repeats):
        for b in range(0, len(queries), batch):
            searcher.search_batch(queries[b : b + batch], k=10, threads=1)
    cpu_ms = (time.process_time() - t0) / (repeats * len(queries)) * 1e3
    return {"query_tokens": int(queries.shape[1]), "candidates_mean": float(np.mean(n)), "candidates_min": min(n),
            "candidates_max": max(n), "search_cpu_ms_per_query": round(cpu_ms, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-db", type=int, default=10_000)
    p.add_argument("--tokens", default="synthetic,corpus")
    p.add_argument("--variants", default="default,one-pass")
    args = p.parse_args()
    from bench.service import build_index

    print_machine({"bench": "search_work", "n_db": args.n_db})
    for tokens in args.tokens.split(","):
        for variant in args.variants.split(","):
            index = build_index(args.n_db, tokens, variant)
            print("row:", json.dumps({"tokens": tokens, "variant": variant, **measure(index)}), flush=True)


if __name__ == "__main__":
    main()
