"""Generated corpus where many images share near-identical tokens (issue 15): the hard case for candidates.

Real catalogues have tokens that hundreds of images hold almost unchanged (white or grey product backgrounds,
sky, document margins, a watermark, register tokens carrying global image statistics). Candidates taken as
the images owning each query token's ``depth`` nearest token vectors saturate there: when more than ``depth``
images hold a near-identical token, an arbitrary subset of them is kept.

Model: ``n_centres = n * T / per_centre`` shared centres c_j ~ N(0, I_D); every token of every image is
``normalise(c_j + sigma * g)`` for a centre j drawn uniformly at random and g ~ N(0, I_D), so about
``per_centre`` images share each centre (the share is the parameter) and two tokens of one centre have cosine
~ 1 / (1 + sigma^2) (0.94 at sigma 0.25). Queries are random database images plus noise: every token of the
unnormalised source is moved by ``query_sigma * g`` and re-normalised (cosine to the source ~ 0.9995 at 0.03),
so the exact top-1 is the source and the rest of the top-10 are images sharing the most centres with it.

Writes the ``bench.synth`` layout (``db.f16`` (n, T, D) float16, ``q.npy`` (Q, T, D) float32, ``info.json``),
so ``bench.search --source DIR`` and ``bench.candidates`` read it.

Usage::

    python -m bench.shared --n 100000 --per-centre 250 --out $REGIS_BENCH_DATA/shared100k
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import print_machine


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def shared_tokens(n: int, centres: np.ndarray, sigma: float, rng: np.random.Generator,
                  tokens_per_image: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised tokens of ``n`` images drawn from ``centres``.

    Args:
        n: images.
        centres: (C, D) float32 shared centres.
        sigma: per-dimension noise standard deviation around a centre (centres have per-dimension scale 1).
        rng: random generator.
        tokens_per_image: T.

    Returns:
        raw (n, T, D) float32 unnormalised tokens, centre ids (n, T) int64.
    """
    which = rng.integers(0, len(centres), size=(n, tokens_per_image))
    raw = centres[which] + sigma * rng.standard_normal((n, tokens_per_image, centres.shape[1]), dtype=np.float32)
    return raw, which


def write_corpus(out: Path, n: int, per_centre: float, sigma: float = 0.25, query_sigma: float = 0.03,
                 n_queries: int = 1000, tokens_per_image: int = 10, dim: int = 384, seed: int = 0,
                 chunk: int = 20_000) -> dict:
    """Write a shared-centre corpus to ``out`` (``db.f16``, ``q.npy``, ``info.json``); returns the info dict.

    Args:
        out: folder (created).
        n: database images.
        per_centre: mean number of images sharing a centre (n * T / number of centres); >= 1.
        sigma, query_sigma: noise of database tokens around their centre, and of queries around their source.
        n_queries: queries (sources drawn from the database, seed ``seed``).

    Raises:
        ValueError: per_centre < 1 or more queries than images.
    """
    if per_centre < 1 or n_queries > n:
        raise ValueError(f"per_centre must be >= 1 and n_queries <= n, got {per_centre}, {n_queries}")
    rng = np.random.default_rng(seed)
    n_centres = max(1, round(n * tokens_per_image / per_centre))
    centres = rng.standard_normal((n_centres, dim), dtype=np.float32)
    out.mkdir(parents=True, exist_ok=True)
    db = np.memmap(out / "db.f16", dtype=np.float16, mode="w+", shape=(n, tokens_per_image, dim))
    sources = np.sort(rng.choice(n, size=n_queries, replace=False))
    queries = np.zeros((n_queries, tokens_per_image, dim), np.float32)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        raw, _ = shared_tokens(m, centres, sigma, rng, tokens_per_image)
        db[start : start + m] = _normalise(raw).astype(np.float16)
        sel = sources[(sources >= start) & (sources < start + m)]
        moved = raw[sel - start] + query_sigma * rng.standard_normal(raw[sel - start].shape, dtype=np.float32)
        queries[np.searchsorted(sources, sel)] = _normalise(moved)
    db.flush()
    np.save(out / "q.npy", queries)
    info = {"db": n, "tokens": tokens_per_image, "dim": dim, "generator": "bench.shared", "centres": n_centres,
            "per_centre": n * tokens_per_image / n_centres, "sigma": sigma, "query_sigma": query_sigma,
            "query_sources": sources.tolist()}
    (out / "info.json").write_text(json.dumps(info))
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--per-centre", type=float, default=250.0, help="images sharing each centre (mean)")
    p.add_argument("--sigma", type=float, default=0.25)
    p.add_argument("--query-sigma", type=float, default=0.03)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--dim", type=int, default=384, help="token width (1280: EfficientNet-Lite0's)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    print_machine({"bench": "shared", "n": args.n, "per_centre": args.per_centre, "dim": args.dim})
    info = write_corpus(args.out, args.n, args.per_centre, args.sigma, args.query_sigma, args.queries, dim=args.dim)
    print(json.dumps({k: v for k, v in info.items() if k != "query_sources"}))


if __name__ == "__main__":
    main()
