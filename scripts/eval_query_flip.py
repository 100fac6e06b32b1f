"""Does scoring a query also by its mirror image help? Recall@1 per kind of the shipped encoder on the test query
sets of ``regis eval-photos`` (seeds 0-2): MaxSim of the query, against the better of the query's and its
horizontally flipped copy's MaxSim (a query-side option: the index is unchanged), with a bootstrap over photos.

    PYTHONPATH=$PWD python scripts/eval_query_flip.py --corpus /work/cache/photos

(Flipping the evaluation transform's centre crop equals cropping the flipped image: the crop is centred.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--set-workers", type=int, default=2)
    a = p.parse_args(argv)

    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from eval_finetuned import build_sets, encode

    from regis.models.encoder import build_encoder
    from training.evaluation.intervals import per_kind_table
    from training.photos.loss import maxsim_matrix

    seeds = [int(s) for s in a.seeds.split(",")]
    sets = build_sets(a.corpus, ["test"], seeds, a.set_workers)
    enc = build_encoder("efficientnet-lite0-regis", frame="center-crop")
    hits = {"query": [], "best of query and mirror": []}
    kinds, photos = [], []
    for seed in seeds:
        d = sets[("test", seed)]
        g = encode(enc, d["gallery"], "cpu")[:, :10]
        s0 = maxsim_matrix(encode(enc, d["queries"], "cpu"), g)
        s1 = torch.maximum(s0, maxsim_matrix(encode(enc, torch.flip(d["queries"], dims=[-1]), "cpu"), g))
        for name, scores in zip(hits, (s0, s1), strict=True):
            best = scores.argmax(1)
            hits[name].append(d["relevance"][torch.arange(len(best)), best].numpy().astype(float))
        kinds += d["kinds"]
        photos += d["photos"]
    pooled = {name: np.concatenate(v) for name, v in hits.items()}
    rows = per_kind_table(pooled, kinds, photos, [("best of query and mirror", "query")], digits=None)
    for kind, row in rows.items():
        r1, d = row["scorers"], row["diffs"]["best of query and mirror - query"]
        print(f"{kind:7s} n={row['n']:5d} query {r1['query']['r1']:.3f} best of query and mirror "
              f"{r1['best of query and mirror']['r1']:.3f}  {d['d']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")


if __name__ == "__main__":
    main()
