"""Benchmark corpus: tokens of real images (Fashion-MNIST through the offline EfficientNet-Lite0 backbone).

What it does, exactly (BENCHMARKS.md "Corpus"):

1. Reads Fashion-MNIST (70,000 28 x 28 grayscale images, ``/usr/share/datasets/fashion-mnist``).
2. Database (100,000 images): the 60,000 training images, test images 1,000..9,999 (9,000), and 31,000
   augmented copies of database originals drawn at random (seed 0): RandomResizedCrop(28, scale 0.5..1,
   ratio 3/4..4/3) + horizontal flip (p 0.5) + brightness/contrast jitter 0.3 (torchvision). Queries: test
   images 0..999 (1,000 images never in the database).
3. Each image: 28 px -> ``--size`` px (default 96, bicubic, antialiased), grey -> 3 channels, the backbone's
   mean/std; then ``RegisEncoder.encode`` of ``build_encoder("efficientnet-lite0")`` (real ImageNet weights,
   kmeans part cues, ROI N = 3): 10 unit-norm tokens x 1280 per image. 96 px (a 3 x 3 feature map) instead of
   224 px because Lite0 runs at ~7-30 images/s at 224 px on this 2-core machine; Fashion-MNIST has 28 px of
   information anyway.
4. Writes float16 tokens to ``$REGIS_BENCH_DATA/corpus/raw1280.f16`` ((101,000, 10, 1280), database rows
   first, then the queries; ``raw{D}.f16`` for an encoder of D-d tokens) and ``meta.npz`` (label, source
   index, split, augmented flag). Resumable: a killed run continues from the last finished chunk.

Then ``python -m bench.project`` reduces the tokens to 384-d (PCA, see there).

Other encoders (``--backbone``, ``--frame``): e.g. the shipped default ``efficientnet-lite0-regis`` (256-d tokens)
with both framings (``center-crop+aspect``: T = 20 tokens per image, the central square's 10 then the whole
input's). Its queries get the encoder's query layout (``encode_query``: m = 30 tokens, 15 per framing, with the ROI
pass's cue tokens) and go to ``queries{D}.f16`` ((Q, m, D) float16) when m differs from T. ``--aspect W:H`` resizes
every image to that shape (``--size`` px high) so that the two framings differ as they do on 4:3 photos
(Fashion-MNIST is square: both framings of a square input are nearly the same tokens).

Usage::

    python -m bench.corpus [--size 96] [--batch 250] [--limit N] [--n-db 20000 --n-queries 500 --out DIR]
    python -m bench.corpus --backbone efficientnet-lite0-regis --frame center-crop+aspect --aspect 4:3 \
        --n-db 10000 --n-queries 300 --db-rows 4000 --out $REGIS_BENCH_DATA/corpus-regis
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, print_machine

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
N_DB = 100_000
N_QUERIES = 1_000
N_AUG = N_DB - 60_000 - (10_000 - N_QUERIES)
CHUNK = 2_000


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip) as a numpy array (uint8)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fmnist() -> tuple[np.ndarray, np.ndarray]:
    """(70000, 28, 28) uint8 images (train then test) and (70000,) uint8 labels."""
    imgs = [read_idx(FMNIST_DIR / f"{s}-images-idx3-ubyte.gz") for s in ("train", "t10k")]
    labels = [read_idx(FMNIST_DIR / f"{s}-labels-idx1-ubyte.gz") for s in ("train", "t10k")]
    return np.concatenate(imgs), np.concatenate(labels)


def corpus_plan(seed: int = 0, n_db: int = N_DB, n_queries: int = N_QUERIES) -> dict[str, np.ndarray]:
    """Rows of the corpus: ``source`` (index into the 70k images), ``augmented`` (bool), ``is_query`` (bool).

    The default is the 100k corpus of BENCHMARKS.md. A smaller ``n_db`` keeps its make-up: a random subset
    (seed ``seed``) of the 69,000 originals holding 69 % of the rows, plus 31 % augmented copies of them;
    queries are test images 0..n_queries-1 (never in the database). Raises ValueError past 100k / 1,000.
    """
    if not 1 <= n_db <= N_DB or not 1 <= n_queries <= N_QUERIES:
        raise ValueError(f"n_db must be 1..{N_DB} and n_queries 1..{N_QUERIES}, got {n_db}, {n_queries}")
    rng = np.random.default_rng(seed)
    originals = np.concatenate([np.arange(60_000), 60_000 + np.arange(N_QUERIES, 10_000)])
    n_aug = N_AUG
    if n_db < N_DB:
        n_aug = round(n_db * N_AUG / N_DB)
        originals = np.sort(rng.choice(originals, size=n_db - n_aug, replace=False))
    aug_src = rng.choice(originals, size=n_aug, replace=True)
    queries = 60_000 + np.arange(n_queries)
    source = np.concatenate([originals, aug_src, queries])
    augmented = np.concatenate([np.zeros(len(originals), bool), np.ones(n_aug, bool), np.zeros(n_queries, bool)])
    is_query = np.zeros(len(source), bool)
    is_query[n_db:] = True
    return {"source": source.astype(np.int64), "augmented": augmented, "is_query": is_query}


def _pixels(images, augmented, size: int, seed: int, width: int | None = None):
    """(B, 28, 28) uint8 Fashion-MNIST images -> (B, 3, size, width or size) float pixels in [-1, 1] (the
    encoder's mean/std 0.5); rows flagged ``augmented`` get the corpus's augmentation first (module docstring)."""
    import torch
    import torch.nn.functional as F
    from torchvision.transforms import v2

    x = torch.from_numpy(np.ascontiguousarray(images)).float().div(255.0)[:, None]  # (B, 1, 28, 28)
    if augmented.any():
        torch.manual_seed(seed)
        aug = v2.Compose([
            v2.RandomResizedCrop(28, scale=(0.5, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(brightness=0.3, contrast=0.3),
        ])
        idx = np.flatnonzero(augmented)
        x[idx] = torch.stack([aug(x[i]) for i in idx]).clamp(0, 1)
    x = F.interpolate(x, size=(size, width or size), mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)
    return ((x - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()


def parse_aspect(text: str) -> float:
    """"W:H" (e.g. "4:3") -> W / H as a float; raises SystemExit naming the bad value."""
    try:
        w, h = (float(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--aspect {text!r}: expected W:H, e.g. 4:3") from None
    if w <= 0 or h <= 0:
        raise SystemExit(f"--aspect {text!r}: both sides must be positive")
    return w / h


def build_corpus_encoder(backbone: str, frame: str | None, size: int):
    """The corpus's encoder: ``build_encoder(backbone)``; with a ``frame``, built for ``size`` px inputs
    (``image_size``: a two-framing encoder crops the central square at that size and sizes its ROI pass from it);
    without one, the encoder's own config as the 100k corpus was made (224 px, fed ``size`` px). Its input
    normalisation must be mean = std = 0.5 (what ``_pixels`` gives); raises SystemExit otherwise."""
    from regis.models.encoder import build_encoder

    enc = build_encoder(backbone, frame=frame, image_size=size if frame else None)
    if tuple(enc.config.mean) != (0.5, 0.5, 0.5) or tuple(enc.config.std) != (0.5, 0.5, 0.5):
        raise SystemExit(f"unexpected normalisation {enc.config.mean} {enc.config.std}")
    return enc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=96, help="input side (height with --aspect) in pixels")
    p.add_argument("--aspect", default="1:1", help="input shape W:H (e.g. 4:3: width = size x 4 / 3)")
    p.add_argument("--backbone", default="efficientnet-lite0", help="registered backbone (regis backbones)")
    p.add_argument("--frame", default=None, help="the encoder's frame (default: its own; e.g. center-crop+aspect)")
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--limit", type=int, default=None, help="embed only the first N rows (a smoke test)")
    p.add_argument("--out", type=Path, default=CORPUS_DIR)
    p.add_argument("--n-db", type=int, default=N_DB, help="database images (a smaller corpus of the same make-up)")
    p.add_argument("--n-queries", type=int, default=N_QUERIES)
    p.add_argument("--db-rows", type=int, default=None,
                   help="embed only the first N database rows of the plan, then the queries (a prefix corpus)")
    args = p.parse_args()

    import torch

    print_machine()
    enc = build_corpus_encoder(args.backbone, args.frame, args.size)
    width = round(args.size * parse_aspect(args.aspect))
    images, labels = load_fmnist()
    plan = corpus_plan(n_db=args.n_db, n_queries=args.n_queries)
    n_db = args.n_db if args.db_rows is None else min(args.db_rows, args.n_db)
    order = np.concatenate([np.arange(n_db), args.n_db + np.arange(args.n_queries)])  # plan rows to embed
    n = len(order) if args.limit is None else args.limit
    args.out.mkdir(parents=True, exist_ok=True)
    T, D, m = enc.config.tokens_per_image, enc.config.dim, enc.config.query_tokens_per_image
    path = args.out / f"raw{D}.f16"
    mode = "r+" if path.exists() else "w+"
    tokens = np.memmap(path, dtype=np.float16, mode=mode, shape=(len(plan["source"]), T, D))
    qpath = args.out / f"queries{D}.f16"  # the query layout's tokens, when they are not the index's
    qtokens = None if m == T else np.memmap(qpath, dtype=np.float16, mode="r+" if qpath.exists() else "w+",
                                            shape=(args.n_queries, m, D))
    np.savez(args.out / "meta.npz", labels=labels[plan["source"]], **plan)
    progress = args.out / "progress.json"
    done = json.loads(progress.read_text())["done"] if progress.exists() else 0
    t_start = time.perf_counter()
    start_done = done
    while done < n:
        stop = min(done + CHUNK, n)
        rows = order[done:stop]
        for b in range(0, len(rows), args.batch):
            part = rows[b : b + args.batch]
            pix = _pixels(images[plan["source"][part]], plan["augmented"][part], args.size, seed=int(part[0]),
                          width=width)
            with torch.inference_mode():
                tokens[part] = enc.encode(pix).numpy().astype(np.float16)
                is_q = part >= args.n_db
                if qtokens is not None and is_q.any():
                    qtokens[part[is_q] - args.n_db] = enc.encode_query(pix[is_q]).numpy().astype(np.float16)
        tokens.flush()
        if qtokens is not None:
            qtokens.flush()
        done = stop
        progress.write_text(json.dumps({"done": done, "size": args.size}))
        rate = (done - start_done) / (time.perf_counter() - t_start)
        print(f"{done}/{n} rows, {rate:.1f} images/s", flush=True)
    info = {"rows": len(plan["source"]), "db": n_db, "query_start": args.n_db, "queries": args.n_queries,
            "tokens_per_image": T, "dim": D, "query_tokens": m, "score_framings": enc.config.score_framings,
            "input_size": [args.size, width], "aspect": args.aspect, "backbone": args.backbone,
            "encoder": enc.config.model_dump(), "weights": enc.weights_info.model_dump()}
    (args.out / "info.json").write_text(json.dumps(info, indent=2))
    print(json.dumps({"done": done, "images_per_s": (done - start_done) / (time.perf_counter() - t_start)}))


if __name__ == "__main__":
    main()
