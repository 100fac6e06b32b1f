"""The duplicates self-join at lower FAISS nprobe: how much faster, and which pairs it loses (issue 26, scale).

The self-join's FAISS search is about 80 % of its time (``python -m bench.duplicates --compare-join``, stage
``search``). Near-duplicates share near-identical tokens, which mostly fall in the same IVF lists, so fewer lists
probed might find them; this runs ``regis.duplicates.selfjoin.self_join`` with the shipped floor and neighbours
at nprobe 32 (the manifests' default), 16, 8 and 4 on each index given and counts the pairs lost and gained (a
lost better candidate lets another into an image's ``neighbours``) against nprobe 32.

Usage (the figures of docs/results/duplicates/join-nprobe.json; this file is the scratch script of that run,
/tmp/dupscale/nprobe.py, with this docstring, argparse and --json added)::

    flock /tmp/regis-bench.lock python -m bench.duplicates_nprobe /work/cache/dup-eval/debian-s0/index \\
        /work/cache/dup-scale/index-10000 --json docs/results/duplicates/join-nprobe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("indexes", nargs="+")
    p.add_argument("--json")
    p.add_argument("--labelled", help="the labelled set's files folder (scripts/eval_duplicates.py's WORK/debian-s0/"
                   "files): the pairs lost and gained on the index built from it, by label")
    args = p.parse_args()

    from regis.duplicates.config import shipped_calibration
    from regis.duplicates.selfjoin import self_join
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.registry import DEFAULT_BACKBONE

    cfg = shipped_calibration(DEFAULT_BACKBONE)
    out = {}
    labels = None
    for path in args.indexes:
        snap = IndexSnapshot.open(path)
        if args.labelled and path == args.indexes[0]:
            from regis.data.near_duplicates import LabelledSet, labelled_pairs

            recs = snap.table.get_many(snap.store.live_ids.tolist())
            labels = labelled_pairs(LabelledSet.load(args.labelled).items)

            def by_label(keys: set, recs=recs, labels=labels) -> dict:
                got: dict = {}
                for a, b in keys:
                    lab = labels.get(tuple(sorted((recs[a].path, recs[b].path))), ("unrelated",))[0]
                    got[lab] = got.get(lab, 0) + 1
                return got
        ref = None
        for npb in (32, 16, 8, 4):
            st: dict = {}
            t0 = time.perf_counter()
            pairs = self_join(snap, floor=cfg.floor, neighbours=cfg.neighbours, nprobe=npb, stats=st)
            wall = time.perf_counter() - t0
            keys = set(zip(pairs.a.tolist(), pairs.b.tolist(), strict=True))
            ref = keys if ref is None else ref
            row = {"wall_s": wall, "search_s": st["search_ms"] / 1e3, "pairs": len(pairs), "lost": len(ref - keys),
                   "new": len(keys - ref), "load": os.getloadavg()[0]}
            if labels is not None and path == args.indexes[0]:
                row["lost_by_label"] = by_label(ref - keys)
                row["new_by_label"] = by_label(keys - ref)
            out[f"{path}@{npb}"] = row
            print(path, npb, row, file=sys.stderr, flush=True)
        snap.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python -m bench.duplicates_nprobe", *sys.argv[1:]]), "runs": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
