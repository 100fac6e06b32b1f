"""Where the latency tail of the batched service comes from: per-request stage times, slowest 5 % against the
median band, at one concurrency level.

The server (``regis serve`` on ``bench.service``'s synthetic two-pass index, batched defaults unless
``--env``) runs with ``REGIS_TRACE_STAGES=1``: each response's ``timings_ms`` then carries the absolute
``time.perf_counter()`` of each stage (``service.batched``); the client (``bench.loadgen``) records when it
wrote each request and when it read the response. Both clocks are CLOCK_MONOTONIC on the same machine, so::

    to_server    written -> the search handler entered (request read, multipart parse, event-loop wait)
    decode_wait  handler -> decode thread started (thread pool)
    decode       decode thread (decode slot wait + JPEG decode + transform)
    enc_wait     decoded -> its encoder batch started (encoder queue)
    enc_run      the encoder batch's forward pass (both passes, the whole batch)
    srch_wait    encoded -> its search batch started (search queue)
    srch_run     the batched search (FAISS candidates + rerank, the whole batch)
    back         loop wake-ups after decode, encode and search threads (summed)
    to_client    search done -> response read by the client (response model, JSON, send, client loop)

Also printed: how many requests that entered the handler later left it earlier ("overtaken"), per group.

Usage::

    python -m bench.tail --clients 32 --requests 384
    python -m bench.tail --clients 32 --env REGIS_BATCH_MAX_SIZE=8
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from bench.common import print_machine

STAGES = ["to_server", "decode_wait", "decode", "enc_wait", "enc_run", "srch_wait", "srch_run", "back",
          "to_client"]


def stage_times(sent_s: float, latency_s: float, t: dict) -> dict[str, float] | None:
    """The stage durations (ms) of one traced request; None when it skipped the batchers (alone)."""
    if "at_encode_start" not in t or "at_search_start" not in t:
        return None
    sent, done = sent_s * 1e3, (sent_s + latency_s) * 1e3
    return {
        "to_server": t["at_entry"] - sent,
        "decode_wait": t["at_decode_start"] - t["at_entry"],
        "decode": t["at_decode_end"] - t["at_decode_start"],
        "enc_wait": t["at_encode_start"] - t["at_decoded"],
        "enc_run": t["at_encode_end"] - t["at_encode_start"],
        "srch_wait": t["at_search_start"] - t["at_encoded"],
        "srch_run": t["at_search_end"] - t["at_search_start"],
        "back": (t["at_decoded"] - t["at_decode_end"]) + (t["at_encoded"] - t["at_encode_end"])
        + (t["at_done"] - t["at_search_end"]),
        "to_client": done - t["at_done"],
        "total": latency_s * 1e3,
        "enc_batch": t.get("at_encode_batch", 0.0),
        "enc_cpu": t.get("at_encode_cpu", 0.0),
        "srch_cpu": t.get("at_search_cpu", 0.0),
    }


def analyse(r: dict, skip: int) -> list[dict]:
    """Per-request stage rows of a ``run_load`` result, in the order the handler was entered, the first
    ``skip`` dropped (the ramp-up, before the queues fill)."""
    rows = []
    for sent, lat, t in zip(r["sent_s"], r["latencies_s"], r["timings"], strict=True):
        st = stage_times(sent, lat, t)
        if st is not None:
            rows.append({**st, "entry": t["at_entry"], "done": t["at_done"]})
    rows.sort(key=lambda x: x["entry"])
    for i, row in enumerate(rows):  # overtaken: entered the handler later, left it earlier
        row["overtaken"] = sum(1 for other in rows[i + 1:] if other["done"] < row["done"])
    return rows[skip:]


def print_groups(rows: list[dict]) -> None:
    total = np.array([r["total"] for r in rows])
    lo, hi, p95 = np.percentile(total, 40), np.percentile(total, 60), np.percentile(total, 95)
    groups = {"all": rows, "p40-p60": [r for r in rows if lo <= r["total"] <= hi],
              "slowest 5%": [r for r in rows if r["total"] >= p95]}
    cols = ["total", *STAGES, "enc_batch", "enc_cpu", "srch_cpu", "overtaken"]
    print("\n| group | n | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, g in groups.items():
        vals = [f"{np.mean([r[c] for r in g]):.1f}" for c in cols]
        print(f"| {name} | {len(g)} | " + " | ".join(vals) + " |")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of a process (Linux ``/proc/PID/task``)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-db", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=384)
    p.add_argument("--skip", type=int, default=None, help="first requests dropped (default: the clients)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    p.add_argument("--dump", default=None, help="write the per-request rows as JSON lines here")
    args = p.parse_args()

    from bench.indexing import JPEG_DIR, make_photos
    from bench.loadgen import run_load
    from bench.service import build_index, process_cpu_s, start_server

    print_machine({"bench": "tail", "n_db": args.n_db, "clients": args.clients, "env": args.env})
    index = build_index(args.n_db)
    make_photos(64)
    payloads = [f.read_bytes() for f in sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]]
    env = {**os.environ, "REGIS_TRACE_STAGES": "1", **dict(e.split("=", 1) for e in args.env)}
    print("loadavg before:", os.getloadavg(), flush=True)
    proc, base = start_server(index, env)
    try:
        url = base + "/v1/search?k=10"
        run_load(url, payloads, 2, 8)  # warm-up
        for rep in range(args.repeats):
            cpu0, threads0 = process_cpu_s(proc.pid), thread_cpu_s(proc.pid)
            r = run_load(url, payloads, args.clients, args.requests)
            n = max(1, len(r["latencies_s"]))
            cpu = (process_cpu_s(proc.pid) - cpu0) * 1e3 / n
            threads = thread_cpu_s(proc.pid)
            busy = sorted(((v - threads0.get(k, 0.0)) * 1e3 / n, k) for k, v in threads.items())[::-1]
            print("server threads' CPU ms/req (main = the event loop):", ", ".join(
                f"{'main' if k == proc.pid else k}: {v:.1f}" for v, k in busy if v > 0.05), flush=True)
            ms = np.array(r["latencies_s"]) * 1e3
            print(f"\nrun {rep + 1}: {len(ms)} requests, {len(r['errors'])} errors, "
                  f"{len(ms) / r['wall_s']:.1f} req/s, p50 {np.percentile(ms, 50):.0f} ms, p99 "
                  f"{np.percentile(ms, 99):.0f} ms, mean {ms.mean():.0f} ms, server CPU {cpu:.1f} ms/req", flush=True)
            rows = analyse(r, args.clients if args.skip is None else args.skip)
            print_groups(rows)
            if args.dump:
                with open(args.dump, "a") as f:
                    for row in rows:
                        f.write(json.dumps({"run": rep, **row}) + "\n")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("loadavg after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
