"""The group stage's settings on the labelled set: how sure a crop must be before it is paired with every image
that contains it, and whether containment is followed through crops of crops (issue 26, crop target).

Reads the stored run of ``scripts/eval_duplicates.py`` (``--work``, ``--seed``), removes the pairs its group stage
added (``PairTable.by_group`` 2) and every mark, and runs the group stage again (``finder._group_pairs``, as
``update_pairs`` runs it: decided by the shipped thresholds, pairs new to the table scored, checked and verified
with the evaluation run's settings) once per variant:

- ``off``: no group stage;
- ``sure-X``: ``SURE_CROP_NCC`` = X, containment followed through crops of crops (the shipped stage at its value);
- ``direct-X``: the same, the copies of each direct container only (``group_candidates(chain=False)``);
- ``unclosed-X``, ``nosiblings-X``: the same without the pairs within each duplicate group (``closed=False``) or
  without the pairs of sure crops of one group (``siblings=False``); ``open-X``: without both (the stage before
  2026-11-30, afternoon);
- ``gates-G``: the shipped stage with ``verify_floor`` and ``template_floor`` raised to G (decided and measured
  with them): fewer pairs verified and searched (``verified`` and ``searched``: fractions of the split's candidate
  pairs, as ``scripts/eval_duplicates.py`` counts them), and the stage lifting the gates where a crop is sure.

For each, both splits' crop direction (the target), crop precision, crops reported on unrelated pairs and the
edited-copy figures under the shipped thresholds. Not a timing run. Usage::

    python -m bench.duplicates_group_variants --work /work/cache/dup-eval-gc-s1 --seed 1 \\
        --json docs/results/duplicates/group-variants-seed1.json
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from bench.duplicates_labelled import stored_run, stored_run_parser

VARIANTS = "off,open-0.85,unclosed-0.85,nosiblings-0.85,sure-0.80,sure-0.85,sure-0.90,sure-0.95,sure-0.98,direct-0.85"


def main() -> None:
    p = stored_run_parser(__doc__)
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    import numpy as np

    from regis.duplicates import finder
    from regis.duplicates import relations as rel
    from regis.duplicates.config import DuplicateConfig

    run = stored_run(args.work, args.corpus, args.seed)
    ev_mod, cfg = run.ev_mod, run.cfg
    # the evaluation run's settings (scripts/eval_duplicates.py: every candidate verified and searched)
    run_cfg = DuplicateConfig(floor=ev_mod.RUN_FLOOR, neighbours=ev_mod.RUN_NEIGHBOURS, prefilter=0,
                              min_inliers=max(ev_mod.GRID["min_inliers"]))
    records = run.snapshot.table.get_many(run.snapshot.store.live_ids.tolist())
    resolve = finder.index_file_resolver(run.snapshot)
    base = run.stored.table.take(run.stored.table.by_group < 2)
    base.by_group[:] = 0
    shipped = finder.group_candidates, finder.SURE_CROP_NCC
    out = {"command": " ".join(["python -m bench.duplicates_group_variants", *sys.argv[1:]]),
           "shipped_sure_crop_ncc": shipped[1], "join_pairs": len(base), "variants": {}}
    try:
        for name in args.variants.split(","):
            kind, _, value = name.partition("-")
            table, facts = base.take(np.ones(len(base), bool)), {}
            decide = cfg
            if kind == "gates":
                decide = cfg.with_overrides({"verify_floor": float(value), "template_floor": float(value)})
            if kind != "off":
                finder.SURE_CROP_NCC = shipped[1] if kind == "gates" else float(value)
                finder.group_candidates = functools.partial(shipped[0], chain=kind != "direct",
                                                            closed=kind not in ("open", "unclosed"),
                                                            siblings=kind not in ("open", "nosiblings"))
                table, facts = finder._group_pairs(run.snapshot, table, records, resolve, run_cfg, decide,
                                                   args.workers, None)
            res = {"group_stage": facts}
            for split in ("calibration", "test"):
                ev = ev_mod.as_run(ev_mod.evaluation(run.labelled, run.splits, run.snapshot, table, split), decide)
                m = ev_mod.pair_metrics(ev, *rel.classify(ev.table, decide), decide)
                c = m["crops"]
                sized = ev.small_side < decide.template_max_side if decide.template_max_side else None
                res[split] = {"crop_direction": round(c["direction_right_of_all"], 4),
                              "crop_pairs_right": c["direction_right"], "crop_pairs": c["labelled_pairs"],
                              "crop_precision": round(c["precision"], 4),
                              "crops_on_unrelated_pairs": c["reported_by_label"]["unrelated"],
                              "edited_precision": round(m["edited"]["precision"], 4),
                              "edited_recall": round(m["edited"]["recall"], 4),
                              "verified": round(ev_mod.verified_fraction(ev.table, decide, decide.verify_floor), 4),
                              "searched": round(ev_mod.located_fraction(ev.table, decide, decide.template_floor,
                                                                        sized), 4)}
            out["variants"][name] = res
            print(f"{name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    finally:
        finder.group_candidates, finder.SURE_CROP_NCC = shipped
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
