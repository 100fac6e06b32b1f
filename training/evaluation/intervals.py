"""Confidence intervals of retrieval figures: a proportion's Wilson interval, a paired bootstrap that resamples
whole clusters (source photos), since the queries made from one photo are not independent, and the per-kind
table of both that the photo evaluations print (``per_kind_table``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def per_kind_table(hits: Mapping[str, np.ndarray], kinds: np.ndarray | Sequence[str],
                   photos: np.ndarray | Sequence, diffs: Sequence[tuple[str, str]] = (),
                   kinds_order: Sequence[str] | None = None, digits: int | None = 4) -> dict[str, dict]:
    """Recall@1 per query kind of several scorers on the same queries, with intervals.

    Args:
        hits: {scorer name: (Q,) float array of 0 / 1}, whether each query's first answer was right; every
            scorer on the same Q queries, in the same order.
        kinds: (Q,) the queries' kinds (str).
        photos: (Q,) the queries' source photos (any hashable, sortable dtype): the bootstrap's clusters.
        diffs: (a, b) pairs of scorer names: the mean of hits[a] - hits[b] per kind, with its interval.
        kinds_order: the kinds tabulated after "all", in this order (None: the distinct ``kinds``, sorted).
            Kinds without queries are left out, and so is "all" when Q = 0.
        digits: every figure rounded to this many decimals (None: not rounded).

    Returns:
        {kind: {"n": int, "scorers": {name: {"r1", "lo", "hi"}}, "diffs": {"a - b": {"d", "lo", "hi"}}}} with
        "all" first: r1 the mean hit rate and [lo, hi] its 95 % Wilson interval (``wilson_interval``); d the mean
        of a - b and [lo, hi] its 95 % interval from ``paired_bootstrap`` over ``photos`` (draws 4000, seed 0),
        computed on the kind's queries. Scorers and diffs keep the order of ``hits`` and ``diffs``.

    Raises:
        ValueError: ``kinds``, ``photos`` or a hits array not 1-D of one length Q, or a name in ``diffs`` that is
            not in ``hits``.
    """
    kinds_a, photos_a = np.asarray(kinds), np.asarray(photos)
    pooled = {name: np.asarray(arr, dtype=float) for name, arr in hits.items()}
    if kinds_a.ndim != 1:
        raise ValueError(f"kinds has shape {kinds_a.shape}; it must be (Q,)")
    q = len(kinds_a)
    for what, arr in (("kinds", kinds_a), ("photos", photos_a), *((f"hits[{n!r}]", a) for n, a in pooled.items())):
        if arr.ndim != 1 or len(arr) != q:
            raise ValueError(f"{what} has shape {arr.shape}; kinds has ({q},): every array must be (Q,)")
    for a, b in diffs:
        for name in (a, b):
            if name not in pooled:
                raise ValueError(f"diff ({a!r}, {b!r}): no scorer {name!r} in hits (have {sorted(pooled)})")

    def rnd(x: float) -> float:
        return float(x) if digits is None else round(float(x), digits)

    order = sorted(set(kinds_a.tolist())) if kinds_order is None else kinds_order
    table = {}
    for kind in ("all", *order):
        sel = np.ones(q, bool) if kind == "all" else kinds_a == kind
        if not sel.any():
            continue
        n = int(sel.sum())
        row: dict = {"n": n, "scorers": {}, "diffs": {}}
        for name, arr in pooled.items():
            lo, hi = wilson_interval(arr[sel].sum(), n)
            row["scorers"][name] = {"r1": rnd(arr[sel].mean()), "lo": rnd(lo), "hi": rnd(hi)}
        for a, b in diffs:
            d, lo, hi = paired_bootstrap(pooled[a][sel], pooled[b][sel], photos_a[sel])
            row["diffs"][f"{a} - {b}"] = {"d": rnd(d), "lo": rnd(lo), "hi": rnd(hi)}
        table[kind] = row
    return table
