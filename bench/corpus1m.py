"""The 1M-image token corpus: real encoder tokens first, then images generated from them (issue 24).

Real tokens are what the encoder gives (``bench.corpus``: Fashion-MNIST through EfficientNet-Lite0 at 96 px,
10 tokens per image), optionally projected to a narrower width (``bench.project --dim D``: the top-D right
singular vectors of the uncentred tokens, a stand-in for a trained per-token head). The encoder runs at ~13-30
images/s on this machine's 2 shared cores, so the rest of the million is generated.

The generator keeps the real neighbourhood structure by drawing every new image *between two real images that
are neighbours*: for generated image g (deterministic, seed ``--seed`` and g's chunk),

    a      = a real database image, uniform
    b      = one of a's ``--neighbours`` nearest real images, uniform (cosine of the images' mean tokens)
    lam    ~ Uniform(0, 1)
    tok_p  = normalise(lam * a_p + (1 - lam) * b_p + sigma * eps_p),  p = 1..T,  eps_p ~ N(0, I_D / D)

position by position (the T token positions keep their roles: CLS, cues, ROI tokens). So every generated image
lies on the real image manifold between two real images that look alike (mixing up across classes only where
real neighbours do), the share of near-duplicates follows the real share (a real image and its augmented copy
are neighbours, and their mixtures are near-duplicates too), and the collection grows denser the way a larger
collection of the same kind of photos does. ``sigma`` (default 0) adds isotropic noise; the check below chose it.

What it does not do: generated images carry no new content (no image unlike every real one), the density
grows uniformly over the real manifold (a real collection grows unevenly), and a generated image never is an
exact duplicate. The queries stay the real held-out queries.

Check (``--check``): a slice of generated images as large as the real set (rows ``real .. 2 * real``) against the
real set, for the same queries: the similarity of each query token to its nearest database token, the exact MaxSim
top-1 and top-10 scores and their gap, the share of database images with a near-duplicate (MaxSim to its
nearest other image > 0.95 T); then ``bench.million --slices`` compares regis's recall@10 on the two slices.

Outputs (``--out``): ``db.f16`` ((N, T, D) float16, unit tokens; rows ``0 .. real - 1`` are the real images),
``q.npy`` ((Q, T, D) float32 real queries), ``info.json`` (sizes, the generator's parameters); the layout
``bench.data.load_corpus(source=DIR)`` reads. Written in chunks through a memory map (never all in RAM).

Usage::

    python -m bench.corpus --n-db 30000 --n-queries 500 --out $REGIS_BENCH_DATA/corpus30k
    python -m bench.project --dim 256        # with $REGIS_BENCH_DATA/corpus -> that folder
    python -m bench.corpus1m --real $REGIS_BENCH_DATA/corpus --dim 256 --n 1000000 --out $REGIS_BENCH_DATA/tok1m-256
    python -m bench.corpus1m --out $REGIS_BENCH_DATA/tok1m-256 --check
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import print_machine

CHUNK = 50_000


def load_real(real_dir: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Real database tokens (N, T, D) float16 (memory-mapped) and queries (Q, m, D) float32 of a ``bench.corpus``
    folder: the projected ``db{D}.f16`` / ``q{D}.npy`` of ``bench.project``, or the encoder's own D-d tokens (m = T,
    or the encoder's query layout: ``queries{D}.f16``)."""
    info = json.loads((real_dir / "info.json").read_text())
    t, n_db = info["tokens_per_image"], info["db"]
    if dim == info["dim"]:
        raw = np.memmap(real_dir / f"raw{dim}.f16", dtype=np.float16, mode="r", shape=(info["rows"], t, dim))
        m = info.get("query_tokens", t)
        if m == t:
            q = raw[info.get("query_start", n_db):].astype(np.float32)
        else:  # the encoder's query layout (bench.corpus: queries{D}.f16)
            q = np.fromfile(real_dir / f"queries{dim}.f16", dtype=np.float16).reshape(-1, m, dim).astype(np.float32)
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        return raw[:n_db], q
    db = np.memmap(real_dir / f"db{dim}.f16", dtype=np.float16, mode="r", shape=(n_db, t, dim))
    return db, np.load(real_dir / f"q{dim}.npy")


def image_neighbours(db: np.ndarray, k: int, chunk: int = 10_000) -> np.ndarray:
    """(N, k) int64: each real image's k nearest other images by the cosine of their mean tokens."""
    import faiss

    n = len(db)
    desc = np.empty((n, db.shape[2]), np.float32)
    for s in range(0, n, chunk):
        m = np.asarray(db[s : s + chunk], dtype=np.float32).mean(axis=1)
        desc[s : s + chunk] = m / np.linalg.norm(m, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(desc.shape[1])
    index.add(desc)
    _, ids = index.search(desc, k + 1)
    out = np.empty((n, k), np.int64)
    for i in range(n):  # drop the image itself wherever it sits (ties with a duplicate)
        row = ids[i][ids[i] != i]
        out[i] = row[:k]
    return out


def generate(real: np.ndarray, neighbours: np.ndarray, start: int, count: int, seed: int,
             sigma: float) -> np.ndarray:
    """Generated images ``start .. start + count - 1`` (numbered from 0 after the real ones): (count, T, D) float16.

    Deterministic in (seed, start): a chunk can be regenerated alone.
    """
    rng = np.random.default_rng([seed, start])
    n_real, t, d = real.shape
    a = rng.integers(0, n_real, count)
    b = neighbours[a, rng.integers(0, neighbours.shape[1], count)]
    lam = rng.uniform(0.0, 1.0, (count, 1, 1)).astype(np.float32)
    order = np.argsort(a, kind="stable")  # sorted reads from the memory map
    ta = np.empty((count, t, d), np.float32)
    tb = np.empty((count, t, d), np.float32)
    ta[order] = real[a[order]]
    ob = np.argsort(b, kind="stable")
    tb[ob] = real[b[ob]]
    x = lam * ta + (1.0 - lam) * tb
    if sigma > 0:
        x += sigma / np.sqrt(d) * rng.standard_normal(x.shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x.astype(np.float16)


def write_corpus(real_dir: Path, dim: int, n: int, out: Path, seed: int, k: int, sigma: float) -> dict:
    """Write the corpus (see module docstring); resumable per chunk. Returns info.json's content."""
    real, q = load_real(real_dir, dim)
    n_real, t, d = real.shape
    if n < n_real:
        raise SystemExit(f"--n {n} is below the {n_real} real images")
    out.mkdir(parents=True, exist_ok=True)
    real_info = json.loads((real_dir / "info.json").read_text())
    info = {"db": n, "tokens": t, "dim": d, "real": n_real, "queries": len(q), "query_tokens": q.shape[1],
            "score_framings": real_info.get("score_framings", 1), "backbone": real_info.get("backbone"),
            "real_dir": str(real_dir),
            "generator": {"method": "mix of neighbouring real images", "neighbours": k, "seed": seed,
                          "sigma": sigma, "lambda": "uniform(0, 1)"}}
    info_path = out / "info.json"
    path = out / "db.f16"
    if info_path.exists() and json.loads(info_path.read_text()).get("generator") != info["generator"]:
        raise SystemExit(f"{out} holds a corpus made with other generator parameters; use another --out")
    db = np.memmap(path, dtype=np.float16, mode="r+" if path.exists() else "w+", shape=(n, t, d))
    progress = out / "progress.json"
    done = json.loads(progress.read_text())["done"] if progress.exists() else 0
    t0 = time.perf_counter()
    if done < n_real:
        for s in range(0, n_real, CHUNK):
            e = min(s + CHUNK, n_real)
            db[s:e] = real[s:e]
        done = n_real
        np.save(out / "q.npy", q.astype(np.float32))
        progress.write_text(json.dumps({"done": done}))
    nb = None
    while done < n:
        if nb is None:
            nb_path = out / "neighbours.npy"
            if nb_path.exists():
                nb = np.load(nb_path)
            else:
                nb = image_neighbours(real, k)
                np.save(nb_path, nb)
        count = min(CHUNK, n - done)
        db[done : done + count] = generate(real, nb, done - n_real, count, seed, sigma)
        db.flush()
        done += count
        progress.write_text(json.dumps({"done": done}))
        print(f"{done}/{n} images, {time.perf_counter() - t0:.0f} s", flush=True)
    info_path.write_text(json.dumps(info, indent=2))
    return info


def maxsim_top(db: np.ndarray, q: np.ndarray, k: int = 10, framings: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Exact MaxSim top-k scores (Q, k) and each query token's best token similarity (Q, m), float32
    (``framings``: scored apart, ``bench.data.exact_topk``)."""
    from bench.data import exact_topk

    _, scores = exact_topk(db, q, k, framings=framings)
    import torch

    qf = torch.from_numpy(q.reshape(-1, q.shape[2]))
    best = torch.full((qf.shape[0],), -1.0)
    for s in range(0, len(db), 4096):
        x = torch.from_numpy(np.ascontiguousarray(db[s : s + 4096])).reshape(-1, db.shape[2]).float()
        best = torch.maximum(best, (x @ qf.T).amax(dim=0))
    return scores, best.view(q.shape[0], q.shape[1]).numpy()


def near_duplicate_share(db: np.ndarray, n: int, seed: int = 0, thresh: float = 0.95, framings: int = 1) -> float:
    """Share of ``n`` random images of ``db`` whose nearest other image scores MaxSim > thresh x the perfect score
    (T, or T / ``framings`` with framings scored apart)."""
    from bench.data import exact_topk

    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(db), size=n, replace=False))
    q = np.asarray(db[pick], dtype=np.float32)
    ids, scores = exact_topk(db, q, 2, framings=framings)
    other = np.where(ids[:, 0] == pick, scores[:, 1], scores[:, 0])
    return float((other > thresh * db.shape[1] / framings).mean())


def check(out: Path, n_queries: int, n_dup: int) -> dict:
    """Statistics of the real images against an equal-sized slice of generated ones (module docstring)."""
    info = json.loads((out / "info.json").read_text())
    n_real, t, d = info["real"], info["tokens"], info["dim"]
    if info["db"] < 2 * n_real:
        raise SystemExit("--check needs at least as many generated images as real ones")
    db = np.memmap(out / "db.f16", dtype=np.float16, mode="r", shape=(info["db"], t, d))
    q = np.load(out / "q.npy")[:n_queries]
    rows = {}
    for name, part in (("real", db[:n_real]), ("generated", db[n_real : 2 * n_real])):
        framings = info.get("score_framings", 1)
        scores, best = maxsim_top(part, q, framings=framings)
        rows[name] = {"images": len(part), "query_token_nearest_cos": float(best.mean()),
                      "maxsim_top1": float(scores[:, 0].mean()), "maxsim_top10": float(scores[:, 9].mean()),
                      "top1_minus_top10": float((scores[:, 0] - scores[:, 9]).mean()),
                      "near_duplicate_share": near_duplicate_share(part, n_dup, framings=framings)}
        print(f"check: {name}: {json.dumps(rows[name])}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", type=Path, default=None, help="a bench.corpus folder (with bench.project's output)")
    p.add_argument("--dim", type=int, default=256, help="token width: 1280 (raw) or a bench.project width")
    p.add_argument("--n", type=int, default=1_000_000, help="images in all, real ones included")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--neighbours", type=int, default=10, help="real neighbours a generated image may mix with")
    p.add_argument("--sigma", type=float, default=0.0, help="isotropic noise added before normalising")
    p.add_argument("--check", action="store_true", help="compare the real images with a generated slice")
    p.add_argument("--check-queries", type=int, default=200)
    p.add_argument("--check-images", type=int, default=500, help="images sampled for the near-duplicate share")
    args = p.parse_args()
    print_machine({"bench": "corpus1m"})
    if args.real is not None:
        info = write_corpus(args.real, args.dim, args.n, args.out, args.seed, args.neighbours, args.sigma)
        print("corpus:", json.dumps(info), flush=True)
    if args.check:
        rows = check(args.out, args.check_queries, args.check_images)
        print("| images | query token -> nearest token, mean cos | MaxSim top-1 mean | top-10 mean | top-1 - top-10 "
              "| share with a near-duplicate |")
        print("|---|---|---|---|---|---|")
        for name, r in rows.items():
            print(f"| {name} ({r['images']:,}) | {r['query_token_nearest_cos']:.3f} | {r['maxsim_top1']:.2f} | "
                  f"{r['maxsim_top10']:.2f} | {r['top1_minus_top10']:.2f} | {r['near_duplicate_share']:.3f} |")


if __name__ == "__main__":
    main()
