"""Approximate descriptor matchers against the exact one, on real candidate pairs (issue 26, scale).

Verification's full match (``geometry.nearest_two``: every descriptor of one image against all of the other's,
FAISS ``IndexBinaryFlat``, 2,000 x 2,000) is its largest cost per pair. This script asks whether an approximate
binary nearest-neighbour search (the libraries' own: OpenCV's FLANN LSH index, FAISS's multi-index hashing
``IndexBinaryMultiHash``) verifies the same pairs for less. The labelled set's index (``--work``, from
``scripts/eval_duplicates.py``) is self-joined with the shipped thresholds; of the pairs the shipped gates verify,
a random sample (seed 0) gets its features once, then ``geometry.verify_pair`` with each matcher (index built on
the second image's descriptors for each pair, as the exact match does), on one thread: CPU ms per pair of match +
homography, the pairs verified (``min_inliers`` or more inliers) by label, and how many pairs change their outcome
against the exact match.

Usage::

    python -m bench.duplicates_matchers --work /work/cache/dup-eval-n16 --sample 300 \\
        --json docs/results/duplicates/matchers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def flann_lsh(tables: int, key_size: int, probe: int):
    """OpenCV FLANN LSH matcher with the ratio test: (a, b, ratio) -> (query, train) int64 indices."""
    import cv2

    matcher = cv2.FlannBasedMatcher(dict(algorithm=6, table_number=tables, key_size=key_size,
                                         multi_probe_level=probe), dict(checks=32))

    def match(a: np.ndarray, b: np.ndarray, ratio: float):
        q, t = [], []
        for m in matcher.knnMatch(a, b, k=2):
            if len(m) == 2 and m[0].distance < ratio * m[1].distance:
                q.append(m[0].queryIdx)
                t.append(m[0].trainIdx)
        return np.array(q, np.int64), np.array(t, np.int64)
    return match


def multi_hash(bits: int, tables: int, flips: int):
    """FAISS multi-index hashing (``IndexBinaryMultiHash``) with the ratio test (a neighbour not found: no
    second distance, the match kept)."""
    import faiss

    def match(a: np.ndarray, b: np.ndarray, ratio: float):
        faiss.omp_set_num_threads(1)
        index = faiss.IndexBinaryMultiHash(a.shape[1] * 8, tables, bits)
        index.nflip = flips
        index.add(np.ascontiguousarray(b))
        dist, idx = index.search(np.ascontiguousarray(a), 2)
        ok = (idx[:, 0] >= 0) & ((idx[:, 1] < 0) | (dist[:, 0] < ratio * dist[:, 1]))
        query = np.flatnonzero(ok)
        return query, idx[query, 0].astype(np.int64)
    return match


def matchers() -> dict:
    from regis.duplicates.geometry import nearest_two

    return {"exact (FAISS IndexBinaryFlat)": nearest_two,
            "FLANN LSH 6 tables, 12-bit keys, probe 1": flann_lsh(6, 12, 1),
            "FLANN LSH 4 tables, 16-bit keys, probe 1": flann_lsh(4, 16, 1),
            "FAISS multi-hash 2 x 10 bits, 1 flip": multi_hash(10, 2, 1),
            "FAISS multi-hash 4 x 12 bits, 1 flip": multi_hash(12, 4, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/work/cache/dup-eval-n16")
    p.add_argument("--sample", type=int, default=300, help="gated candidate pairs (random, seed 0)")
    p.add_argument("--json")
    args = p.parse_args()

    import cv2

    from bench.common import machine_info
    from bench.duplicates_labelled import gated_sample
    from regis.duplicates.geometry import local_features, verify_pair

    cv2.setNumThreads(1)
    cfg, root, recs, t, rows, label_of = gated_sample(args.work, args.sample)
    feats, pairs = {}, []
    for r in rows.tolist():
        ra, rb = recs[int(t.a[r])], recs[int(t.b[r])]
        for rec in (ra, rb):
            if rec.path not in feats:
                feats[rec.path] = local_features(root / "files" / rec.path, cfg.verify_side, cfg.features)
        pairs.append((feats[ra.path], feats[rb.path], label_of(ra, rb)))

    out = {"command": " ".join(["python -m bench.duplicates_matchers", *sys.argv[1:]]), "pairs": len(pairs),
           "labels": {lab: sum(1 for *_, x in pairs if x == lab) for lab in sorted({x for *_, x in pairs})},
           "min_inliers": cfg.min_inliers, "machine": machine_info(), "matchers": {}}
    exact_ok = None
    for name, match in matchers().items():
        inliers, t0 = [], time.process_time()
        for fa, fb, _ in pairs:
            v = verify_pair(fa, fb, match=match)
            inliers.append(0 if v is None else v.inliers)
        cpu_ms = 1e3 * (time.process_time() - t0) / max(1, len(pairs))
        ok = np.array(inliers) >= cfg.min_inliers
        exact_ok = ok if exact_ok is None else exact_ok
        row = {"cpu_ms_per_pair": cpu_ms,
               "verified_by_label": {lab: int(sum(o for o, (*_, x) in zip(ok, pairs, strict=True) if x == lab))
                                     for lab in out["labels"]},
               "lost_vs_exact": int((exact_ok & ~ok).sum()), "gained_vs_exact": int((~exact_ok & ok).sum()),
               "median_inliers_of_exact_verified": float(np.median(np.array(inliers)[exact_ok]))
               if exact_ok.any() else None}
        out["matchers"][name] = row
        print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    out["loadavg_1m_at_end"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
