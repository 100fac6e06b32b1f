"""Where one query's milliseconds go: regis's single-query search on one thread, stage by stage (issue 24).

Opens an index built by ``bench.million`` (or any regis index), runs the first ``--queries`` queries of a
``bench.corpus1m`` corpus once to warm the page cache, then again with a timer around each stage of
``Searcher.search`` (the same calls the searcher makes, in the same order, with the index's defaults):

- ``faiss``: FAISS's ``depth`` nearest token vectors of each query token (IVF coarse search + list scan; with
  ``k_factor`` > 1, its ``k_factor x depth`` nearest);
- ``token_sims``: with ``k_factor`` > 1, those neighbours re-ranked on the compressed store's codes to the best
  ``depth`` (``CodeStore.token_sims``; 0 otherwise);
- ``live``: token ids -> unique live image ids (the candidates);
- ``codes``: MaxSim of the query against every candidate on the compressed store (SQ4), and the top
  ``refine_rows``;
- ``f16_read``: reading those rows' float16 tokens (``pread``);
- ``f16_maxsim``: their exact MaxSim and the top k;
- ``bounded``: the bounded method's check, and its range search when one is needed;
- ``codes_decoded`` (not part of the search; for comparison): the same candidates scored the way the searcher
  did before issue 24's SQ4 kernel, FAISS ``sa_decode`` to float32 tokens and a torch GEMM;

and ``total`` the whole ``Searcher.search`` call timed separately (so Python overhead between stages shows as
``total`` minus the sum). Prints the median ms of each stage and the share of the total, as JSON.

Usage::

    python -m bench.profile_search --index $REGIS_BENCH_DATA/idx/tok1m-256-100000-auto-default \\
        --source $REGIS_BENCH_DATA/tok1m-256 --queries 300
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import print_machine


def profile(index: Path, source: Path, queries: int, k: int) -> dict:
    """Median ms per stage over the queries (see module docstring)."""
    import faiss
    import torch

    from bench.data import load_corpus
    from regis.indexes import faiss_index
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve import candidates as cands
    from regis.retrieve.searcher import Searcher, top_k

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    _, q = load_corpus(source=str(source))
    q = np.asarray(q[:queries], dtype=np.float32)
    snap = IndexSnapshot.open(index)
    s = Searcher(snap)
    depth = s.default_depth
    for x in q:  # warm: page cache, FAISS and torch first calls
        s.search(x, k=k)
    timed = ("faiss", "token_sims", "live", "codes", "f16_read", "f16_maxsim", "bounded")
    stages: dict[str, list[float]] = {n: [] for n in (*timed, "total", "codes_decoded")}
    n_cand, n_rows = [], []
    for x in q:
        t = [time.perf_counter()]
        sims, tok = faiss_index.search(snap.faiss, x, depth * s.k_factor, nprobe=snap.manifest.faiss.nprobe,
                                       threads=s.search_threads)
        t.append(time.perf_counter())
        if s.k_factor > 1:  # as Searcher._neighbours
            sims, tok = s.best_by_codes(x, tok, depth)
        t.append(time.perf_counter())
        cand = s._live_images(tok.reshape(-1))
        t.append(time.perf_counter())
        rows = s.refine_rows(k, len(cand))
        if s.codes is not None and len(cand) > rows:
            keep, _ = top_k(cand, s.rerank_codes(x, cand), rows)
            kept = np.sort(keep)
        else:
            kept = cand
        t.append(time.perf_counter())
        docs = snap.store.get(kept)
        t.append(time.perf_counter())
        ids, scores = top_k(kept, s._maxsim(x, docs), k)
        t.append(time.perf_counter())
        if len(ids) >= k:
            tails, full = cands.list_tails(sims, tok)
            which, _ = cands.range_radius(tails, full, float(scores[-1]))
            if len(which):
                s._bounded_extra(x, sims, tok, cand, float(scores[-1]), None, s.search_threads)
        t.append(time.perf_counter())
        for name, a, b in zip(timed, t[:-1], t[1:], strict=True):
            stages[name].append((b - a) * 1e3)
        t0 = time.perf_counter()
        s.search(x, k=k)
        stages["total"].append((time.perf_counter() - t0) * 1e3)
        if s.codes is not None:
            t0 = time.perf_counter()
            s._maxsim(x, s.codes.get(cand))
            stages["codes_decoded"].append((time.perf_counter() - t0) * 1e3)
        n_cand.append(len(cand))
        n_rows.append(len(kept))
    med = {n: float(np.median(v)) for n, v in stages.items() if v}
    mean = {n: float(np.mean(v)) for n, v in stages.items() if v}
    out = {"index": str(index), "images": len(snap.store), "spec": snap.manifest.faiss.spec,
           "token_store": snap.manifest.token_store.spec, "k_factor": s.k_factor, "refine": s.refine,
           "refine_share": s.refine_share,
           "candidates_mean": float(np.mean(n_cand)), "f16_rows_mean": float(np.mean(n_rows)),
           "median_ms": med, "mean_ms": mean,
           "share_of_total_mean": {n: mean[n] / mean["total"] for n in mean if n not in ("total", "codes_decoded")}}
    snap.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--source", type=Path, required=True, help="the bench.corpus1m folder (its queries)")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    print_machine({"bench": "profile_search", "index": str(args.index)})
    print(json.dumps(profile(args.index, args.source, args.queries, args.k), indent=1))


if __name__ == "__main__":
    main()
