"""Triplet and DMCAC on cached backbone tokens, Fashion-MNIST (issue 22): a token head trained for thousands of
steps on a 2-core CPU, against the untrained tokens.

Caches (``training.cached.cache``; EfficientNet-Lite0 ImageNet, 128 px, ROI pass at 96 px, 15 query tokens of 1280):
a seeded 1,500 of the 5,000 class-disjoint test images (classes 5-9, view 0 only) and 200 seeded training images
per class 0-4 with 2 views (the evaluation transform and one RandomResizedCrop + flip). Heads: linear 1280 -> 256 (as
shipped), PCA start. Evaluation: leave-one-out Recall@1 on the 1,500 test images, single (token 0) and multi
(MaxSim, 15 query tokens over the gallery's 10), untrained vs trained, paired bootstrap over queries.

Usage:
    PYTHONPATH=$PWD python scripts/fmnist_cached_heads.py --data /usr/share/datasets/fashion-mnist \
        --cache ~/.cache/regis/features --steps 3000 --json docs/results/fmnist_cached_heads.json
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
from training.cached.recipes import compare, evaluate, train_dmcac, train_triplet
from training.data.fashion_mnist import load_fashion_mnist


def caches(data: Path, cache_dir: Path, per_class: int, test_images: int) -> tuple[dict, dict]:
    test_path = cache_dir / f"fmnist-test-{test_images}.pt"
    train_path = cache_dir / f"fmnist-train-{per_class}.pt"
    if test_path.is_file() and train_path.is_file():
        return torch.load(train_path, weights_only=False), torch.load(test_path, weights_only=False)
    ds = load_fashion_mnist(data)
    enc = build_encoder("efficientnet-lite0", image_size=128)
    pick = np.sort(np.random.default_rng(1).choice(len(ds.test.queries), min(test_images, len(ds.test.queries)),
                                                    replace=False))
    test = class_cache(enc, ds.test.queries.subset(pick), views=1, seed=1)
    save(test, test_path)
    labels = np.asarray(ds.train.labels)
    rng = np.random.default_rng(0)
    idx = np.concatenate([rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in range(5)])
    train = class_cache(enc, ds.train.subset(np.sort(idx)), views=2, seed=0)
    save(train, train_path)
    return train, test


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/regis/features")
    ap.add_argument("--per-class", type=int, default=200, help="training images per class (0-4), 2 views each")
    ap.add_argument("--test-images", type=int, default=1500, help="seeded subset of the 5,000 test images")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    train, test = caches(args.data, args.cache, args.per_class, args.test_images)
    before = evaluate(test, None)
    report = {"command": "python " + " ".join(sys.argv), "machine": platform.machine(), "torch": torch.__version__,
              "train_images": int(len(train["labels"])), "test_images": int(len(test["labels"])),
              "cache_seconds": {"train": train["config"]["seconds"], "test": test["config"]["seconds"]},
              "untrained": {k: float(v.mean()) for k, v in before.items()}, "recipes": {}}
    for name, fn in (("triplet", train_triplet), ("dmcac", train_dmcac)):
        t0 = time.perf_counter()
        head, log = fn(train, steps=args.steps, seed=args.seed)
        after = evaluate(test, head)
        report["recipes"][name] = {"train": log[0], "seconds": round(time.perf_counter() - t0, 1),
                                   **{k: compare(after[k], before[k]) for k in ("single", "multi")}}
        print(name, json.dumps(report["recipes"][name]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
