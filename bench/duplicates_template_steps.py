"""A cheaper template search, checked on every pair the labelled set's run searched (issue 26, scale).

``template.locate`` searches each direction at ``STEPS`` (20) scales at half size, then the 3 best at full size;
the half-size pass is about three quarters of its CPU. This script searches again, with fewer half-size scales
(``--variants``; ``s``: each refined scale also half a coarse step either side; ``pN``: every scale at quarter
size first, only its N best at half size; ``r``: full size only where the peak before nears the rule), every
pair the stored run of ``scripts/eval_duplicates.py`` searched, puts the new peaks and windows in a copy of the
stored evidence, and measures every target of both splits with the shipped thresholds
(``eval_duplicates.measure``), beside the stored search's; the CPU time per pair (one thread, process time) of
each variant and of the shipped search, alternated pair by pair on a sample.

Usage::

    python -m bench.duplicates_template_steps --work /work/cache/dup-eval --variants 20,10,10s,14 \\
        --json docs/results/duplicates/template-steps.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.duplicates_labelled import stored_run, stored_run_parser


def parse_variant(text: str) -> tuple[int, bool, int | None, bool]:
    """"10s" -> (10, True, None, False): half-size scales, and whether refined scales spread half a step either
    side; "20p5" -> (20, False, 5, False): every scale at quarter size, the 5 best of them at half size
    (``locate(pyramid=)``); a trailing "r": a direction is searched at full size only when its peak before
    reaches ``template_ncc`` - ``template.REFINE_BELOW_RULE`` (``locate(refine_from=)``)."""
    quick = text.endswith("r")
    head, _, keep = (text[:-1] if quick else text).partition("p")
    spread = head.endswith("s")
    steps = int(head[:-1] if spread else head)
    if steps < 2 or (keep and int(keep) < 1):
        raise SystemExit(f"--variants: {text!r} needs at least 2 scales (and 1 kept)")
    return steps, spread, int(keep) if keep else None, quick


def main() -> None:
    p = stored_run_parser(__doc__, work="/work/cache/dup-eval")
    p.add_argument("--variants", default="10,10s,14", help="comma-separated: scales at half size, 's': spread")
    p.add_argument("--timing-sample", type=int, default=600, help="pairs timed (random, seed 0)")
    args = p.parse_args()

    import cv2

    from bench.common import machine_info
    from regis.duplicates.geometry import load_gray
    from regis.duplicates.template import REFINE_BELOW_RULE, STEPS, locate, thumbnail

    cv2.setNumThreads(1)
    run = stored_run(args.work, args.corpus, args.seed)
    ev_mod, cfg, root, labelled, snapshot, stored, splits = (run.ev_mod, run.cfg, run.root, run.labelled,
                                                              run.snapshot, run.stored, run.splits)
    recs = snapshot.table.get_many(snapshot.store.live_ids.tolist())
    table = stored.table
    rows = np.flatnonzero(table.located)
    thumbs = {}
    for i in np.unique(np.concatenate([table.a[rows], table.b[rows]])).tolist():
        thumbs[i] = thumbnail(load_gray(root / "files" / recs[i].path, cfg.verify_side))
    variants = [parse_variant(v) for v in args.variants.split(",")]

    out = {"command": " ".join(["python -m bench.duplicates_template_steps", *sys.argv[1:]]),
           "searched_pairs": int(len(rows)), "variants": {}, "machine": machine_info()}
    base = {s: ev_mod.measure(ev_mod.evaluation(labelled, splits, snapshot, table, s), cfg)
            for s in ("calibration", "test")}
    out["stored"] = {s: _summary(m) for s, m in base.items()}
    sample = np.random.default_rng(0).choice(rows, size=min(args.timing_sample, len(rows)), replace=False)
    cpu = {"stored": 0.0}
    names = [v for v in args.variants.split(",")]
    refine = cfg.template_ncc - REFINE_BELOW_RULE
    for name, (steps, spread, keep, quick) in zip(names, variants, strict=True):
        cpu[name] = 0.0
        t = table.take(np.ones(len(table), dtype=bool))
        for r in rows.tolist():
            loc = locate(thumbs[int(t.a[r])], thumbs[int(t.b[r])], steps=steps, spread=spread, pyramid=keep,
                         refine_from=refine if quick else None)
            t.ncc_ab[r], t.ncc_ba[r], t.box[r] = loc.ncc_ab, loc.ncc_ba, loc.box
        got = {s: ev_mod.measure(ev_mod.evaluation(labelled, splits, snapshot, t, s), cfg)
               for s in ("calibration", "test")}
        changed = int((np.abs(t.ncc_ab[rows] - table.ncc_ab[rows]) > 1e-6).sum()
                      + (np.abs(t.ncc_ba[rows] - table.ncc_ba[rows]) > 1e-6).sum())
        out["variants"][name] = {"steps": steps, "spread": spread, "pyramid": keep,
                                 "refine_from": refine if quick else None, "peaks_changed": changed,
                                 "splits": {s: _summary(m) for s, m in got.items()}}
        print(f"{name}: {json.dumps(out['variants'][name], default=float)}", file=sys.stderr)
    for r in sample.tolist():  # alternated pair by pair, so load changes fall on every variant alike
        a, b = thumbs[int(table.a[r])], thumbs[int(table.b[r])]
        t0 = time.process_time()
        locate(a, b, steps=STEPS)
        cpu["stored"] += time.process_time() - t0
        for name, (steps, spread, keep, quick) in zip(names, variants, strict=True):
            t0 = time.process_time()
            locate(a, b, steps=steps, spread=spread, pyramid=keep, refine_from=refine if quick else None)
            cpu[name] += time.process_time() - t0
    out["cpu_ms_per_pair"] = {k: 1e3 * v / max(1, len(sample)) for k, v in cpu.items()}
    out["timed_pairs"] = int(len(sample))
    print(json.dumps({k: v for k, v in out.items() if k != "variants"}, indent=1, default=float), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")


def _summary(m: dict) -> dict:
    """The targets' figures of one split (``eval_duplicates.measure``'s)."""
    return {"edited_precision": m["edited"]["precision"], "edited_recall": m["edited"]["recall"],
            "crop_direction": m["crops"]["direction_right_of_all"], "crop_precision": m["crops"]["precision"],
            "crops_reported": m["crops"]["all_reported_as_crop"],
            "scene_in_groups": m["groups"]["scene_pair_fraction_in_one_group"],
            "false_duplicate_pairs": m["duplicates"]["false"]}


if __name__ == "__main__":
    main()
