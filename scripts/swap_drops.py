"""Searches across index swaps in Redis mode (issue 14, fault 11), not in CI.

Runs the topology as processes (a redis-server of its own on a free loopback port, ``regis serve``, ``regis
worker``, the tiny random test encoder), then ``--rounds`` rounds of ``--concurrency`` concurrent searches
through one httpx client with its defaults (keep-alive expiry 5 s); after each round it uploads an image (a job:
the worker writes a new version, pub/sub tells the API to swap) and idles for a time drawn from
[``--idle`` - 0.4, ``--idle`` + 0.1] seconds, so the client's pooled connections are reused at about that age.
Prints the searches by outcome (a transport error is a search dropped without a response) and exits 1 if any
search got no 200.

    python scripts/swap_drops.py --rounds 20 --idle 5

With ``REGIS_KEEP_ALIVE_S=5`` in the environment (uvicorn's default, which httpx's 5 s expiry races) a run with
``--rounds 25`` dropped 3 of 1,000 searches; with the default 75 s, 0 (docs/DEPLOY.md).
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from soak import Topology, png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=40, help="searches per round, all at once")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds between rounds, about")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    topo = Topology.create("drops", {"REGIS_WRITE_WAIT_S": "0"}, appendonly=False, worker_args=[])
    work, url, procs = topo.work, topo.url, (topo.redis, topo.worker, topo.api)
    outcomes: collections.Counter = collections.Counter()
    try:
        first = topo.start_and_index()
        probe = httpx.Client(base_url=url, timeout=30)
        limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
        client = httpx.Client(base_url=url, limits=limits)  # httpx defaults otherwise: 5 s keep-alive expiry

        def search(seed: int) -> str:
            try:
                return str(client.post("/v1/search", files={"file": ("q.png", png(seed))}, params={"k": 5})
                           .status_code)
            except httpx.TransportError as exc:
                return type(exc).__name__

        with ThreadPoolExecutor(args.concurrency) as pool:
            for n in range(args.rounds):
                seeds = range(n * args.concurrency, (n + 1) * args.concurrency)
                outcomes.update(pool.map(search, seeds))
                t0 = time.monotonic()
                probe.post("/v1/images", files={"files": (f"{n}.png", png(10**6 + n))})
                pause = rng.uniform(args.idle - 0.4, args.idle + 0.1)
                time.sleep(max(0.0, pause - (time.monotonic() - t0)))
        last = probe.get("/healthz").json()["index_version"]
        print(f"searches by outcome: {dict(outcomes)}; index versions {first} -> {last}")
    finally:
        for p in reversed(procs):
            p.kill()
    shutil.rmtree(work, ignore_errors=True)
    if set(outcomes) - {"200"}:
        sys.exit(1)


if __name__ == "__main__":
    main()
