"""Where geometric verification's time goes, stage by stage, on real candidate pairs (issue 26, scale).

The labelled set's index (``scripts/eval_duplicates.py``, ``--work``) is self-joined with the shipped thresholds;
of the pairs the shipped gates verify (``finder.to_verify``) a random sample (seed 0) is verified on one thread,
each stage timed in CPU seconds of this process (``time.process_time``): feature extraction (decode, reduce to
``verify_side``, ORB, the template thumbnail; once per image), the cheap first match (``geometry.prefilter``), the
full descriptor match (``geometry.nearest_two``), the homography and covers (the rest of ``verify_pair``), and
the template search (``template.locate``) on the pairs the geometry leaves under ``min_inliers`` (and inside
``template_floor`` and ``template_max_side``), as the finder does. Also counted: how many pairs end at each step
(too few matches for a homography, no sane homography, fewer inliers than ``min_inliers``, verified), by the
set's label, and the image sizes of the pairs the template search finds a crop in.

Usage::

    python -m bench.duplicates_verify --work /work/cache/dup-eval --sample 1000 \\
        --json docs/results/duplicates/verify-stages.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _timed(fn, *args, **kwargs):
    t0 = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - t0


def profile_pair(fa, fb, cfg, s_hi: float, small_side: int) -> dict:
    """One pair through the finder's steps (``finder._verify``'s ``one``), each step's CPU seconds and its end."""
    from regis.duplicates import geometry as g
    from regis.duplicates.template import locate

    row = {"prefilter_s": 0.0, "match_s": 0.0, "homography_s": 0.0, "template_s": 0.0, "matches": 0,
           "inliers": 0, "end": "no_features"}
    if len(fa.descriptors) < 2 or len(fb.descriptors) < 2:
        return row
    row["pre"], row["prefilter_s"] = _timed(g.prefilter, fa, fb)
    (query, _), row["match_s"] = _timed(g.nearest_two, fa.descriptors, fb.descriptors)
    row["matches"] = len(query)
    v, t_all = _timed(g.verify_pair, fa, fb)  # the match again, then the homography: the rest is the homography
    row["homography_s"] = max(0.0, t_all - row["match_s"])
    if len(query) < g.MIN_MATCHES:
        row["end"] = "too_few_matches"
    elif v is None:
        row["end"] = "no_sane_homography"
    else:
        row["inliers"] = v.inliers
        row["end"] = "verified" if v.inliers >= cfg.min_inliers else "few_inliers"
    if row["end"] != "verified" and fa.thumb is not None and fb.thumb is not None and (
            cfg.template_floor is None or s_hi >= cfg.template_floor) and (
            cfg.template_max_side is None or small_side < cfg.template_max_side):
        loc, row["template_s"] = _timed(locate, fa.thumb, fb.thumb)
        row["ncc"] = max(loc.ncc_ab, loc.ncc_ba)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/work/cache/dup-eval")
    p.add_argument("--sample", type=int, default=1000, help="verified candidate pairs profiled (random, seed 0)")
    p.add_argument("--json")
    args = p.parse_args()

    import cv2

    from bench.common import machine_info
    from bench.duplicates_labelled import gated_sample
    from regis.duplicates.finder import to_verify
    from regis.duplicates.geometry import local_features

    cv2.setNumThreads(1)
    cfg, root, recs, t, rows, label_of = gated_sample(args.work, args.sample)

    feats, feat_s = {}, []
    out_rows = []
    for r in rows.tolist():
        ra, rb = recs[int(t.a[r])], recs[int(t.b[r])]
        for rec in (ra, rb):
            if rec.path not in feats:
                feats[rec.path], s = _timed(local_features, root / "files" / rec.path, cfg.verify_side,
                                            cfg.features)
                feat_s.append(s)
        label = label_of(ra, rb)
        row = {"label": label, "s_hi": float(max(t.s_ab[r], t.s_ba[r])),
               "min_side": min(ra.width, ra.height, rb.width, rb.height),
               "small_long_side": min(max(ra.width, ra.height), max(rb.width, rb.height))}
        row.update(profile_pair(feats[ra.path], feats[rb.path], cfg, row["s_hi"], row["small_long_side"]))
        out_rows.append(row)

    n = len(out_rows)
    ms = {k: 1e3 * sum(r[k] for r in out_rows) / max(1, n)
          for k in ("prefilter_s", "match_s", "homography_s", "template_s")}
    searched = [r for r in out_rows if "ncc" in r]
    ends: dict = {}
    for r in out_rows:
        ends.setdefault(r["end"], {}).setdefault(r["label"], 0)
        ends[r["end"]][r["label"]] += 1
    crops_by_template = [r for r in searched if r["ncc"] >= cfg.template_ncc]
    out = {
        "command": " ".join(["python -m bench.duplicates_verify", *sys.argv[1:]]),
        "config": {k: getattr(cfg, k) for k in ("verify_side", "features", "min_inliers", "verify_floor",
                                               "verify_ceiling", "template_floor", "template_ncc")},
        "candidate_pairs": int(len(t)), "gated_pairs": int(len(to_verify(t, cfg))), "pairs_profiled": n,
        "labels": {lab: sum(1 for r in out_rows if r["label"] == lab)
                   for lab in sorted({r["label"] for r in out_rows})},
        "cpu_ms": {"feature_extraction_per_image": 1e3 * float(np.mean(feat_s)) if feat_s else None,
                   "images": len(feat_s),
                   "per_gated_pair": {k.replace("_s", ""): v for k, v in ms.items()},
                   "template_per_searched_pair": 1e3 * sum(r["template_s"] for r in searched) / max(1, len(searched))},
        "template_searched_share": len(searched) / max(1, n),
        "ends": ends,
        "template_ncc_reached": {"pairs": len(crops_by_template),
                                 "by_label": {lab: sum(1 for r in crops_by_template if r["label"] == lab)
                                              for lab in sorted({r["label"] for r in crops_by_template})},
                                 "small_long_side_px": sorted(r["small_long_side"] for r in crops_by_template)},
        "machine": {**machine_info(), "loadavg_1m_at_end": os.getloadavg()[0]},
        "rows": out_rows,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1, default=float), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
