"""Which framings should the duplicates self-join score? Brute force over the labelled set (issue 26).

The self-join scores a pair on the centre crop's T tokens of both images (``regis.duplicates.selfjoin``). A crop
taken from the side of a landscape photo (or the end of a portrait) lies mostly outside that photo's centre crop,
so its tokens find little of it there. This scores every pair of the labelled set's two-framing index exactly,
with every framing combination, and compares scorings at equal load: the threshold at which each lets through as
many pairs of unrelated photos as today's scoring does at the shipped floor (and at the verification gate).

Scorings of a pair (a, b), each direction S(x -> y) / T, the pair's score max(S(a -> b), S(b -> a)):
- ``centre`` (today): x's centre-crop tokens against y's centre-crop tokens;
- ``centre-all``: x's centre-crop tokens against all 2T tokens of y (each token's best match in either framing);
- ``best``: the best of the four framing combinations (centre / whole image of x against centre / whole of y).

Per split (calibration / test) and label: the pairs at or above the threshold; for the crop pairs below it, where
the crop lies (the share of its box inside the container's central square).

Usage::

    python -m bench.duplicates_framings --work /work/cache/dup-eval --json docs/results/duplicates/framings.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import print_machine

SCORINGS = ("centre", "centre-all", "best")


def directional(tokens: np.ndarray, t: int, block: int = 48) -> dict[str, np.ndarray]:
    """S(x -> y) / T of every ordered pair, per scoring.

    Args:
        tokens: (n, 2T, D) float32 unit tokens, each image's centre crop's T first.
        t: T, tokens per framing.

    Returns:
        scoring -> (n, n) float32, row x, column y.
    """
    n = tokens.shape[0]
    flat = tokens.reshape(n * 2 * t, -1)
    out = {s: np.zeros((n, n), np.float32) for s in SCORINGS}
    for lo in range(0, n, block):
        x = tokens[lo:lo + block]  # (b, 2T, D)
        b = x.shape[0]
        sims = (x.reshape(b * 2 * t, -1) @ flat.T).reshape(b, 2, t, n, 2, t)  # x framing, token, y, y framing, token
        best_in = sims.max(axis=5)  # (b, 2, t, n, 2): each x token's best token of each y framing
        combo = best_in.mean(axis=2)  # (b, 2, n, 2): S / T per (x framing, y framing)
        out["centre"][lo:lo + b] = combo[:, 0, :, 0]
        out["centre-all"][lo:lo + b] = best_in[:, 0].max(axis=3).mean(axis=1)
        out["best"][lo:lo + b] = combo.max(axis=(1, 3))
    return out


def centre_share(small, big) -> float:
    """The share of ``small``'s box that lies inside the central square of ``big``'s box (source pixels)."""
    x0, y0, x1, y1 = big.box
    side = min(x1 - x0, y1 - y0)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    sq = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
    a0, b0, a1, b1 = small.box
    w = max(0.0, min(a1, sq[2]) - max(a0, sq[0]))
    h = max(0.0, min(b1, sq[3]) - max(b0, sq[1]))
    return w * h / max((a1 - a0) * (b1 - b0), 1e-9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/work/cache/dup-eval"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", type=Path, default=Path("/work/cache/photos"))
    p.add_argument("--floors", default="0.35,0.40", help="today's floor and gate: the loads compared")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import eval_duplicates as ed

    from regis.data.near_duplicates import LabelledSet, labelled_pairs
    from regis.indexes.snapshot import IndexSnapshot

    machine = print_machine({"bench": "duplicates_framings", "work": str(args.work)})
    work = args.work / f"debian-s{args.seed}"
    _, _, splits = ed.debian_photos(args.corpus, work)
    labelled = LabelledSet.load(work / "files")
    snap = IndexSnapshot.open(work / "index")
    t = snap.manifest.encoder.tokens_per_framing
    if snap.manifest.encoder.framings != 2:
        raise SystemExit(f"{work / 'index'} has {snap.manifest.encoder.framings} framing(s); this compares two")
    ids = snap.store.live_ids
    recs = snap.table.get_many(ids.tolist())
    by_file = labelled.by_file()
    items = [by_file[recs[int(i)].path] for i in ids]
    tokens = snap.store.get(ids).astype(np.float32)
    t0 = time.time()
    s = directional(tokens, t)
    print(f"\nscored {len(ids)}^2 pairs x {len(SCORINGS)} scorings in {time.time() - t0:.0f} s", file=sys.stderr)
    row = {it.file: k for k, it in enumerate(items)}
    label = np.full((len(ids), len(ids)), "unrelated", dtype=object)
    container = {}
    for (fa, fb), (lab, cont) in labelled_pairs(items).items():
        a, b = row[fa], row[fb]
        label[a, b] = label[b, a] = lab
        if cont:
            container[(min(a, b), max(a, b))] = row[cont]
    split = np.array([splits.get(it.family, "?") for it in items])
    iu = np.triu_indices(len(ids), 1)
    same = split[iu[0]] == split[iu[1]]
    a_idx, b_idx = iu[0][same], iu[1][same]
    pair_split, pair_label = split[a_idx], label[a_idx, b_idx]
    score = {k: np.maximum(v[a_idx, b_idx], v[b_idx, a_idx]) for k, v in s.items()}
    floors = [float(f) for f in args.floors.split(",")]
    result = {"machine": machine, "command": " ".join(["python -m bench.duplicates_framings", *sys.argv[1:]]),
              "images": len(ids), "tokens_per_framing": t, "splits": {}}
    for sp in ("calibration", "test"):
        m = pair_split == sp
        unrel = m & (pair_label == "unrelated")
        res = {}
        for floor in floors:
            load = int((score["centre"][unrel] >= floor).sum())
            per = {}
            for k in SCORINGS:
                thr = floor if k == "centre" else float(np.sort(score[k][unrel])[::-1][max(load - 1, 0)])
                above = score[k] >= thr
                per[k] = {"threshold": thr, "unrelated_above": int((above & unrel).sum()),
                          **{lab: [int((above & m & (pair_label == lab)).sum()), int((m & (pair_label == lab)).sum())]
                             for lab in ("exact", "edited", "crop", "scene", "ambiguous", "overlap")}}
                crop_rows = np.flatnonzero(m & (pair_label == "crop") & ~above)
                shares = []
                for r in crop_rows:
                    a, b = int(a_idx[r]), int(b_idx[r])
                    big = container[(a, b)]
                    small = b if big == a else a
                    shares.append(centre_share(items[small], items[big]))
                per[k]["crops_below_centre_share"] = {
                    "n": len(shares), "mostly_outside_centre (<0.5)": int(sum(x < 0.5 for x in shares)),
                    "median": float(np.median(shares)) if shares else None}
            res[f"load_of_centre_at_{floor:.2f}"] = {"unrelated_pairs": load, **per}
        result["splits"][sp] = res
        for key, r in res.items():
            print(f"[{sp}] {key}: " + "; ".join(
                f"{k} thr {r[k]['threshold']:.3f}: crop {r[k]['crop'][0]}/{r[k]['crop'][1]}, edited "
                f"{r[k]['edited'][0]}/{r[k]['edited'][1]}, scene {r[k]['scene'][0]}/{r[k]['scene'][1]}, crops below "
                f"mostly outside the centre {r[k]['crops_below_centre_share']['mostly_outside_centre (<0.5)']}"
                f"/{r[k]['crops_below_centre_share']['n']}" for k in SCORINGS))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
