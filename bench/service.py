"""Service benchmark: end-to-end query-by-image latency over HTTP under 1, 8, 32 (and 128) concurrent clients,
without and with dynamic batching, side by side in one run.

1. Serving index: the EfficientNet-Lite0 tokens (1280-d, the real encoder's width; ``bench.corpus``) of the
   first ``--n-db`` corpus database images, written with ``IndexWriter`` under the real Lite0 encoder config
   and weights checksum, so ``regis serve`` rebuilds and checks the encoder as for any index. FAISS spec:
   regis's automatic choice for that size. (The corpus tokens come from 96 px inputs, the queries are encoded
   at 224 px by the service: the scores are not meaningful, the work per query is.) Without the corpus
   (``--tokens synthetic``, or when ``$REGIS_BENCH_DATA/corpus`` is missing): clustered random unit tokens of
   the same shape (seeded), same writer, same encoder record.
2. ``python -m regis serve --index ... --port ...`` in a subprocess on 127.0.0.1, env ``REGIS_TORCH_THREADS``
   from ``--torch-threads``; one server per ``--modes`` entry: ``unbatched`` (``REGIS_BATCH_MAX_SIZE=1``, each
   request encoded alone, as before dynamic batching) and ``batched`` (the settings' defaults, or
   ``--batch-max-size`` / ``--batch-max-wait-ms``; ``batched/8``: batch size 8); either followed by ``@onnx``
   / ``@torch`` sets the query runtime (``REGIS_QUERY_RUNTIME``; default: the server's, ONNX Runtime when
   installed), and ``:tN`` sets that server's ``REGIS_TORCH_THREADS`` (e.g. ``batched:t2``, over
   ``--torch-threads``); ``ray``: the same
   index split into ``--shards`` shards (``ray/N``: N shards; ``regis.sharding.write.split_index``) served by
   ``cluster.serve`` on a local one-node Ray cluster of ``--ray-cpus`` logical CPUs with ``regis serve --ray``'s
   defaults (queries encoded in the ingress with the batching above, or ``ray@deployment``: the ``Encoder``
   deployment; one deployment per shard; CPU requests sized from the cluster; no access log, as the ``regis
   serve`` it is compared with). Its rows add the CPU ms per request of each kind of process of the cluster
   (the proxy, the ingress, each shard, Ray's GCS, raylet, controller and agents) and their resident MiB.
   Every server is started first; then each concurrency level runs once per mode, one mode after the other
   (interleaved, so that a shared machine's changing load falls on every mode alike).
3. Clients (``bench.loadgen``): ``c`` keep-alive connections on one asyncio event loop in this process, each
   sending pre-built POST /v1/search requests (a 640 px JPEG from ``bench.indexing``'s photo set as multipart,
   k = 10) one after the other, ``--requests`` requests in all per level (at least ``--min-requests-per-client``
   per client); latency per request (request written -> response read), throughput = requests / wall time. The
   client's own CPU share of the machine is printed (it shares the cores with the server), and for ``regis
   serve`` the server process's CPU time per request. The server's own timings (decode, encode, candidates,
   rerank) are averaged from the responses.
4. ``--index PATH``: serve that existing index instead of step 1's (e.g. ``bench.million --encoder-record
   servable``'s 1M index); each ``regis serve`` mode then also records its start-up (seconds from starting the
   process until ``/healthz`` and until ``/readyz`` answer 200), its resident memory once ready and after each
   level (``VmRSS``, MiB), and ``--json`` writes the start-ups and rows.

Usage::

    python -m bench.service --clients 1,8,32,128 --requests 64 --modes unbatched,batched
    python -m bench.service --clients 8,32 --modes batched@torch,batched@onnx   # the two query runtimes
    python -m bench.service --clients 1,32 --modes batched,batched:t2   # torch threads: default and 2
    python -m bench.service --index $REGIS_BENCH_DATA/idx/tok1m-256-1000000-auto-default-servable \
        --clients 1,32 --modes batched,unbatched --json docs/results/million/serve-1m-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, DATA_DIR, latency_stats, print_machine

ENCODER_VARIANTS = {"default": {}, "one-pass": {"roi_image_size": 0, "query_layout": "tokens"}}


def corpus_tokens(n_db: int):
    """Yields (first row, (n, 10, 1280) float32 tokens) chunks of the first ``n_db`` corpus database images.

    Raises:
        SystemExit: the corpus holds fewer than ``n_db`` database rows."""
    info = json.loads((CORPUS_DIR / "info.json").read_text())
    if info["db"] < n_db:
        raise SystemExit(f"the corpus at {CORPUS_DIR} has {info['db']} database images, fewer than --n-db {n_db}")
    raw = np.memmap(CORPUS_DIR / "raw1280.f16", dtype=np.float16, mode="r",
                    shape=(info["rows"], info["tokens_per_image"], info["dim"]))
    for start in range(0, n_db, 10_000):
        yield start, np.asarray(raw[start : min(n_db, start + 10_000)], dtype=np.float32)


def synthetic_tokens(n_db: int, t_per: int, dim: int, seed: int = 0):
    """Yields (first row, (n, t_per, dim) float32 tokens) chunks of clustered random unit tokens (seeded: n_db / 10
    centres, noise 0.05): the same shapes as the corpus, not its neighbourhoods: a query token's nearest tokens
    belong to more images than among real tokens, so the rerank has more candidates (``bench.search_work``)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(16, n_db // 10), dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for start in range(0, n_db, 2_000):
        n = min(2_000, n_db - start)
        tokens = centres[rng.integers(0, len(centres), (n, t_per))]
        tokens = tokens + 0.05 * rng.standard_normal(tokens.shape).astype(np.float32)
        tokens /= np.linalg.norm(tokens, axis=2, keepdims=True)
        yield start, tokens


def build_index(n_db: int, tokens: str = "synthetic", variant: str = "default", codec: str | None = None):
    """The serving index of ``n_db`` images, (10, 1280) tokens each, under the Lite0 encoder record (cached under
    ``$REGIS_BENCH_DATA/idx``; the name records the token source, the ROI pass, the query layout and a FAISS
    codec other than SQ8).

    Args:
        tokens: "corpus" (the first ``n_db`` database images of ``bench.corpus``: real Fashion-MNIST tokens) or
            "synthetic" (``synthetic_tokens``).
        variant: ``ENCODER_VARIANTS`` key: "default" (today's encoder defaults: two passes, 15 query tokens) or
            "one-pass" (no 160 px ROI pass, 10 query tokens: the pre-issue-11 server's work per query).
        codec: the IVF vector codec ("SQ8", "PQ640x4fs"; None: the one regis picks, ``faiss_index.default_codec``);
            given, the index is written with that spec as regis would size it, and its default depth.
    """
    from regis.indexes import faiss_index
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter
    from regis.models.encoder import build_encoder

    enc = build_encoder("efficientnet-lite0", **ENCODER_VARIANTS[variant])
    roi = enc.config.roi_image_size  # the default encoder's second (ROI) pass: part of the work per query
    # the query layout too: with "tokens+roi-cues" (the CNN default since issue 13's fourth round) a query has
    # 15 tokens against 10, i.e. more search work; an index cached before the field existed means "tokens"
    layout = getattr(enc.config, "query_layout", "tokens")
    # and the FAISS codec regis picks for the tokens' width: an index cached before wide tokens got fast-scan PQ
    # (faiss_index.default_codec) would otherwise keep serving SQ8
    used = codec or faiss_index.default_codec(enc.config.dim, enc.config.framings)
    name = "serve-synth-lite0" if tokens == "synthetic" else "serve-lite0"
    path = DATA_DIR / "idx" / (f"{name}-{n_db}" + (f"-roi{roi}" if roi else "")
                               + ("" if layout == "tokens" else f"-{layout.replace('+', '-')}")
                               + ("" if used == faiss_index.SQ8_CODEC else f"-{used}"))
    if (path / "CURRENT").exists():
        return path
    chunks = (corpus_tokens(n_db) if tokens == "corpus"
              else synthetic_tokens(n_db, enc.config.tokens_per_image, enc.config.dim))
    t0 = time.perf_counter()
    spec = faiss_index.auto_spec(n_db, enc.config.tokens_per_image, enc.config.dim, codec) if codec else None
    with IndexWriter(path, enc.config, enc.weights_info, faiss_spec=spec) as w:
        ids = w.allocate_ids(n_db)
        for start, part_tokens in chunks:
            part = ids[start : start + len(part_tokens)]
            folder = "synth" if tokens == "synthetic" else "fmnist"
            recs = [ImageRecord(int(i), f"{folder}/{i}.png", "0" * 64, 28, 28, 1, 0.0) for i in part]
            w.put(recs, part_tokens)
        m = w.commit()
    print("built:", json.dumps({"index": str(path), "images": n_db, "tokens": tokens, "spec": m.faiss.spec,
                                "build_s": time.perf_counter() - t0}), flush=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_level(url: str, payloads: list[bytes], clients: int, total: int, server_pids: list[int] | None = None
              ) -> dict:
    """``total`` requests from ``clients`` concurrent keep-alive connections (``bench.loadgen``); per-request
    latency, overall throughput, the client's own CPU share of the machine and, given ``server_pids``, the
    server's CPU time per request (ms)."""
    from bench.loadgen import run_load

    before = {p: process_cpu_s(p) for p in server_pids or []}
    r = run_load(url + "?k=10", payloads, clients, total)
    after = {p: process_cpu_s(p) for p in server_pids or []}
    cpu0, cpu1 = sum(before.values()), sum(after.values())
    lat, server = r["latencies_s"], r["timings"]
    means = {f"server_{k}_ms": float(np.mean([s[k] for s in server])) for k in server[0]
             if not k.startswith("at_")} if server else {}  # at_*: traced absolute times (bench.tail)
    extra = {"server_cpu_ms_per_req": (cpu1 - cpu0) * 1e3 / len(lat)} if server_pids and lat else {}
    if server_pids and len(server_pids) > 1 and lat:  # ray: where the CPU went, ms per request per process kind
        extra["server_processes"] = len(server_pids)
        by_kind: dict[str, float] = {}
        for pid, cpu in after.items():
            kind = process_kind(pid)
            by_kind[kind] = by_kind.get(kind, 0.0) + (cpu - before.get(pid, cpu)) * 1e3 / len(lat)
        extra["server_cpu_ms_per_req_by_process"] = {k: round(v, 2) for k, v in sorted(by_kind.items()) if v >= 0.05}
        rss: dict[str, float] = {}
        for pid in after:
            rss[process_kind(pid)] = rss.get(process_kind(pid), 0.0) + process_rss_mib(pid)
        extra["server_rss_mib_by_process"] = {k: round(v, 1) for k, v in sorted(rss.items()) if v >= 1}
    return {"clients": clients, "requests": len(lat), "errors": len(r["errors"]),
            "throughput_qps": len(lat) / r["wall_s"],
            "client_cpu_share": r["client_cpu_s"] / (r["wall_s"] * (os.cpu_count() or 1)),
            **latency_stats(lat), **extra, **means}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc/PID/stat``; 0 elsewhere)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_rss_mib(pid: int) -> float:
    """Resident memory of a process now, MiB (Linux ``/proc/PID/status`` VmRSS; 0 when it is gone)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_kind(pid: int) -> str:
    """What a process of a Ray node is, from its command line (Ray workers set theirs to ``ray::<actor>``):
    e.g. "ray::ServeReplica:regis-bench:Ingress", "ray::ProxyActor", "raylet", "gcs_server", "python"."""
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return "gone"
    first = argv[0].decode(errors="replace").strip()
    if first.startswith("ray::"):
        return first.split()[0]
    name = Path(first.split()[0]).name if first else "?"
    if name.startswith("python") and len(argv) > 1:  # ray's agents and monitors: the script they run
        script = next((Path(a.decode(errors="replace")).name for a in argv[1:] if a.endswith(b".py")), "")
        return f"python {script}".strip()
    return name


def start_server(index, env: dict, poll_s: float = 0.5) -> tuple[subprocess.Popen, str]:
    """``regis serve`` on a free loopback port; returns the process and its base URL once /healthz answers
    (polled every ``poll_s`` seconds)."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "regis", "serve", "--index", str(index), "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.terminate()
            raise SystemExit("the server did not come up")
        time.sleep(poll_s)


def start_server_timed(index, env: dict, poll_s: float = 0.05) -> tuple[subprocess.Popen, str, dict]:
    """``start_server`` plus its start-up: seconds from starting the process until ``/healthz`` answers 200
    (``healthz_s``) and until ``/readyz`` does (``readyz_s``: the index is loaded), each polled every ``poll_s``
    seconds, and the process's ``VmRSS`` once ready (``rss_mib_ready``).

    Raises:
        SystemExit: the server did not come up, or ``/readyz`` did not answer 200 within 300 s.
    """
    import httpx

    t0 = time.monotonic()
    proc, base = start_server(index, env, poll_s)
    healthz_s = time.monotonic() - t0
    while httpx.get(base + "/readyz", timeout=5).status_code != 200:
        if time.monotonic() - t0 > 300 or proc.poll() is not None:
            proc.terminate()
            raise SystemExit("the server did not become ready")
        time.sleep(poll_s)
    ready = {"healthz_s": healthz_s, "readyz_s": time.monotonic() - t0, "rss_mib_ready": process_rss_mib(proc.pid)}
    return proc, base, ready


def start_ray(index, args, placement: str = "auto", shards: int | None = None):
    """The index split into ``shards`` shards (default ``args.shards``; cached) behind Ray Serve on a local Ray
    cluster, queries encoded where ``placement`` says (``RaySettings.encoder_placement``: mode ``ray@ingress`` /
    ``ray@deployment``; ``ray``: the default), CPU requests sized from the cluster as ``regis serve --ray`` sizes
    them, other settings from ``REGIS_RAY_*``; returns a stop function and the base URL once /readyz answers."""
    import httpx
    import ray
    from ray import serve

    from cluster.local import LocalRayCluster
    from cluster.serve import start
    from cluster.settings import RaySettings
    from regis.sharding.layout import is_sharded
    from regis.sharding.write import split_index
    from service.settings import Settings

    shards = shards or args.shards
    collection = index.with_name(f"{index.name}-shards{shards}")
    if not is_sharded(collection):
        split_index(index, collection, shards)
    cluster = LocalRayCluster(head_cpus=args.ray_cpus, workers=0, object_store_bytes=500 * 1024**2).start()

    def stop():
        try:
            serve.shutdown()
            ray.shutdown()
        finally:
            cluster.stop()

    try:
        ray.init(address=cluster.address, namespace="regis-bench", log_to_driver=False)
        # no access log: as the `regis serve` it is compared with (--log-level warning)
        settings = RaySettings(http_port=free_port(), proxy_location="HeadOnly", app_name="regis-bench",
                               encoder_placement=placement, access_log=False,
                               max_batch_size=args.batch_max_size or 4,
                               batch_wait_timeout_s=(args.batch_max_wait_ms or 5.0) / 1e3)
        print("ray settings:", settings.model_dump_json(), flush=True)  # batch, CPUs, max_ongoing_requests
        base = start(collection, Settings(index_dir=collection), settings)
        deadline = time.monotonic() + 600
        while httpx.get(base + "/readyz", timeout=30).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the Ray Serve application did not become ready")
            time.sleep(1)
    except BaseException:
        stop()
        raise
    stop.pids = lambda: [pid for node in cluster.nodes for pid in (node.pid, *process_tree(node.pid))]
    return stop, base


def process_tree(pid: int) -> list[int]:
    """Every process below ``pid`` now (Linux ``/proc``: children, their children, ...): a Ray node's GCS, raylet,
    agents and workers (the Serve replicas), whose CPU the ray mode's "server CPU ms/req" sums."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def mode_env(mode: str, args) -> dict:
    """The server's environment for a mode: ``unbatched`` or ``batched``, optionally followed by ``@RUNTIME``
    (``REGIS_QUERY_RUNTIME``: auto, onnx, torch; e.g. ``batched@torch``), then optionally ``:tN``
    (``REGIS_TORCH_THREADS=N``; e.g. ``batched@onnx:t2``)."""
    env = dict(os.environ)
    mode, _, options = mode.partition(":")
    mode, _, runtime = mode.partition("@")
    mode, _, batch = mode.partition("/")
    if batch and mode == "batched":
        env["REGIS_BATCH_MAX_SIZE"] = batch
    if runtime:
        if runtime not in ("auto", "onnx", "torch"):
            raise SystemExit(f"unknown query runtime {runtime!r} in mode {mode}@{runtime} (auto, onnx, torch)")
        env["REGIS_QUERY_RUNTIME"] = runtime
    if args.torch_threads:
        env["REGIS_TORCH_THREADS"] = str(args.torch_threads)
    if options:
        if not (options.startswith("t") and options[1:].isdigit() and int(options[1:]) >= 1):
            raise SystemExit(f"unknown server option {options!r} in mode {mode}:{options} (tN: N torch threads)")
        env["REGIS_TORCH_THREADS"] = options[1:]
    if mode == "unbatched":
        env["REGIS_BATCH_MAX_SIZE"] = "1"
    elif mode == "batched":
        if args.batch_max_size and not batch:
            env["REGIS_BATCH_MAX_SIZE"] = str(args.batch_max_size)
        if args.batch_max_wait_ms is not None:
            env["REGIS_BATCH_MAX_WAIT_MS"] = str(args.batch_max_wait_ms)
        if args.encode_workers:
            env["REGIS_BATCH_ENCODE_WORKERS"] = str(args.encode_workers)
    else:
        raise SystemExit(f"unknown mode {mode!r} (unbatched, batched, ray)")
    return env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-db", type=int, default=20_000)
    p.add_argument("--encoder-variant", choices=sorted(ENCODER_VARIANTS), default="default",
                   help="the index's encoder: today's defaults, or one-pass (10 query tokens, no ROI pass)")
    p.add_argument("--tokens", choices=["auto", "corpus", "synthetic"], default="auto",
                   help="serving index tokens: the Lite0 corpus, or synthetic (auto: corpus when present)")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency level (at least one per client)")
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--modes", default="unbatched,batched",
                   help="comma-separated: unbatched, batched (either with @onnx or @torch), ray (@ingress or "
                        "@deployment: where Ray Serve encodes queries; default: the CPU default, the ingress; then "
                        "/N: N shards, default --shards; e.g. ray/1; one ray mode per run)")
    p.add_argument("--shards", type=int, default=2, help="ray mode: shards of the collection")
    p.add_argument("--ray-cpus", type=int, default=2, help="ray mode: logical CPUs of the local Ray node")
    p.add_argument("--batch-max-size", type=int, default=None, help="batched mode: REGIS_BATCH_MAX_SIZE")
    p.add_argument("--batch-max-wait-ms", type=float, default=None, help="batched mode: REGIS_BATCH_MAX_WAIT_MS")
    p.add_argument("--encode-workers", type=int, default=None, help="batched mode: REGIS_BATCH_ENCODE_WORKERS")
    p.add_argument("--faiss-codec", default=None,
                   help="the serving index's IVF vector codec, e.g. SQ8 (default: regis's choice for 1280-d tokens)")
    p.add_argument("--min-requests-per-client", type=int, default=1,
                   help="requests per level at least this many times the clients (e.g. 2: 256 at 128 clients)")
    p.add_argument("--index", type=Path, default=None,
                   help="serve this existing index (no build; --n-db, --tokens, --encoder-variant unused)")
    p.add_argument("--json", type=Path, default=None, help="write the start-ups and rows here")
    args = p.parse_args()

    from bench.indexing import JPEG_DIR, make_photos

    print_machine({"bench": "service", "n_db": args.n_db, "service_torch_threads": args.torch_threads,
                   "modes": args.modes, "encoder_variant": args.encoder_variant,
                   "batch_max_size": args.batch_max_size, "batch_max_wait_ms": args.batch_max_wait_ms,
                   "encode_workers": args.encode_workers, "faiss_codec": args.faiss_codec,
                   "index": str(args.index) if args.index else None})
    synthetic = args.tokens == "synthetic" or (args.tokens == "auto" and not (CORPUS_DIR / "info.json").exists())
    if args.index is not None:
        index = args.index
    else:
        index = build_index(args.n_db, "synthetic" if synthetic else "corpus", args.encoder_variant,
                            args.faiss_codec)
    make_photos(64)
    payloads = [f.read_bytes() for f in sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]]
    rows = []
    modes = args.modes.split(",")
    if sum(m.partition("@")[0].partition("/")[0] == "ray" for m in modes) > 1:
        raise SystemExit("one ray mode per run: this process joins one Ray cluster (ray.init); run the others apart")
    servers: dict[str, tuple] = {}
    pids: dict[str, list[int]] = {}
    startups: dict[str, dict] = {}
    load_before = os.getloadavg()
    print("loadavg before:", os.getloadavg(), flush=True)
    try:
        for mode in modes:
            if mode.partition("@")[0].partition("/")[0] == "ray":
                base, _, shards = mode.partition("/")
                servers[mode] = start_ray(index, args, base.partition("@")[2] or "auto", int(shards or 0) or None)
            else:
                proc, base, ready = start_server_timed(index, mode_env(mode, args))
                servers[mode] = (lambda proc=proc: (proc.terminate(), proc.wait(timeout=30)), base)
                pids[mode] = [proc.pid]
                startups[mode] = {"mode": mode, "index": str(index), **ready}
                print("startup:", json.dumps(startups[mode]), flush=True)
            run_level(servers[mode][1] + "/v1/search", payloads, 2, 8)  # warm-up
        for c in [int(x) for x in args.clients.split(",")]:
            for mode in modes:
                server_pids = pids.get(mode)
                if server_pids is None and hasattr(servers[mode][0], "pids"):  # ray: every process of the cluster
                    server_pids = servers[mode][0].pids()
                row = {"mode": mode, **run_level(servers[mode][1] + "/v1/search", payloads, c,
                                                 max(args.requests, args.min_requests_per_client * c), server_pids)}
                if mode in startups:  # regis serve: its resident memory after this level
                    row["server_rss_mib"] = process_rss_mib(pids[mode][0])
                rows.append(row)
                print("row:", json.dumps(row), flush=True)
    finally:
        for stop, _ in servers.values():
            stop()
    print("loadavg after:", os.getloadavg(), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"index": str(index), "loadavg_before": load_before,
                                         "loadavg_after": os.getloadavg(), "startups": list(startups.values()),
                                         "rows": rows}, indent=1))
    print("\n| mode | clients | requests | errors | p50 ms | p99 ms | throughput req/s | client CPU % | "
          "server CPU ms/req | server decode ms | server encode ms | server candidates ms | server rerank ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu = f"{r['server_cpu_ms_per_req']:.1f}" if "server_cpu_ms_per_req" in r else "-"
        print(f"| {r['mode']} | {r['clients']} | {r['requests']} | {r['errors']} | {r.get('p50_ms', 0):.0f} | "
              f"{r.get('p99_ms', 0):.0f} | {r['throughput_qps']:.1f} | {100 * r['client_cpu_share']:.1f} | {cpu} | "
              f"{r.get('server_decode_ms', 0):.1f} | {r.get('server_encode_ms', 0):.1f} | "
              f"{r.get('server_candidates_ms', 0):.1f} | {r.get('server_rerank_ms', 0):.1f} |")


if __name__ == "__main__":
    main()
