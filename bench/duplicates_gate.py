"""Stronger gates before geometric verification, measured on the labelled set's stored evidence (issue 26, scale).

Verification (ORB match, homography, template search) is about 95 % of a duplicates run, and the shipped gate
(``verify_floor``: MaxSim per token in either direction) sends most candidate pairs to it. This script tries
other gates on the evidence ``scripts/eval_duplicates.py`` stored (its run verifies every candidate pair and
template-searches every pair with fewer than 20 inliers, so a gated run is simulated exactly: a pair outside the
gate keeps only its token scores, as a run with that gate would leave it):

- ``best_token``: the highest cosine between any token of one image and any token of the other (the self-join's
  scoring computes every such cosine; first framing's tokens, as the join);
- ``s_hi``: the shipped gate's score, max(S(a, b), S(b, a)) / T, for reference;
- ``relative_k<k>``: the shipped score less a background level of the pair's images (hubness correction, as CSLS
  of Conneau et al. 2018 does for nearest neighbours): s_hi - min(r_a, r_b), where r_x is the k-th best s_hi among
  image x's candidate pairs above the floor (the floor when it has fewer), from the stored run's own pairs: an
  image that resembles everything (sky, foliage) needs a higher score before its pairs are verified;
- ``template_side``: the template search only for pairs whose smaller image's longest side is below a size
  (ORB works at ``verify_side`` = 640 px; the template search exists for crops of small images, which ORB misses
  once they are enlarged to that side).

For each gate and threshold: the objective of the calibration (edited-copy recall + crop-direction accuracy,
under its constraints, ``eval_duplicates._score``) on the calibration split, the share of candidate pairs
verified (or template-searched), and the test split's figures at the threshold the calibration rule would pick
(the highest within ``PLATEAU`` of the objective without the gate).

Usage::

    python -m bench.duplicates_gate --work /work/cache/dup-eval --json docs/results/duplicates/gates.json
    python -m bench.duplicates_gate --work /work/cache/dup-eval-n16 --json docs/results/duplicates/gates-relative.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.duplicates_labelled import stored_run, stored_run_parser

BEST_TOKEN = [None, 0.60, 0.65, 0.70, 0.75, 0.78, 0.80, 0.82, 0.84, 0.86, 0.88, 0.90]
S_HI = [None, 0.40, 0.45, 0.50, 0.55, 0.60]
RELATIVE_K = [8, 12, 16]
RELATIVE = [None, -0.02, 0.0, 0.02, 0.05]
TEMPLATE_SIDE = [None, 1024, 800, 640, 480, 400, 320]


def best_token(snapshot, a: np.ndarray, b: np.ndarray, tokens: int) -> np.ndarray:
    """(p,) float32: max over token pairs of <a_i, b_j> for each pair (a[k], b[k]), the first ``tokens`` tokens
    of each image (unit vectors: cosines)."""
    ids = np.unique(np.concatenate([a, b]))
    toks = snapshot.store.get(ids, tokens=tokens).astype(np.float32)
    row = {int(i): k for k, i in enumerate(ids.tolist())}
    out = np.empty(len(a), np.float32)
    for k, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        out[k] = float((toks[row[x]] @ toks[row[y]].T).max())
    return out


def background(table, floor: float, k: int) -> dict[int, float]:
    """image id -> the k-th best max(S(a, b), S(b, a)) / T among its pairs in ``table`` at or above ``floor``
    (``floor`` when it has fewer than k)."""
    s = np.maximum(table.s_ab, table.s_ba)
    keep = s >= floor
    ends = np.concatenate([table.a[keep], table.b[keep]])
    score = np.concatenate([s[keep], s[keep]])
    order = np.lexsort((-score, ends))
    ends, score = ends[order], score[order]
    ids, start, count = np.unique(ends, return_index=True, return_counts=True)
    return {int(i): float(score[s0 + k - 1]) if c >= k else floor
            for i, s0, c in zip(ids.tolist(), start.tolist(), count.tolist(), strict=True)}


def gated(ev, verify_mask: np.ndarray | None = None, locate_mask: np.ndarray | None = None):
    """A copy of ``ev`` whose pairs outside ``verify_mask`` were never verified nor searched, and outside
    ``locate_mask`` never searched by template (None: no change)."""
    import copy

    t = ev.table.take(np.ones(len(ev.table), dtype=bool))
    if verify_mask is not None:
        t.inliers = np.where(verify_mask, t.inliers, 0).astype(t.inliers.dtype)
        t.matches = np.where(verify_mask, t.matches, 0).astype(t.matches.dtype)
        t.located = t.located & verify_mask
    if locate_mask is not None:
        t.located = t.located & locate_mask
    out = copy.copy(ev)
    out.table = t
    return out


def main() -> None:
    p = stored_run_parser(__doc__, work="/work/cache/dup-eval")
    args = p.parse_args()

    from regis.duplicates.finder import to_verify

    run = stored_run(args.work, args.corpus, args.seed)
    ev_mod, cfg, labelled, snapshot, stored, splits = (run.ev_mod, run.cfg, run.labelled, run.snapshot, run.stored,
                                                        run.splits)
    enc = snapshot.manifest.encoder
    tokens = enc.tokens_per_image // enc.framings
    recs = snapshot.table.get_many(snapshot.store.live_ids.tolist())
    long_side = {i: max(r.width, r.height) for i, r in recs.items()}

    out = {"command": " ".join(["python -m bench.duplicates_gate", *sys.argv[1:]]), "tokens_per_pair_side": tokens,
           "config": cfg.model_dump(exclude={"calibration"}), "splits": {}}
    for split in ("calibration", "test"):
        ev = ev_mod.evaluation(labelled, splits, snapshot, stored.table, split)
        t = ev.table
        feats = {"best_token": best_token(snapshot, t.a, t.b, tokens), "s_hi": np.maximum(t.s_ab, t.s_ba)}
        for k in RELATIVE_K:
            r = background(stored.table, cfg.floor, k)
            ra = np.array([r.get(int(x), cfg.floor) for x in t.a])
            rb = np.array([r.get(int(x), cfg.floor) for x in t.b])
            feats[f"relative_k{k}"] = feats["s_hi"] - np.minimum(ra, rb)
        small_side = np.minimum([long_side[int(x)] for x in t.a], [long_side[int(x)] for x in t.b])
        cand = (np.maximum(t.s_ab, t.s_ba) >= cfg.floor) & ~t.exact
        base_verify = np.zeros(len(t), dtype=bool)
        base_verify[to_verify(t, cfg)] = True
        base_verify &= cand
        searched = base_verify & t.files & (t.inliers < cfg.min_inliers)
        if cfg.template_floor is not None:
            searched &= np.maximum(t.s_ab, t.s_ba) >= cfg.template_floor
        res = {"candidates": int(cand.sum()), "shipped": {
            "objective": ev_mod._score(ev, cfg, ev_mod.MIN_CROP_PRECISION),
            "verified_share": float(base_verify.sum() / max(1, cand.sum())),
            "searched_share": float(searched.sum() / max(1, cand.sum()))}}
        grids = [("best_token", BEST_TOKEN), ("s_hi", S_HI)] + [(f"relative_k{k}", RELATIVE) for k in RELATIVE_K]
        for name, grid in grids:
            rows = []
            for thr in grid:
                mask = np.ones(len(t), dtype=bool) if thr is None else feats[name] >= thr
                g = gated(ev, verify_mask=mask)
                m = ev_mod.pair_metrics(g, *ev_mod.rel.classify(g.table, cfg), cfg)
                rows.append({"threshold": thr, "objective": ev_mod._score(g, cfg, ev_mod.MIN_CROP_PRECISION),
                             "verified_share": float((base_verify & mask).sum() / max(1, cand.sum())),
                             "searched_share": float((searched & mask).sum() / max(1, cand.sum())),
                             "edited_recall": m["edited"]["recall"], "edited_precision": m["edited"]["precision"],
                             "crop_direction": m["crops"]["direction_right_of_all"],
                             "crop_precision": m["crops"]["precision"],
                             "scene_called_duplicates": m["scene"]["called_duplicates"]})
            res[name] = rows
        rows = []
        for side in TEMPLATE_SIDE:
            mask = np.ones(len(t), dtype=bool) if side is None else small_side < side
            g = gated(ev, locate_mask=mask)
            m = ev_mod.pair_metrics(g, *ev_mod.rel.classify(g.table, cfg), cfg)
            rows.append({"max_side": side, "objective": ev_mod._score(g, cfg, ev_mod.MIN_CROP_PRECISION),
                         "searched_share": float((searched & mask).sum() / max(1, cand.sum())),
                         "crop_direction": m["crops"]["direction_right_of_all"],
                         "crop_precision": m["crops"]["precision"]})
        res["template_side"] = rows
        res["small_side_px_quartiles"] = np.percentile(small_side[cand], [25, 50, 75]).tolist()
        out["splits"][split] = res
        print(f"[{split}] shipped {res['shipped']}", file=sys.stderr)
        for name in [g for g, _ in grids] + ["template_side"]:
            for r in res[name]:
                print(f"  {name} {json.dumps(r, default=float)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
