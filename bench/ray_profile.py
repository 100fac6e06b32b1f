"""Where Ray Serve's CPU per request goes: py-spy samples of each Python process of ``regis serve --ray``'s local
cluster (the proxy, the ingress, each shard replica, the Serve controller) while ``--clients`` clients search.

The same index, cluster and settings as ``bench.service``'s ``ray/N`` mode (``bench.service.start_ray``). py-spy
(``pip install --target DIR py-spy``; ``--py-spy DIR/bin/py-spy``) records each process without stopping it
(``--nonblocking``, ``--rate`` samples per second of CPU-busy threads: idle threads are left out, so the samples of
a process are its CPU time). Printed per process: its CPU ms per request over the run (``/proc``), its samples,
and the functions that hold the largest shares of them (inclusive: the function and what it calls; self: the
function's own lines). The raw stacks (py-spy's collapsed format) are written under ``--out``.

Usage::

    python -m bench.ray_profile --py-spy /tmp/pyspy/bin/py-spy --shards 2 --clients 32 --requests 384
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path

from bench.common import print_machine


def summarise(raw: Path, top: int) -> dict:
    """py-spy's collapsed stacks (``frame;frame;... count`` lines) -> {"samples", "inclusive": [(function, share)],
    "self": [(function, share)]}, shares of the process's samples, the ``top`` largest of each."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    share = (lambda c: [(f, round(n / total, 3)) for f, n in c.most_common(top)]) if total else (lambda c: [])
    return {"samples": total, "inclusive": share(inclusive), "self": share(own)}


def main() -> None:
    from bench.indexing import JPEG_DIR, make_photos
    from bench.service import build_index, process_cpu_s, process_kind, run_level, start_ray

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--py-spy", required=True, help="the py-spy executable")
    p.add_argument("--n-db", type=int, default=10_000)
    p.add_argument("--tokens", choices=["corpus", "synthetic"], default="corpus", help="bench.service.build_index")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--ray-cpus", type=int, default=2)
    p.add_argument("--placement", default="auto", help="RaySettings.encoder_placement")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=384)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=Path("/tmp/regis-ray-profile"))
    args = p.parse_args()
    args.batch_max_size, args.batch_max_wait_ms = None, None  # bench.service's defaults (4, 5 ms)

    print_machine({"bench": "ray_profile", "n_db": args.n_db, "shards": args.shards, "clients": args.clients,
                   "requests": args.requests})
    index = build_index(args.n_db, args.tokens)
    make_photos(64)
    payloads = [f.read_bytes() for f in sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]]
    args.out.mkdir(parents=True, exist_ok=True)
    stop, base = start_ray(index, args, args.placement, args.shards)
    try:
        run_level(base + "/v1/search", payloads, 2, 8)  # warm-up
        pids = stop.pids()
        kinds = {pid: process_kind(pid) for pid in pids}
        targets = {pid: k for pid, k in kinds.items() if k.startswith("ray::") and "IDLE" not in k}
        spies = {pid: subprocess.Popen([args.py_spy, "record", "--nonblocking", "--rate", str(args.rate), "--format",
                                        "raw", "--pid", str(pid), "--output",
                                        str(args.out / f"{kinds[pid].replace(':', '_')}-{pid}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for pid in targets}
        threading.Event().wait(2)  # py-spy attached
        before = {pid: process_cpu_s(pid) for pid in pids}
        row = run_level(base + "/v1/search", payloads, args.clients, args.requests)
        after = {pid: process_cpu_s(pid) for pid in pids}
        for spy in spies.values():
            spy.send_signal(signal.SIGINT)
        for spy in spies.values():
            spy.wait(timeout=60)
    finally:
        stop()
    n = row["requests"]
    print("load:", json.dumps({k: row[k] for k in ("clients", "requests", "errors", "throughput_qps", "p50_ms")}))
    by_kind: Counter = Counter()
    for pid in pids:
        by_kind[kinds[pid]] += (after[pid] - before.get(pid, after[pid])) * 1e3 / n
    print("cpu ms per request by process:", json.dumps({k: round(v, 2) for k, v in by_kind.most_common() if v >= 0.05}))
    for pid, kind in targets.items():
        raw = args.out / f"{kind.replace(':', '_')}-{pid}.txt"
        if not raw.exists():
            print(f"{kind}: no samples")
            continue
        s = summarise(raw, args.top)
        cpu = (after[pid] - before.get(pid, after[pid])) * 1e3 / n
        print(f"\n## {kind} (pid {pid}): {cpu:.1f} ms CPU per request, {s['samples']} samples")
        print("inclusive:", json.dumps(s["inclusive"], indent=0))
        print("self:", json.dumps(s["self"], indent=0))
    print("raw stacks under", args.out, "; loadavg", os.getloadavg())


if __name__ == "__main__":
    main()
