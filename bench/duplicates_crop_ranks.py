"""Where the labelled set's crop pairs rank among each image's candidates (issue 26, crop target).

A crop pair (a crop of 10-70 % of the area and one of its containers) is a candidate of the self-join only when one
of its two images keeps the other among its ``neighbours`` best pairs. This script scores every image of a split
against every other exactly (``selfjoin.score_against``: the join's own scoring, no FAISS approximation) and
reports, for each labelled crop pair, the rank of the container in the crop's list and of the crop in the
container's, under several candidate rankings:

- ``max``: max(S(a, b), S(b, a)) / T, what the join ranks by today;
- ``csls-K``: the same minus half of each image's background level, the mean of its K best scores (hubness
  correction, as CSLS in cross-lingual retrieval: an image that scores high with everything ranks lower);

and, per crop, the best rank of any of its containers (step 5b of the finder pairs a crop found in one copy with
the rest of the copy group).

Usage::

    python -m bench.duplicates_crop_ranks --work /work/cache/dup-eval-s1 --seed 1 \\
        --json docs/results/duplicates/crop-ranks-seed1.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.duplicates_labelled import stored_run, stored_run_parser

CUTS = (16, 24, 32, 64)


def all_scores(snapshot, ids):
    """(n, n) float32 max(S(a, b), S(b, a)) / T between every two of ``ids`` (diagonal -inf)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from regis.duplicates.selfjoin import score_against

    width = snapshot.store.tokens_per_image
    n = len(ids)
    out = np.full((n, n), -np.inf, np.float32)
    with threadpool_limits(limits=2, user_api="blas"):
        for i in range(n):
            q = snapshot.store.get(ids[i:i + 1], width)[0].astype(np.float32)
            f, r = score_against(snapshot, q, ids)
            out[i] = np.maximum(f, r)
    np.fill_diagonal(out, -np.inf)
    return out


def ranks(score, rows, cols):
    """(p,) rank (0: best) of column ``cols[k]`` in row ``rows[k]`` of ``score``."""
    import numpy as np

    return np.array([int((score[r] > score[r, c]).sum()) for r, c in zip(rows, cols, strict=True)], np.int64)


def csls(score, k):
    """``score`` minus half of each row's and each column's background (the mean of its k best)."""
    import numpy as np

    bg = np.sort(score, axis=1)[:, -k:].mean(axis=1)
    return score - 0.5 * (bg[:, None] + bg[None, :])


def main() -> None:
    p = stored_run_parser(__doc__)
    p.add_argument("--csls", default="8,16", help="background sizes K of the csls rankings")
    args = p.parse_args()

    import numpy as np


    run = stored_run(args.work, args.corpus, args.seed)
    neighbours = run.cfg.neighbours
    out = {"command": " ".join(["python -m bench.duplicates_crop_ranks", *sys.argv[1:]]), "neighbours": neighbours,
           "splits": {}}
    ids = run.snapshot.store.live_ids  # every image: a crop's candidates come from the whole set
    pos = {int(x): i for i, x in enumerate(ids.tolist())}
    raw = all_scores(run.snapshot, ids)
    rankings = {"max": raw, **{f"csls-{k}": csls(raw, int(k)) for k in args.csls.split(",")}}
    for split in ("calibration", "test"):
        ev = run.ev_mod.evaluation(run.labelled, run.splits, run.snapshot, run.stored.table, split)
        crops = [(a, b, cont) for (a, b), (lab, cont) in ev.pair_labels.items() if lab == "crop"]
        inner = np.array([pos[b if cont == a else a] for a, b, cont in crops], np.int64)
        outer = np.array([pos[cont] for _, _, cont in crops], np.int64)
        res = {"crop_pairs": len(crops), "crops": int(len(np.unique(inner)))}
        for name, sc in rankings.items():
            r_in, r_out = ranks(sc, inner, outer), ranks(sc, outer, inner)
            best = np.minimum(r_in, r_out)
            # per crop: its best-ranked container (step 5b brings the rest of the copy group)
            per_crop = {}
            for i, b in zip(inner.tolist(), best.tolist(), strict=True):
                per_crop[i] = min(per_crop.get(i, 1 << 30), b)
            pc = np.array(list(per_crop.values()))
            res[name] = {f"pairs within {c}": int((best < c).sum()) for c in CUTS}
            res[name].update({f"crops with a container within {c}": int((pc < c).sum()) for c in CUTS})
        out["splits"][split] = res
        print(f"[{split}] {json.dumps(res)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
