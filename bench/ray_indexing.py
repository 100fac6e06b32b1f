"""Ray Data indexing against the single-machine build, side by side in one run: the same folder of JPEG photos
(``bench.indexing``'s ``photos`` set: 640 px crops of the bundled photos) indexed from scratch

1. by ``indexer.build.build_index`` (one process, ``--workers`` DataLoader decoding processes), and
2. by ``cluster.build.build_ray`` into ``--shards`` shards on a local Ray cluster (``cluster.local``: a head
   node and ``--ray-workers`` worker nodes of ``--ray-cpus`` logical CPUs each): decode tasks, ``--actors``
   encoder actors, one checkpoint,

both with the offline EfficientNet-Lite0 encoder at 224 px and ``--batch-size`` images per forward pass.
Printed: images/s end to end (files / wall time of the call, Ray's start-up excluded) and embedding images/s
(the builds' own ``images_per_s``).

Usage::

    python -m bench.ray_indexing --n 256
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

from bench.common import DATA_DIR, print_machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=256, help="JPEG photos to index")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1, help="single-machine build: DataLoader decoding processes")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--actors", type=int, default=1, help="Ray build: encoder actors")
    p.add_argument("--ray-cpus", type=int, default=2, help="logical CPUs per Ray node")
    p.add_argument("--ray-workers", type=int, default=0, help="Ray worker nodes besides the head")
    args = p.parse_args()

    import ray

    from bench.indexing import JPEG_DIR, make_photos
    from cluster.build import build_ray
    from cluster.local import LocalRayCluster
    from cluster.settings import RaySettings
    from indexer.build import BuildOptions, build_index
    from regis.models.encoder import build_encoder

    print_machine({"bench": "ray_indexing", **vars(args)})
    make_photos(args.n)
    folder = JPEG_DIR / "photos"
    n_files = len(list(folder.glob("*.jpg")))
    encoder = build_encoder("efficientnet-lite0")
    out = DATA_DIR / "idx" / "ray-indexing"
    shutil.rmtree(out, ignore_errors=True)
    rows = []

    t0 = time.perf_counter()
    rep = build_index(folder, out / "single", encoder,
                      BuildOptions(batch_size=args.batch_size, num_workers=args.workers, progress=False))
    wall = time.perf_counter() - t0
    rows.append({"build": f"single machine ({args.workers} decode workers)", "images": rep.added,
                 "wall_s": wall, "images_per_s": rep.added / wall, "embed_images_per_s": rep.images_per_s})
    print("row:", json.dumps(rows[-1]), flush=True)

    with LocalRayCluster(head_cpus=args.ray_cpus, worker_cpus=args.ray_cpus, workers=args.ray_workers,
                         object_store_bytes=1024**3) as cluster:
        ray.init(address=cluster.address, namespace="regis-bench", log_to_driver=False)
        try:
            settings = RaySettings(build_batch_size=args.batch_size, build_encoder_actors=args.actors,
                                   encoder_num_cpus=1, build_decode_cpus=0.5, build_checkpoint_images=10**9)
            t0 = time.perf_counter()
            rep = build_ray(folder, out / "ray", encoder, args.shards, settings)
            wall = time.perf_counter() - t0
        finally:
            ray.shutdown()
    rows.append({"build": f"Ray Data ({args.ray_workers + 1} nodes x {args.ray_cpus} CPUs, {args.actors} encoder "
                          f"actors, {args.shards} shards)", "images": rep.added, "wall_s": wall,
                 "images_per_s": rep.added / wall, "embed_images_per_s": rep.images_per_s})
    print("row:", json.dumps(rows[-1]), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    print(f"\n{n_files} JPEG files\n")
    print("| build | images | wall s | images/s end to end | images/s embedding |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['build']} | {r['images']} | {r['wall_s']:.1f} | {r['images_per_s']:.1f} | "
              f"{r['embed_images_per_s']:.1f} |")


if __name__ == "__main__":
    main()
