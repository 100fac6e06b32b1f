"""FAISS 4-bit fast-scan PQ codes of the vectors or of their residuals: how well each finds a query token's
nearest token vectors (issue 24).

``IVF{n},PQ{M}x4fs`` codes each vector itself; ``IVF{n},PQ{M}x4fsr`` codes its residual to its IVF centroid
(``faiss_index.fast_scan_pq``). Both are trained and filled here on the same real token vectors, and for a sample
of held-out token vectors (the queries) the script reports, per spec:

- ``neighbour_recall``: the share of each query's ``--depth`` exact nearest token vectors (inner product, brute
  force) that FAISS returns, at k_factor 1 (FAISS's own top ``depth``) and at ``--k-factor`` (FAISS's top
  ``k_factor x depth`` re-ranked exactly to the best ``depth``: an upper bound of regis's re-ranking on the token
  store's codes, ``Searcher._neighbours``);
- ``sim_bias``: FAISS's similarity minus the exact one of the top 10 it returns, mean over queries (the codes'
  systematic error: negative means FAISS sees its neighbours as further than they are);
- ``range_found``: of the token vectors whose exact similarity exceeds ``--radius``, the share that a FAISS range
  search at that radius returns (what the bounded candidate method relies on, ``regis.retrieve.candidates``);
- ``search_ms``: FAISS's search, ms per query vector (one thread, k = depth x k_factor); ``build_s``.

``IVF{n},SQ8`` (regis's codec below 1024-d) is the reference. The vectors: a ``bench.corpus`` folder's
``raw{dim}.f16`` (real tokens of the encoder it ran), zero rows (not yet written) dropped; the last ``--queries``
rows are the queries and the ``--held-out`` rows before them are left out of the index.

Usage::

    python -m bench.residual_codes --corpus $REGIS_BENCH_DATA/corpus-regis --nlist 512 \\
        --specs "SQ8;PQ64x4fs;PQ64x4fsr;PQ32x4fs;PQ32x4fsr" --json docs/results/million/residual-codes.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import print_machine, recall_at_k


def load_vectors(corpus: Path, dim: int) -> np.ndarray:
    """(n, dim) float32 unit-norm token vectors of a ``bench.corpus`` folder (rows of norm < 0.5 dropped).

    Raises:
        SystemExit: the file is missing.
    """
    path = corpus / f"raw{dim}.f16"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run bench.corpus first")
    raw = np.fromfile(path, dtype=np.float16).reshape(-1, dim).astype(np.float32)
    return raw[np.linalg.norm(raw, axis=1) > 0.5]


def measure(spec: str, db: np.ndarray, queries: np.ndarray, exact_top: np.ndarray, radius: float,
            depth: int, k_factor: int, nprobe: int, train: int, seed: int) -> dict:
    """The module docstring's figures for one IVF spec over ``db`` (n, D) and ``queries`` (q, D) float32."""
    import faiss

    rng = np.random.default_rng(seed)
    index = faiss.index_factory(db.shape[1], spec, faiss.METRIC_INNER_PRODUCT)
    faiss.omp_set_num_threads(2)
    t0 = time.perf_counter()
    index.train(db[rng.choice(len(db), min(train, len(db)), replace=False)])
    index.add(db)
    build_s = time.perf_counter() - t0
    faiss.omp_set_num_threads(1)
    params = faiss.SearchParametersIVF(nprobe=nprobe)
    out = {"spec": spec, "build_s": round(build_s, 1)}
    for kf in (1, k_factor):
        t0 = time.perf_counter()
        sims, ids = index.search(queries, depth * kf, params=params)
        out[f"search_ms_k{kf}"] = round((time.perf_counter() - t0) / len(queries) * 1e3, 3)
        if kf == 1:
            exact = np.einsum("qd,qkd->qk", queries, db[np.maximum(ids[:, :10], 0)])
            out["sim_bias"] = float(np.mean(np.where(ids[:, :10] >= 0, sims[:, :10] - exact, 0.0)))
        else:
            exact = np.einsum("qd,qkd->qk", queries, db[np.maximum(ids, 0)])
            exact[ids < 0] = -np.inf
            ids = np.take_along_axis(ids, np.argsort(-exact, axis=1)[:, :depth], axis=1)
        out[f"neighbour_recall_k{kf}"] = recall_at_k(ids, exact_top, depth)
    lims, _, found = index.range_search(queries, float(radius), params=params)
    hits = total = 0
    for i, q in enumerate(queries):
        truth = np.flatnonzero(db @ q > radius)
        hits += len(np.intersect1d(truth, found[lims[i]: lims[i + 1]]))
        total += len(truth)
    out["range_found"] = hits / max(total, 1)
    out["range_exact_count"] = int(total)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="a bench.corpus folder (raw{dim}.f16)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--nlist", type=int, default=512)
    p.add_argument("--specs", default="SQ8;PQ64x4fs;PQ64x4fsr;PQ32x4fs;PQ32x4fsr",
                   help="vector codecs, ';'-separated (each gets IVF{nlist},)")
    p.add_argument("--queries", type=int, default=600)
    p.add_argument("--held-out", type=int, default=2000, help="rows before the queries left out of the index")
    p.add_argument("--depth", type=int, default=192)
    p.add_argument("--k-factor", type=int, default=4)
    p.add_argument("--nprobe", type=int, default=32)
    p.add_argument("--radius", type=float, default=0.6)
    p.add_argument("--train", type=int, default=50_000, help="vectors sampled to train each index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    print_machine({"bench": "residual_codes", "corpus": str(args.corpus)})
    vectors = load_vectors(args.corpus, args.dim)
    if len(vectors) <= args.queries + args.held_out + 39 * args.nlist:
        raise SystemExit(f"{len(vectors)} token vectors: too few for {args.nlist} lists and the queries")
    queries = vectors[-args.queries:]
    db = vectors[: -(args.queries + args.held_out)]
    exact_top = np.argsort(-(queries @ db.T), axis=1)[:, : args.depth]
    rows = []
    for codec in args.specs.split(";"):
        rows.append(measure(f"IVF{args.nlist},{codec}", db, queries, exact_top, args.radius, args.depth,
                            args.k_factor, args.nprobe, args.train, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    result = {"vectors": len(db), "queries": len(queries), "depth": args.depth, "k_factor": args.k_factor,
              "nprobe": args.nprobe, "radius": args.radius, "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
