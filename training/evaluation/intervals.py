"""Confidence intervals of retrieval figures: a proportion's Wilson interval, and a paired bootstrap that resamples
whole clusters (source photos), since the queries made from one photo are not independent."""

from __future__ import annotations

import numpy as np


def wilson_interval(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n (k hits of n trials)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, draws: int = 4000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b (per-query hits of two scorers on the same queries) and its 95 % percentile interval from
    a bootstrap that resamples whole clusters (the source photos: queries of one photo are not independent,
    across kinds and seeds alike). Returns (mean difference, low, high)."""
    ids, inv = np.unique(clusters, return_inverse=True)
    d = a - b
    sums = np.bincount(inv, weights=d, minlength=len(ids))
    counts = np.bincount(inv, minlength=len(ids)).astype(float)
    pick = np.random.default_rng(seed).integers(0, len(ids), size=(draws, len(ids)))
    boot = sums[pick].sum(1) / counts[pick].sum(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)
