"""Reduce the corpus tokens from 1280-d (EfficientNet-Lite0) to 384-d, the paper's ViT-S width.

Projection: the top-384 right singular vectors of a sample of database tokens (20,000 random database
images x 10 tokens, seed 0), computed on the raw, uncentred unit tokens (the rank-384 map that best keeps
their inner products, which is what MaxSim scores), then every token is re-normalised to unit length.
The basis is saved so the 1M generator and anyone else can reproduce it.

Outputs in ``$REGIS_BENCH_DATA/corpus``: ``db384.f16`` ((100000, 10, 384) float16, unit tokens),
``q384.npy`` ((1000, 10, 384) float32), ``proj384.npy`` ((1280, 384) float32 basis), ``labels.npy``.

Usage::

    python -m bench.project [--dim 384]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bench.common import CORPUS_DIR, print_machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--sample-images", type=int, default=20_000)
    args = p.parse_args()
    print_machine()
    info = json.loads((CORPUS_DIR / "info.json").read_text())
    n, t, d = info["rows"], info["tokens_per_image"], info["dim"]
    n_db = info["db"]
    raw = np.memmap(CORPUS_DIR / "raw1280.f16", dtype=np.float16, mode="r", shape=(n, t, d))
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(n_db, size=min(args.sample_images, n_db), replace=False))
    x = raw[sample].reshape(-1, d).astype(np.float32)
    # eigenvectors of the (uncentred) second-moment matrix = right singular vectors of x
    cov = x.T @ x / len(x)
    evals, evecs = np.linalg.eigh(cov.astype(np.float64))
    order = np.argsort(evals)[::-1]
    basis = evecs[:, order[: args.dim]].astype(np.float32)
    kept = float(evals[order[: args.dim]].sum() / evals.sum())
    np.save(CORPUS_DIR / f"proj{args.dim}.npy", basis)
    out = np.memmap(CORPUS_DIR / f"db{args.dim}.f16", dtype=np.float16, mode="w+", shape=(n_db, t, args.dim))
    for start in range(0, n_db, 10_000):
        y = raw[start : min(start + 10_000, n_db)].astype(np.float32) @ basis
        y /= np.linalg.norm(y, axis=-1, keepdims=True)
        out[start : start + 10_000] = y.astype(np.float16)
    out.flush()
    q_start = info.get("query_start", n_db)  # bench.corpus --db-rows: the queries follow the whole plan's database
    q = raw[q_start:].astype(np.float32) @ basis
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    np.save(CORPUS_DIR / f"q{args.dim}.npy", q.astype(np.float32))
    meta = np.load(CORPUS_DIR / "meta.npz")
    np.save(CORPUS_DIR / "labels.npy", meta["labels"])
    # how well the projection keeps inner products: token pairs from random images
    a = raw[rng.integers(0, n_db, 2000)].reshape(-1, d).astype(np.float32)[:5000]
    b = raw[rng.integers(0, n_db, 2000)].reshape(-1, d).astype(np.float32)[:5000]
    pa, pb = a @ basis, b @ basis
    pa /= np.linalg.norm(pa, axis=1, keepdims=True)
    pb /= np.linalg.norm(pb, axis=1, keepdims=True)
    err = np.abs((a * b).sum(1) - (pa * pb).sum(1))
    print(json.dumps({"dim": args.dim, "energy_kept": round(kept, 4), "ip_abs_err_mean": float(err.mean()),
                      "ip_abs_err_p99": float(np.percentile(err, 99)), "db_rows": n_db, "queries": n - q_start}))


if __name__ == "__main__":
    main()
