"""The pre-issue-11 server (before dynamic batching) on this machine, driven by today's load generator.

1. ``--pre``: a worktree of the old commit (``git worktree add --detach /work/wt/pre f914a96``). In a
   subprocess with only that tree on ``PYTHONPATH``, the old ``IndexWriter`` and ``build_encoder
   ("efficientnet-lite0")`` write ``--n-db`` images of the tokens ``bench.service`` indexes (``--tokens``:
   ``synthetic_tokens``, or ``corpus_tokens``, the real ones of ``bench.corpus``; handed over as a temporary
   .npy file), under the old encoder record (cached under ``$REGIS_BENCH_DATA/idx/serve-synth-lite0-N-pre-
   <commit>``, or ``serve-lite0-N-pre-<commit>`` for the corpus).
2. The old ``python -m regis serve`` (cwd and ``PYTHONPATH`` = the old tree; ``--torch-threads``: its
   ``REGIS_TORCH_THREADS``, default: unset, torch's default as in BENCHMARKS section 5).
3. Today's clients (``bench.service.run_level`` -> ``bench.loadgen``): the same 640 px JPEG requests, k = 10,
   each level in ``--clients`` ``--repeats`` times.

Usage::

    python -m bench.pre_issue --pre /work/wt/pre --clients 1,8,32 --repeats 1,1,3 [--tokens corpus]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import DATA_DIR, print_machine
from bench.service import free_port, run_level

BUILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.models.encoder import build_encoder
path, tokens_file, folder = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tokens = np.load(tokens_file, mmap_mode="r")
enc = build_encoder("efficientnet-lite0")
n_db, t_per, dim = tokens.shape
if (t_per, dim) != (enc.config.tokens_per_image, enc.config.dim):
    raise SystemExit(f"tokens {tokens.shape} do not fit the old encoder")
t0 = time.perf_counter()
with IndexWriter(path, enc.config, enc.weights_info) as w:
    ids = w.allocate_ids(n_db)
    for start in range(0, n_db, 2_000):
        part = ids[start : start + 2_000]
        recs = [ImageRecord(int(i), f"{folder}/{i}.png", "0" * 64, 28, 28, 1, 0.0) for i in part]
        w.put(recs, np.asarray(tokens[start : start + len(part)], dtype=np.float32))
    m = w.commit()
print("built:", json.dumps({"index": str(path), "images": n_db, "tokens_per_image": t_per, "dim": dim,
                            "spec": m.faiss.spec, "build_s": time.perf_counter() - t0}), flush=True)
"""


def write_tokens(out: Path, n_db: int, tokens: str) -> None:
    """Writes the (n_db, 10, 1280) float32 tokens ``bench.service.build_index`` indexes to ``out`` (.npy), for the
    old tree's writer (which cannot import today's ``bench``)."""
    from bench.service import corpus_tokens, synthetic_tokens

    chunks = corpus_tokens(n_db) if tokens == "corpus" else synthetic_tokens(n_db, 10, 1280)
    arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n_db, 10, 1280))
    for start, part in chunks:
        arr[start : start + len(part)] = part
    arr.flush()
    del arr



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pre", type=Path, required=True, help="worktree of the pre-issue commit")
    p.add_argument("--n-db", type=int, default=10_000)
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--repeats", default="1", help="runs per level: one number, or one per --clients entry")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--min-requests-per-client", type=int, default=2)
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--tokens", choices=["synthetic", "corpus"], default="synthetic",
                   help="the index's tokens, as bench.service --tokens (corpus: bench.corpus's real tokens)")
    args = p.parse_args()

    from bench.indexing import JPEG_DIR, make_photos

    pre = args.pre.resolve()
    commit = subprocess.run(["git", "-C", str(pre), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    print_machine({"bench": "pre_issue", "pre_commit": commit, "n_db": args.n_db, "tokens": args.tokens,
                   "service_torch_threads": args.torch_threads})
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIS_") or k == "REGIS_BENCH_DATA"}
    env["PYTHONPATH"] = str(pre)
    name = "serve-synth-lite0" if args.tokens == "synthetic" else "serve-lite0"
    index = DATA_DIR / "idx" / f"{name}-{args.n_db}-pre-{commit}"
    if not (index / "CURRENT").exists():
        with tempfile.TemporaryDirectory() as tmp:
            tokens_file = Path(tmp) / "tokens.npy"
            write_tokens(tokens_file, args.n_db, args.tokens)
            folder = "synth" if args.tokens == "synthetic" else "fmnist"
            subprocess.run([sys.executable, "-c", BUILD, str(index), str(tokens_file), folder], cwd=pre, env=env,
                           check=True)
    manifest = sorted(index.glob("**/manifest.json"))[-1]
    print("manifest encoder:", json.dumps(json.loads(manifest.read_text()).get("encoder", {}))[:600], flush=True)
    make_photos(64)
    payloads = [f.read_bytes() for f in sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]]
    if args.torch_threads:
        env["REGIS_TORCH_THREADS"] = str(args.torch_threads)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "regis", "serve", "--index", str(index), "--port", str(port),
                               "--log-level", "warning"], cwd=pre, env=env)
    rows = []
    try:
        import httpx

        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the old server did not come up")
            time.sleep(0.5)
        url = base + "/v1/search"
        run_level(url, payloads, 2, 8)  # warm-up
        levels = [int(x) for x in args.clients.split(",")]
        reps = [int(x) for x in args.repeats.split(",")]
        reps = reps * len(levels) if len(reps) == 1 else reps
        for c, n in zip(levels, reps, strict=True):
            for rep in range(n):
                la = os.getloadavg()[0]
                row = {"mode": f"pre-{commit}", "run": rep + 1, "loadavg_before": la,
                       "start": time.strftime("%H:%M:%S"),
                       **run_level(url, payloads, c, max(args.requests, args.min_requests_per_client * c),
                                   [server.pid])}
                rows.append(row)
                print("row:", json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("\n| mode | clients | run | start | loadavg | requests | errors | p50 ms | p99 ms | req/s | "
          "server CPU ms/req | server decode ms | server encode ms | server candidates ms | server rerank ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['clients']} | {r['run']} | {r['start']} | {r['loadavg_before']:.2f} | "
              f"{r['requests']} | {r['errors']} | {r.get('p50_ms', 0):.0f} | {r.get('p99_ms', 0):.0f} | "
              f"{r['throughput_qps']:.1f} | {r.get('server_cpu_ms_per_req', 0):.1f} | "
              f"{r.get('server_decode_ms', 0):.1f} | {r.get('server_encode_ms', 0):.1f} | "
              f"{r.get('server_candidates_ms', 0):.1f} | {r.get('server_rerank_ms', 0):.1f} |")


if __name__ == "__main__":
    main()
