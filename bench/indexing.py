"""Indexing throughput: JPEG files on disk -> a finished regis index, on this machine's CPU.

Two folders of JPEG files are written once under ``$REGIS_BENCH_DATA/jpeg``:

- ``photos``: random crops (50-80 % of the area) of the 21 real photos bundled with scikit-image,
  scikit-learn and matplotlib (``regis.data.sample_photos``), resized so the longer side is 640 px, JPEG
  quality 90 (phone-photo-like decode cost, ~50-100 kB files); ``--n`` files.
- ``fmnist``: Fashion-MNIST images as 28 x 28 JPEG files (decode is trivial; the encoder dominates).

Each folder is indexed from scratch with ``indexer.build.build_index`` and the offline encoder
(``build_encoder("efficientnet-lite0")``, 224 px), over ``--workers`` (DataLoader decoding processes).
Printed: images/s end to end (files / total build time) and the ``BuildReport`` split: scan, decode (the
embedding loop waiting for decoded batches), encode (the encoder forward), put (token rows), write (the
commit: FAISS, table, manifest). A separate pass times decoding alone in one process (read + decode + resize
+ normalise, ``ImageFileDataset``) so the ceiling each stage sets is visible.

Usage::

    python -m bench.indexing --n 256 --workers 0,1
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

import numpy as np

from bench.common import DATA_DIR, print_machine

JPEG_DIR = DATA_DIR / "jpeg"


def make_photos(n: int) -> None:
    """``n`` JPEG crops of the bundled photos in ``JPEG_DIR/photos`` (kept if already there)."""
    from PIL import Image

    from regis.data.augment import encode_jpeg, random_crop
    from regis.data.sample_photos import collect_sample_photos

    out = JPEG_DIR / "photos"
    if out.is_dir() and len(list(out.glob("*.jpg"))) >= n:
        return
    src = JPEG_DIR / "sources"
    src.mkdir(parents=True, exist_ok=True)
    paths = collect_sample_photos(src)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = [Image.open(p).convert("RGB") for p in paths]
    for i in range(n):
        img = random_crop(images[i % len(images)], rng)
        scale = 640 / max(img.size)
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BICUBIC)
        (out / f"photo-{i:05d}.jpg").write_bytes(encode_jpeg(img, 90))


def make_fmnist(n: int) -> None:
    """``n`` Fashion-MNIST test images as 28 x 28 JPEG files in ``JPEG_DIR/fmnist``."""
    from PIL import Image

    from bench.corpus import load_fmnist
    from regis.data.augment import encode_jpeg

    out = JPEG_DIR / "fmnist"
    if out.is_dir() and len(list(out.glob("*.jpg"))) >= n:
        return
    out.mkdir(parents=True, exist_ok=True)
    images, _ = load_fmnist()
    for i in range(n):
        (out / f"fm-{i:05d}.jpg").write_bytes(encode_jpeg(Image.fromarray(images[60_000 + i]).convert("RGB"), 90))


def decode_only(folder, encoder, limit: int) -> float:
    """Images/s of read + decode + transform in one process (no encoder)."""
    from indexer.dataset import ImageFileDataset
    from regis.images.decode import DEFAULT_MAX_PIXELS
    from regis.models.transforms import eval_transform

    paths = sorted(folder.glob("*.jpg"))[:limit]
    ds = ImageFileDataset(paths, eval_transform(encoder.config), DEFAULT_MAX_PIXELS,
                          draft_size=encoder.config.resize_size)
    t0 = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    return len(ds) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=256, help="files per folder")
    p.add_argument("--sets", default="photos,fmnist")
    p.add_argument("--workers", default="0,1", help="DataLoader decoding processes to try, comma list")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    from indexer.build import BuildOptions, build_index
    from regis.models.encoder import build_encoder

    print_machine({"bench": "indexing", "n": args.n})
    encoder = build_encoder("efficientnet-lite0")
    rows = []
    for name in args.sets.split(","):
        {"photos": make_photos, "fmnist": make_fmnist}[name](args.n)
        folder = JPEG_DIR / name
        mb = sum(f.stat().st_size for f in folder.glob("*.jpg")) / 2**20
        dec = decode_only(folder, encoder, min(args.n, 128))
        print(f"decode only ({name}): {dec:.1f} images/s in one process ({mb:.1f} MiB of JPEG)", flush=True)
        for workers in [int(w) for w in args.workers.split(",")]:
            index = DATA_DIR / "idx" / f"jpeg-{name}-w{workers}"
            shutil.rmtree(index, ignore_errors=True)
            opts = BuildOptions(batch_size=args.batch_size, num_workers=workers, progress=False)
            t0 = time.perf_counter()
            rep = build_index(folder, index, encoder, opts)
            wall = time.perf_counter() - t0
            row = {"set": name, "workers": workers, "images": rep.added, "images_per_s": rep.added / wall,
                   "total_s": wall, "scan_s": rep.scan_s, "decode_s": rep.decode_s, "encode_s": rep.encode_s,
                   "put_s": rep.put_s, "write_s": rep.write_s, "decode_only_images_per_s": dec,
                   "encode_images_per_s": rep.added / rep.encode_s if rep.encode_s else None}
            rows.append(row)
            print("row:", json.dumps(row), flush=True)
    print("\n| files | workers | images | images/s end to end | scan s | decode wait s | encode s | put s | "
          "write s | decode-only images/s (1 process) | encoder images/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['workers']} | {r['images']} | {r['images_per_s']:.1f} | {r['scan_s']:.2f} | "
              f"{r['decode_s']:.2f} | {r['encode_s']:.2f} | {r['put_s']:.2f} | {r['write_s']:.2f} | "
              f"{r['decode_only_images_per_s']:.0f} | {r['encode_images_per_s']:.1f} |")


if __name__ == "__main__":
    main()
