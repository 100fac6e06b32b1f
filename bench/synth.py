"""A generator of image-like token sets fitted to the real corpus tokens, for collections larger than the real
one (the 1M-image benchmark). Not i.i.d. Gaussian noise: it keeps the clusters, the per-position structure,
the co-occurrence of parts within an image, the residual spread and the near-duplicates of the real tokens.

Fit (on ``--fit-images`` real database images of ``bench.project``'s 384-d corpus):

- per token position p (10 positions: CLS, 4 part cues, 5 ROI tokens): spherical k-means with ``--clusters``
  centroids (FAISS); each token = centroid of its cluster + a residual;
- per (position, cluster): the per-dimension standard deviation of the residuals (diagonal Gaussian);
- within-image correlation: rho = mean correlation between the standardised residuals of two positions of the
  same image (one scalar), so that an image's tokens move together as real ones do;
- co-occurrence: the 10-tuple of cluster ids of every fitted image (an image reuses a real image's tuple, so
  which parts appear together is real);
- near-duplicates: the fraction of augmented copies in the real database (31 %) and the per-dimension spread of
  copy-minus-source token differences (from ``meta.npz``'s sources).

Generate: an image = a random real cluster tuple + correlated diagonal-Gaussian residuals, re-normalised to
unit length; with the duplicate fraction it is instead a noisy copy of an earlier generated image. Queries
are fresh (non-copy) images. ``--check`` compares real and generated statistics at the same size.

Usage::

    python -m bench.synth --n 1000000 --out /work/perf-data/synth1m        # the 1M corpus (7.7 GB float16)
    python -m bench.synth --n 100000 --out /work/perf-data/synth100k --check
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, print_machine


def fit(db: np.ndarray, meta: dict, n_fit: int, n_clusters: int, seed: int = 0) -> dict:
    """Generator parameters from real tokens ``db`` (N, T, D) float16."""
    import faiss

    rng = np.random.default_rng(seed)
    n, t, d = db.shape
    rows = np.sort(rng.choice(n, size=min(n_fit, n), replace=False))
    x = np.asarray(db[rows], dtype=np.float32)
    centroids = np.zeros((t, n_clusters, d), np.float32)
    std = np.zeros((t, n_clusters, d), np.float32)
    assign = np.zeros((len(rows), t), np.int32)
    resid = np.zeros_like(x)
    for p in range(t):
        km = faiss.Kmeans(d, n_clusters, niter=20, spherical=True, seed=seed + p)
        km.train(x[:, p])
        _, a = km.index.search(x[:, p], 1)
        assign[:, p] = a[:, 0]
        centroids[p] = km.centroids
        resid[:, p] = x[:, p] - km.centroids[a[:, 0]]
        for c in range(n_clusters):
            sel = assign[:, p] == c
            std[p, c] = resid[sel, p].std(axis=0) if sel.sum() > 1 else resid[:, p].std(axis=0)
    z = resid / np.maximum(std[np.arange(t)[None, :], assign], 1e-6)
    zc = z - z.mean(axis=0, keepdims=True)
    corr = []
    for p in range(t):
        for q in range(p + 1, t):
            num = (zc[:, p] * zc[:, q]).mean(axis=0)
            den = zc[:, p].std(axis=0) * zc[:, q].std(axis=0) + 1e-9
            corr.append(float(np.mean(num / den)))
    rho = float(np.clip(np.mean(corr), 0.0, 0.99))
    aug = np.flatnonzero(meta["augmented"][:n])
    aug = aug[rng.choice(len(aug), size=min(5000, len(aug)), replace=False)] if len(aug) else aug
    src_row = {int(s): i for i, s in enumerate(meta["source"][:n]) if not meta["augmented"][i]}
    pairs = [(a, src_row[int(meta["source"][a])]) for a in aug if int(meta["source"][a]) in src_row]
    if pairs:
        diff = np.asarray(db[[a for a, _ in pairs]], np.float32) - np.asarray(db[[b for _, b in pairs]], np.float32)
        copy_std = diff.reshape(-1, d).std(axis=0)
    else:
        copy_std = np.full(d, 0.05, np.float32)
    return {"centroids": centroids, "std": std, "tuples": assign, "rho": np.float32(rho),
            "dup_frac": np.float32(meta["augmented"][:n].mean()), "copy_std": copy_std.astype(np.float32)}


def generate(params: dict, n: int, rng: np.random.Generator, allow_copies: bool = True,
             pool: np.ndarray | None = None) -> np.ndarray:
    """(n, T, D) float32 unit tokens. Copies draw their source from ``pool`` (earlier generated images)."""
    c, s, tuples = params["centroids"], params["std"], params["tuples"]
    t, _, d = c.shape
    rho = float(params["rho"])
    a = tuples[rng.integers(0, len(tuples), size=n)]  # (n, T)
    pos = np.arange(t)[None, :]
    shared = rng.standard_normal((n, 1, d)).astype(np.float32)
    own = rng.standard_normal((n, t, d)).astype(np.float32)
    x = c[pos, a] + s[pos, a] * (np.sqrt(rho) * shared + np.sqrt(1 - rho) * own)
    if allow_copies and pool is not None and len(pool):
        dup = rng.random(n) < float(params["dup_frac"])
        src = pool[rng.integers(0, len(pool), size=int(dup.sum()))].astype(np.float32)
        x[dup] = src + params["copy_std"] * rng.standard_normal(src.shape).astype(np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def stats(db: np.ndarray, q: np.ndarray, n: int = 20_000) -> dict:
    """Statistics to compare real and generated corpora: token-to-nearest-token similarity, MaxSim top scores."""
    import torch

    from bench.data import exact_topk

    sub = np.asarray(db[:n])
    ids, scores = exact_topk(sub, q[:100], k=10)
    flat = torch.from_numpy(sub.reshape(-1, sub.shape[-1]).astype(np.float32))
    nn = (torch.from_numpy(q[:100].reshape(-1, q.shape[-1])) @ flat.T).amax(dim=1).numpy()
    same = (sub[:, :1] * sub[:, 1:]).sum(-1).astype(np.float32)
    return {"query_token_nn_sim_mean": float(nn.mean()), "maxsim_top1_mean": float(scores[:, 0].mean()),
            "maxsim_top10_mean": float(scores[:, 9].mean()),
            "top1_minus_top10": float((scores[:, 0] - scores[:, 9]).mean()),
            "cls_vs_other_tokens_sim_mean": float(same.mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--fit-images", type=int, default=20_000)
    p.add_argument("--clusters", type=int, default=256)
    p.add_argument("--check", action="store_true", help="print real vs generated statistics")
    args = p.parse_args()
    print_machine({"bench": "synth", "n": args.n})
    from bench.data import load_corpus

    db, q = load_corpus(384)
    meta = dict(np.load(CORPUS_DIR / "meta.npz"))
    params = fit(db, meta, args.fit_images, args.clusters)
    print(json.dumps({"rho": float(params["rho"]), "dup_frac": float(params["dup_frac"]),
                      "copy_std_mean": float(params["copy_std"].mean())}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "generator.npz", **params)
    t, d = db.shape[1], db.shape[2]
    out = np.memmap(args.out / "db.f16", dtype=np.float16, mode="w+", shape=(args.n, t, d))
    rng = np.random.default_rng(1)
    chunk = 50_000
    for start in range(0, args.n, chunk):
        m = min(chunk, args.n - start)
        pool = np.asarray(out[max(0, start - 200_000) : start]) if start else None
        out[start : start + m] = generate(params, m, rng, pool=pool).astype(np.float16)
    out.flush()
    queries = generate(params, args.queries, rng, allow_copies=False)
    np.save(args.out / "q.npy", queries.astype(np.float32))
    (args.out / "info.json").write_text(json.dumps({"db": args.n, "tokens": t, "dim": d, "generator": "bench.synth"}))
    if args.check:
        print("real:", json.dumps(stats(db, q)))
        print("generated:", json.dumps(stats(out, queries)))


if __name__ == "__main__":
    main()
