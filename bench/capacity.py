"""Capacity model of regis on Ray for N images (docs/SCALE.md section 4), from measured per-shard figures.

Inputs, all measured:

1. ``--deployment-log``: the output of ``bench.service`` with a ``ray/S`` mode run with one deployment per shard
   (``REGIS_RAY_SHARD_PLACEMENT=deployment``): each Ray process's CPU ms per request and resident MiB at the
   largest client count (the mean over the rows of that count): the ingress (decode, encode, the shard calls:
   ``i``), Ray's HTTP proxy (``p``), each shard replica (its search plus Ray Serve's call machinery around it,
   ``c(n) + o``), Ray's own processes (GCS, raylet, controller, agents).
2. ``c(n)`` at the run's shard size: the same shards' batched search measured here, in this process, on one
   thread (``time.process_time`` per query of ``ShardSearcher.search_batch``, batches of ``--batch`` queries, the
   query tokens of ``bench.indexing``'s photos encoded by the collection's encoder: what the service searches),
   so ``o`` = shard replica CPU per request - ``c(n)``: what a shard costs for being a Ray Serve deployment.
3. ``--sizes``: ``bench.million``'s JSON rows (docs/results/million/): per shard size ``n`` its one-thread
   search cost (``1000 / qps_1thread_warm``, ms: ``c(n)``), resident bytes per image (``r``), disk bytes per image.
4. Disk per shard at the run's size: ``bench.common.dir_bytes`` (as ``du``) of the collection's shard folders
   (``--collection``).

Printed: the inputs, then for each measured shard size ``n``: shards ``S = ceil(N / n)``, RAM per shard replica
``b + n x r`` (``b``: the run's shard replica, resident MiB), disk per shard, QPS per replica core
``1000 / (c(n) + o)``, CPU per query ``i + p + S x (c(n) + o)``, the nodes one replica of every shard needs
(``--node-cores``, ``--node-ram-gib``: shard replicas per node by memory and by cores, one core each), and the
QPS those nodes serve (CPU-bound: their cores x 1000 / CPU per query).

Usage::

    python -m bench.capacity --deployment-log docs/results/ray/service-deployment-4k.txt \\
        --collection $REGIS_BENCH_DATA/idx/serve-lite0-10000-roi160-tokens-roi-cues-PQ640x4fs-shards2 \\
        --sizes docs/results/million/sizes-100k-1m.json --images 100000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from bench.common import dir_bytes, print_machine


def service_rows(log: Path) -> list[dict]:
    """The ``row:`` JSON lines of a ``bench.service`` output."""
    return [json.loads(line.split("row:", 1)[1]) for line in log.read_text().splitlines() if line.startswith("row:")]


def ray_figures(rows: list[dict]) -> dict:
    """{"clients", "cpu": {role: ms per request}, "rss_mib": {role: MiB}, "qps", "shards"} of the ray rows at the
    largest client count (mean over those rows); roles: "ingress", "proxy", "shard" (per shard replica), "ray"
    (Ray's own processes), "total"."""
    ray = [r for r in rows if r["mode"].startswith("ray") and "server_cpu_ms_per_req_by_process" in r]
    if not ray:
        raise SystemExit("no ray row with per-process CPU in the log")
    clients = max(r["clients"] for r in ray)
    ray = [r for r in ray if r["clients"] == clients]

    def roles(by: dict) -> dict:
        out = {"ingress": 0.0, "proxy": 0.0, "shard": [], "ray": 0.0}
        for kind, v in by.items():
            if "Ingress" in kind:
                out["ingress"] += v
            elif "ProxyActor" in kind:
                out["proxy"] += v
            elif ":shard-" in kind:
                out["shard"].append(v)
            else:
                out["ray"] += v
        return out

    cpu = [roles(r["server_cpu_ms_per_req_by_process"]) for r in ray]
    rss = [roles(r["server_rss_mib_by_process"]) for r in ray]
    shards = len(cpu[0]["shard"])
    if not shards:
        raise SystemExit("no shard replica in the log's ray rows: run it with REGIS_RAY_SHARD_PLACEMENT=deployment")
    mean = lambda xs: float(np.mean(xs))  # noqa: E731
    return {"clients": clients, "shards": shards, "qps": mean([r["throughput_qps"] for r in ray]),
            "cpu": {"ingress": mean([c["ingress"] for c in cpu]), "proxy": mean([c["proxy"] for c in cpu]),
                    "shard": mean([np.mean(c["shard"]) for c in cpu]), "ray": mean([c["ray"] for c in cpu]),
                    "total": mean([r["server_cpu_ms_per_req"] for r in ray])},
            "rss_mib": {"ingress": mean([c["ingress"] for c in rss]), "proxy": mean([c["proxy"] for c in rss]),
                        "shard": mean([np.mean(c["shard"]) for c in rss]), "ray": mean([c["ray"] for c in rss])}}


def shard_search_ms(collection: Path, batch: int, repeats: int) -> tuple[float, int]:
    """(CPU ms per query of the shards' batched search on one thread, mean over the shards; images per shard)."""
    import faiss
    import torch

    from bench.indexing import JPEG_DIR, make_photos
    from regis.sharding.engine import ShardedQueryEngine, shard_ref
    from regis.sharding.layout import read_state

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    make_photos(64)
    engine = ShardedQueryEngine.open(collection)
    try:
        photos = sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]
        pixels = torch.stack([engine.decode_bytes(p.read_bytes())[0] for p in photos])
        queries = np.ascontiguousarray(engine.encode_pixels(pixels), dtype=np.float32)
        state = read_state(collection)
        live = engine.shards[0].live
        per_shard, images = [], []
        for s in range(state.num_shards):
            searcher = live.at(shard_ref(state, s))
            images.append(searcher.info()["images"])
            for b in range(0, len(queries), batch):  # warm-up
                searcher.search_batch(queries[b : b + batch], 10)
            t0, n = time.process_time(), 0
            for _ in range(repeats):
                for b in range(0, len(queries), batch):
                    searcher.search_batch(queries[b : b + batch], 10)
                    n += len(queries[b : b + batch])
            per_shard.append((time.process_time() - t0) * 1e3 / n)
    finally:
        engine.close()
    return float(np.mean(per_shard)), int(np.mean(images))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment-log", type=Path, required=True)
    p.add_argument("--collection", type=Path, required=True, help="the sharded collection that run served")
    p.add_argument("--sizes", type=Path, required=True, help="bench.million JSON rows (per shard size)")
    p.add_argument("--images", type=int, default=100_000_000)
    p.add_argument("--node-cores", type=int, default=16)
    p.add_argument("--node-ram-gib", type=float, default=64.0)
    p.add_argument("--batch", type=int, default=4, help="queries per batched search (the service's batch)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    print_machine({"bench": "capacity"})
    ray = ray_figures(service_rows(args.deployment_log))
    c_small, n_small = shard_search_ms(args.collection, args.batch, args.repeats)
    o = max(ray["cpu"]["shard"] - c_small, 0.0)
    shard_dirs = sorted(d for d in args.collection.iterdir() if d.is_dir() and d.name.startswith("shard-"))
    disk_small = float(np.mean([dir_bytes(d) for d in shard_dirs]))
    inputs = {"clients": ray["clients"], "run_shards": ray["shards"], "run_qps": round(ray["qps"], 1),
              "i_ingress_ms": round(ray["cpu"]["ingress"], 1), "p_proxy_ms": round(ray["cpu"]["proxy"], 1),
              "ray_own_ms": round(ray["cpu"]["ray"], 1), "shard_replica_ms": round(ray["cpu"]["shard"], 1),
              "shard_images": n_small, "c_small_ms": round(c_small, 2), "o_ms": round(o, 1),
              "shard_replica_rss_mib": round(ray["rss_mib"]["shard"]),
              "ingress_rss_mib": round(ray["rss_mib"]["ingress"]),
              "ray_own_rss_mib": round(ray["rss_mib"]["ray"]), "disk_per_shard_mb": round(disk_small / 1e6, 1)}
    print("inputs:", json.dumps(inputs), flush=True)
    sizes = json.loads(args.sizes.read_text())
    i_p = ray["cpu"]["ingress"] + ray["cpu"]["proxy"]
    print(f"\nN = {args.images:,} images; nodes of {args.node_cores} cores, {args.node_ram_gib:g} GiB\n")
    print("| images per shard n | shards S | c(n) ms | RAM per shard replica GiB | disk per shard GB | QPS per replica "
          "core | CPU per query s | shard replicas per node | nodes, one replica of every shard | QPS of those nodes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in sorted(sizes, key=lambda r: r["images"]):
        n = row["images"]
        c = 1e3 / row["qps_1thread_warm"]
        shards = math.ceil(args.images / n)
        # b + n x r: b the shard replica's resident memory in the run (its process at n_small images: an upper
        # bound of the fixed part), r bench.million's resident bytes per image at size n
        ram_gib = ray["rss_mib"]["shard"] / 1024 + n * row["rss_bytes_per_image"] / 2**30
        disk_gb = n * row["disk_bytes_per_image"] / 1e9
        cpu_s = (i_p + shards * (c + o)) / 1e3
        per_node = max(min(int(args.node_ram_gib * 0.9 // ram_gib), args.node_cores), 1)
        nodes = math.ceil(shards / per_node)
        qps = nodes * args.node_cores / cpu_s
        print(f"| {n:,} ({row['dim']}-d) | {shards:,} | {c:.1f} | {ram_gib:.1f} | {disk_gb:.2f} | "
              f"{1e3 / (c + o):.0f} | {cpu_s:.2f} | {per_node} | {nodes:,} | {qps:.0f} |")
    print("\nloadavg", os.getloadavg())


if __name__ == "__main__":
    main()
