"""The template search without its full-size pass where the half-size pass found nothing (issue 26, scale).

``regis.duplicates.template.locate`` searches each direction of a pair at 20 scales at half size, then the 3 best
at full size. With ``refine_from``, a direction whose best half-size peak is below it is not searched at full
size (its half-size peak is reported: below any crop threshold, so no crop is called from it). This script runs
both on every labelled crop pair of the labelled set (``scripts/eval_duplicates.py``'s) and on a sample of the
candidate pairs a run verifies (the shipped self-join and gate: mostly unrelated photos), and reports the CPU
time per pair (process time, one thread) and every pair whose template decision (crop or not at the shipped
``template_ncc`` and ``template_max_area``, and which image is inside) changes.

Usage::

    python -m bench.duplicates_template --work /work/cache/dup-eval --refine-from 0.7 --sample 1500 \\
        --json docs/results/duplicates/template-refine.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/work/cache/dup-eval")
    p.add_argument("--refine-from", type=float, default=0.7)
    p.add_argument("--sample", type=int, default=1500, help="candidate pairs searched (random, seed 0)")
    p.add_argument("--json")
    args = p.parse_args()

    from bench.duplicates_labelled import shipped_candidates
    from regis.data.near_duplicates import labelled_pairs
    from regis.duplicates.finder import to_verify
    from regis.duplicates.geometry import load_gray
    from regis.duplicates.template import locate, thumbnail

    cfg, root, labelled, snap, recs, t = shipped_candidates(args.work)
    labels = labelled_pairs(labelled.items)
    rows = to_verify(t, cfg)
    rng = np.random.default_rng(0)
    rows = rng.choice(rows, size=min(args.sample, len(rows)), replace=False)
    pairs = [("crop", a, b, cont) for (a, b), (lab, cont) in labels.items() if lab == "crop"]
    for r in rows:
        fa, fb = recs[int(t.a[r])].path, recs[int(t.b[r])].path
        lab, cont = labels.get(tuple(sorted((fa, fb))), ("unrelated", None))
        pairs.append(("candidate:" + lab, fa, fb, cont))
    thumbs: dict = {}

    def thumb(f: str):
        if f not in thumbs:
            thumbs[f] = thumbnail(load_gray(root / "files" / f, cfg.verify_side))
        return thumbs[f]

    def decide(loc) -> tuple[bool, bool]:
        area = float((loc.box[2] - loc.box[0]) * (loc.box[3] - loc.box[1]))
        return (max(loc.ncc_ab, loc.ncc_ba) >= cfg.template_ncc and area <= cfg.template_max_area,
                loc.ncc_ab > loc.ncc_ba)

    cpu = {"before": 0.0, "after": 0.0}
    counts: dict = {}
    changed = []
    right = {"before": 0, "after": 0}
    for kind, fa, fb, cont in pairs:
        a, b = thumb(fa), thumb(fb)
        t0 = time.process_time()
        old = locate(a, b)
        t1 = time.process_time()
        new = locate(a, b, refine_from=args.refine_from)
        t2 = time.process_time()
        group = "crop" if kind == "crop" else "candidate"
        cpu[group + "_before"] = cpu.get(group + "_before", 0.0) + t1 - t0
        cpu[group + "_after"] = cpu.get(group + "_after", 0.0) + t2 - t1
        counts[kind] = counts.get(kind, 0) + 1
        d0, d1 = decide(old), decide(new)
        if kind == "crop":
            inside_a = cont == fb
            right["before"] += d0[0] and d0[1] == inside_a
            right["after"] += d1[0] and d1[1] == inside_a
        if d0 != d1:
            changed.append({"kind": kind, "a": fa, "b": fb, "before": [old.ncc_ab, old.ncc_ba],
                            "after": [new.ncc_ab, new.ncc_ba]})
    n_crop = counts.get("crop", 0)
    n_cand = len(pairs) - n_crop
    out = {"command": " ".join(["python -m bench.duplicates_template", *sys.argv[1:]]),
           "refine_from": args.refine_from, "pairs": counts, "decisions_changed": len(changed), "changed": changed,
           "crop_pairs_found_by_template_with_right_direction": right,
           "cpu_ms_per_pair": {"crop_before": cpu.get("crop_before", 0) / max(1, n_crop) * 1e3,
                               "crop_after": cpu.get("crop_after", 0) / max(1, n_crop) * 1e3,
                               "candidate_before": cpu.get("candidate_before", 0) / max(1, n_cand) * 1e3,
                               "candidate_after": cpu.get("candidate_after", 0) / max(1, n_cand) * 1e3},
           "loadavg_1m_at_end": os.getloadavg()[0]}
    print(json.dumps({k: v for k, v in out.items() if k != "changed"}, indent=1), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
