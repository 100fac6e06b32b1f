"""A crop of one copy is a crop of every copy: crop pairs inferred through duplicate groups, simulated on the
labelled set's stored run (issue 26, crop target; measured, not shipped).

Most of the labelled crop pairs that are not named right never became candidates (``bench.duplicates_crop_misses``):
a small crop's tokens rank unrelated photos above some of its 7 containers (the photo, its byte and pixel copies, its
4 edited copies). But when the crop is found in one of them, the others are in that one's duplicate group (exact and
edited copies, connected components), and a crop of one copy of a photo is a crop of every copy. This script
classifies the stored run's pairs with the shipped thresholds (as a shipped run leaves them:
``eval_duplicates.as_run``), groups the images as ``regis.duplicates.groups`` does, and for every crop pair that is
*confident* (the template search's peak >= ``--ncc`` in its better direction, or verified geometrically: at least
``min_inliers`` inliers) reports the crop as a crop of every member of its container's group (not of its own);
then counts, per split, the crop target (labelled crop pairs with the container named right, over all of them) and
crop precision (reported crop pairs that are labelled crops), direct and with the inferred pairs.

Usage::

    python -m bench.duplicates_crop_inference --work /work/cache/dup-eval-n16 --seed 0 \\
        --json docs/results/duplicates/crop-inference-seed0.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.duplicates_labelled import stored_run, stored_run_parser


def inferred(t, relation, container, confident) -> dict[tuple[int, int], int]:
    """(a, b) with a < b -> container id: the crop pairs of ``t`` plus, for each confident one, its crop paired with
    every other member of its container's duplicate group (exact and edited copies; not its own group)."""
    from regis.duplicates import relations as rel
    from regis.duplicates.groups import copy_groups

    group = copy_groups(t, relation)
    rows = np.flatnonzero(relation == rel.CROP)
    out = {(int(t.a[r]), int(t.b[r])): int(container[r]) for r in rows}
    for r in rows[confident[rows]].tolist():
        outer = int(container[r])
        inner = int(t.b[r]) if outer == int(t.a[r]) else int(t.a[r])
        for q in group[outer]:
            if group[q] is not group[inner]:  # one list per group
                out.setdefault((min(inner, q), max(inner, q)), q)
    return out


def figures(reported: dict, ev) -> dict:
    """The crop target and crop precision of ``reported`` ((a, b) -> container) against the split's labels."""
    labels = ev.pair_labels
    right = sum(1 for key, cont in reported.items() if labels.get(key, ("unrelated", -1)) == ("crop", cont))
    true = sum(1 for key in reported if labels.get(key, ("unrelated", -1))[0] == "crop")
    return {"direction_right_of_all": right / max(1, ev.counts["crop"]), "direction_right": right,
            "labelled_crop_pairs": ev.counts["crop"], "reported": len(reported),
            "precision": true / max(1, len(reported))}


def main() -> None:
    p = stored_run_parser(__doc__)
    p.add_argument("--ncc", default="0.9,0.95", help="comma-separated template peaks that make a crop confident")
    args = p.parse_args()

    from regis.duplicates import relations as rel

    run = stored_run(args.work, args.corpus, args.seed)
    ev_mod, cfg = run.ev_mod, run.cfg
    out = {"command": " ".join(["python -m bench.duplicates_crop_inference", *sys.argv[1:]]), "splits": {}}
    for split in ("calibration", "test"):
        ev = ev_mod.as_run(ev_mod.evaluation(run.labelled, run.splits, run.snapshot, run.stored.table, split), cfg)
        t = ev.table
        relation, container = rel.classify(t, cfg)
        none = np.zeros(len(t), dtype=bool)
        res = {"direct": figures(inferred(t, relation, container, none), ev),
               "every crop": figures(inferred(t, relation, container, ~none), ev)}
        for ncc in (float(x) for x in args.ncc.split(",")):
            sure = (np.maximum(t.ncc_ab, t.ncc_ba) >= ncc) | (t.inliers >= cfg.min_inliers)
            res[f"ncc >= {ncc} or verified"] = figures(inferred(t, relation, container, sure), ev)
        out["splits"][split] = res
        for name, f in res.items():
            print(f"[{split}] {name}: crop direction {f['direction_right_of_all']:.3f} ({f['direction_right']}/"
                  f"{f['labelled_crop_pairs']}), precision {f['precision']:.3f} of {f['reported']}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
