"""Why the labelled set's crop pairs are not named right: where each one stops (issue 26, crop target).

Reads the stored run of ``scripts/eval_duplicates.py`` (``--work``, ``--seed``) and puts every labelled crop pair
(a crop of 10-70 % of the area and one of its containers) of each split into the first bucket that fits, with the
shipped thresholds:

- ``crop, container right``: the relations call it a crop and name its container (the target's numerator;
  ``crop, container wrong`` beside it);
- ``not a candidate``: the self-join did not keep the pair (each image keeps its ``neighbours`` best pairs);
- ``below the floor``: kept by the run (its floor is lower) but below the shipped ``floor`` (and not paired through
  a sure crop, ``PairTable.by_group``, to which the floor does not apply);
- ``template peak below template_ncc``: searched by template, neither direction reached the rule's NCC;
- ``neither verified nor searched``: fewer inliers than ``min_inliers`` and outside the template search's gates;
- ``other: <relation>``: anything else (called an edited copy or the same scene, or no relation: the template
  rule's margin or window area).

Usage::

    python -m bench.duplicates_crop_misses --work /work/cache/dup-eval-s1 --seed 1 \\
        --json docs/results/duplicates/crop-misses-seed1.json
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from bench.duplicates_labelled import stored_run, stored_run_parser


def main() -> None:
    p = stored_run_parser(__doc__)
    args = p.parse_args()

    import numpy as np

    from regis.duplicates import relations as rel

    run = stored_run(args.work, args.corpus, args.seed)
    ev_mod, cfg = run.ev_mod, run.cfg
    out = {"command": " ".join(["python -m bench.duplicates_crop_misses", *sys.argv[1:]]),
           "neighbours": run.stored.settings.get("candidates", {}).get("neighbours"), "splits": {}}
    for split in ("calibration", "test"):
        ev = ev_mod.as_run(ev_mod.evaluation(run.labelled, run.splits, run.snapshot, run.stored.table, split), cfg)
        t = ev.table  # as a shipped run leaves it (the template search only below template_max_side)
        relation, container = rel.classify(t, cfg)
        inner_right = container == np.where(ev.small_is_a, t.b, t.a)
        s_hi = np.maximum(t.s_ab, t.s_ba)
        buckets: collections.Counter = collections.Counter()
        for r in np.flatnonzero(ev.label == ev_mod.LABELS["crop"]).tolist():
            if s_hi[r] < cfg.floor and t.by_group[r] == 0:  # paired through a sure crop: its evidence decides
                why = "below the floor"
            elif relation[r] == rel.CROP:
                why = "crop, container right" if inner_right[r] else "crop, container wrong"
            elif t.located[r] and max(t.ncc_ab[r], t.ncc_ba[r]) < cfg.template_ncc:
                why = "template peak below template_ncc"
            elif not t.located[r] and t.inliers[r] < cfg.min_inliers:
                why = "neither verified nor searched"
            else:
                why = f"other: {rel.NAMES.get(int(relation[r]), 'none')}"
            buckets[why] += 1
        buckets["not a candidate"] = ev.counts["crop"] - sum(buckets.values())
        out["splits"][split] = {"crop_pairs": ev.counts["crop"], "buckets": dict(buckets.most_common())}
        print(f"[{split}] {out['splits'][split]}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
