"""Triplet and DMCAC on cached backbone tokens, Fashion-MNIST (issue 22): a token head trained on a 2-core CPU,
against the untrained tokens, its recipe chosen on a validation split of the training classes only.

Caches (``training.cached.cache``; EfficientNet-Lite0 ImageNet, 128 px, ROI pass at 96 px, 15 query tokens of 1280):
a seeded 1,500 of the 5,000 class-disjoint test images (classes 5-9, view 0 only), 200 seeded training images
per class 0-4 with 2 views (the evaluation transform and one RandomResizedCrop + flip) and a validation set of
``--val-per-class`` other training-file images per class 0-4 (view 0 only). Heads: linear 1280 -> 256 (as
shipped), PCA start.

Selection (never on the test classes): each recipe x grid point (learning rate, L2-SP ``anchor`` towards the PCA
start) trains on the training images of classes ``--fold`` (0, 1, 2) only, so that classes 3 and 4 are unseen;
its score is the MaxSim Recall@1 of the validation images of the unseen classes against all validation images
(classes 0-4), every ``--val-every`` steps (early stopping), of the best of the head's WiSE-FT mixes with its start
(alpha in {0.25, 0.5, 0.75, 1}). The best (grid point, step, alpha) of each recipe is retrained on all five
training classes (same schedule, stopped at that step, mixed at that alpha) and evaluated once on the test
images: leave-one-out Recall@1, single (token 0) and multi (MaxSim, 15 query tokens over the gallery's 10),
untrained vs trained, paired bootstrap over queries; the PCA start's figures beside them.

Usage:
    PYTHONPATH=$PWD python scripts/fmnist_cached_heads.py --data /usr/share/datasets/fashion-mnist \
        --cache ~/.cache/regis/features --steps 1500 --json docs/results/fmnist_cached_heads.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from regis.models.encoder import build_encoder
from training.cached.cache import class_cache, save
from training.cached.recipes import compare, evaluate, interpolate, restrict, start_head, train_dmcac, train_triplet
from training.data.fashion_mnist import load_fashion_mnist

ALPHAS = (0.25, 0.5, 0.75, 1.0)
RECIPES = {"triplet": train_triplet, "dmcac": train_dmcac}


def train_picks(labels: np.ndarray, per_class: int) -> np.ndarray:
    """The seeded training images (``per_class`` of each class 0-4), sorted indices into the training split."""
    rng = np.random.default_rng(0)
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(labels == c), per_class, replace=False)
                                   for c in range(5)]))


def caches(data: Path, cache_dir: Path, per_class: int, test_images: int, val_per_class: int) -> tuple[dict, ...]:
    """(train, val, test) token caches, built and saved under ``cache_dir`` when absent."""
    paths = {"train": cache_dir / f"fmnist-train-{per_class}.pt", "test": cache_dir / f"fmnist-test-{test_images}.pt",
             "val": cache_dir / f"fmnist-val-{val_per_class}-excl{per_class}.pt"}
    if all(p.is_file() for p in paths.values()):
        return tuple(torch.load(paths[k], weights_only=False) for k in ("train", "val", "test"))
    ds = load_fashion_mnist(data)
    enc = build_encoder("efficientnet-lite0", image_size=128)
    labels = np.asarray(ds.train.labels)
    picks = train_picks(labels, per_class)
    if not paths["test"].is_file():
        pick = np.sort(np.random.default_rng(1).choice(len(ds.test.queries),
                                                        min(test_images, len(ds.test.queries)), replace=False))
        save(class_cache(enc, ds.test.queries.subset(pick), views=1, seed=1), paths["test"])
    if not paths["train"].is_file():
        save(class_cache(enc, ds.train.subset(picks), views=2, seed=0), paths["train"])
    if not paths["val"].is_file():
        rest = np.setdiff1d(np.arange(len(labels)), picks)
        rng = np.random.default_rng(2)
        val = np.sort(np.concatenate([rng.choice(rest[labels[rest] == c], val_per_class, replace=False)
                                      for c in range(5)]))
        save(class_cache(enc, ds.train.subset(val), views=1, seed=2), paths["val"])
    return tuple(torch.load(paths[k], weights_only=False) for k in ("train", "val", "test"))


def grid(lrs: list[float], anchors: list[float]) -> list[dict]:
    return [{"lr": lr, "anchor": a} for lr in lrs for a in anchors]


def select(name: str, fold_train: dict, val_fn, steps: int, val_every: int, points: list[dict], seed: int,
           out_dim: int = 256) -> dict:
    """Every grid point of recipe ``name`` on the fold, scored by ``val_fn`` at each checkpoint's best WiSE-FT mix
    with the start (alpha in ``ALPHAS``); the runs and the best (point, step, alpha)."""
    start = start_head(fold_train, out_dim=out_dim, seed=seed)
    runs = []
    for point in points:
        mixes: list[dict] = []

        def mixed_val(head, mixes=mixes):
            scores = {a: float(val_fn(interpolate(start, head, a))) for a in ALPHAS}
            mixes.append({str(a): v for a, v in scores.items()})
            return max(scores.values())

        head, log = RECIPES[name](fold_train, steps=steps, seed=seed, val=mixed_val, val_every=val_every,
                                  out_dim=out_dim, **point)
        curve = log[0].pop("val_curve")
        for c, m in zip(curve, mixes, strict=True):
            c["val_by_alpha"] = m
        at = [c["step"] for c in curve].index(log[0]["best_step"])
        alpha = max(ALPHAS, key=lambda a: (mixes[at][str(a)], a))  # ties: the larger step away from the start
        runs.append({**point, "train": log[0], "val_curve": curve,
                     "best": {"step": log[0]["best_step"], "alpha": alpha, "val": mixes[at][str(alpha)]}})
        print(name, json.dumps(point), json.dumps(runs[-1]["best"]),
              json.dumps([(c["step"], c["val_by_alpha"]["1.0"], max(c["val_by_alpha"].values())) for c in curve]),
              flush=True)
    best = max(runs, key=lambda r: r["best"]["val"])
    return {"runs": runs, "chosen": {"lr": best["lr"], "anchor": best["anchor"], **best["best"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/regis/features")
    ap.add_argument("--per-class", type=int, default=200, help="training images per class (0-4), 2 views each")
    ap.add_argument("--test-images", type=int, default=1500, help="seeded subset of the 5,000 test images")
    ap.add_argument("--val-per-class", type=int, default=200, help="validation images per class 0-4, view 0")
    ap.add_argument("--fold", default="0,1,2", help="training classes the selection runs see")
    ap.add_argument("--lrs", default="1e-3,1e-4")
    ap.add_argument("--anchors", default="0,1")
    ap.add_argument("--recipes", default="triplet,dmcac", help="run in this order; with --json, a recipe not run "
                    "keeps its entry from an earlier run of this script in that file")
    ap.add_argument("--steps", type=int, default=1500, help="schedule length (cosine, warm-up)")
    ap.add_argument("--val-every", type=int, default=100)
    ap.add_argument("--out-dim", type=int, default=256, help="D' of the head (1280: no PCA reduction)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    train, val, test = caches(args.data, args.cache, args.per_class, args.test_images, args.val_per_class)
    fold = [int(c) for c in args.fold.split(",")]
    unseen = torch.from_numpy(np.flatnonzero(~np.isin(val["labels"].numpy(), fold)))
    if not len(unseen):
        raise SystemExit(f"--fold {args.fold} leaves no unseen training class to validate on")

    def val_fn(head):
        return float(evaluate(val, head, queries=unseen)["multi"].mean())

    fold_train = restrict(train, fold)
    points = grid([float(x) for x in args.lrs.split(",")], [float(x) for x in args.anchors.split(",")])
    before = evaluate(test, None)
    report = {"command": "python " + " ".join(sys.argv), "machine": platform.machine(), "torch": torch.__version__,
              "train_images": int(len(train["labels"])), "val_images": int(len(val["labels"])),
              "val_queries_unseen": int(len(unseen)), "fold": fold, "test_images": int(len(test["labels"])),
              "cache_seconds": {k: c["config"]["seconds"] for k, c in (("train", train), ("val", val), ("test", test))},
              "untrained": {k: float(v.mean()) for k, v in before.items()},
              "val_untrained": val_fn(None), "out_dim": args.out_dim,
              "val_pca_start": val_fn(start_head(fold_train, out_dim=args.out_dim, seed=args.seed)),
              "recipes": {}}
    full_start = start_head(train, out_dim=args.out_dim, seed=args.seed)
    report["pca_start"] = {k: compare(v, before[k]) for k, v in evaluate(test, full_start).items()}
    print("untrained", report["untrained"], "val", report["val_untrained"], "val pca", report["val_pca_start"],
          "pca start on test", json.dumps(report["pca_start"]), flush=True)
    for name in args.recipes.split(","):
        t0 = time.perf_counter()
        sel = select(name, fold_train, val_fn, args.steps, args.val_every, points, args.seed, args.out_dim)
        c = sel["chosen"]
        head, log = RECIPES[name](train, steps=args.steps, seed=args.seed, lr=c["lr"], anchor=c["anchor"],
                                  stop_after=c["step"], out_dim=args.out_dim)
        after = evaluate(test, interpolate(full_start, head, c["alpha"]))
        report["recipes"][name] = {"command": report["command"], "selection": sel, "train": log[0],
                                   "seconds": round(time.perf_counter() - t0, 1),
                                   **{k: compare(after[k], before[k]) for k in ("single", "multi")}}
        print(name, "chosen", json.dumps(c), "test", json.dumps({k: report["recipes"][name][k]
                                                                 for k in ("single", "multi")}), flush=True)
        if args.json:  # after each recipe: a checkpoint; the file's other recipes (run separately) are kept
            old = json.loads(args.json.read_text()).get("recipes", {}) if args.json.is_file() else {}
            report["recipes"] = {**{k: v for k, v in old.items() if "selection" in v}, **report["recipes"]}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
