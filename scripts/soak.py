"""Soak test under faults (not in CI): bounded concurrent searches, uploads, deletes and index jobs against the
compose topology run as processes (API, worker, a Redis of its own on a free loopback port, with an append-only
file as in docker-compose.yml), while Redis, the worker and the API are SIGKILLed and restarted at random.

At the end everything is restarted cleanly, the jobs are let finish, and the script prints: requests by kind and
outcome, images lost (an upload answered 201, or 202 whose job finished, that the index does not hold; a delete
answered 200 whose image is still there; a delete answered 404 that no earlier unanswered delete of the same image
explains), duplicated (two live rows with the same bytes), orphaned (uploaded files
no live row points at, staged batches whose job is unknown or finished), HTTP 500s, and the peak RSS and
descriptors of the API and worker. A request that fails without an HTTP answer while the API was up all along
(``dropped_while_api_up``, issue 14 fault 11) fails the run too.

    python scripts/soak.py --minutes 3 --out soak.json

Uses the tiny random test encoder (the mechanics, not the model, are under test). Never touches Redis on 6379.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A restartable child process (its own session, so a SIGKILL takes its whole group)."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen | None = None
        self.kills = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def pids(self) -> list[int]:
        """The process and its children (the worker's work horse)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        out = [self.proc.pid]
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            out += [int(c) for c in children]
        except OSError:
            pass
        return out


def rss_and_fds(pid: int) -> tuple[int, int]:
    """(resident set, bytes; open descriptors) of a process, (0, 0) if it is gone."""
    try:
        rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return 0, 0


def png(seed: int) -> bytes:
    """A unique small image (its bytes are its identity)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


class Ledger:
    """What the clients were told, for the final reconciliation."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: collections.Counter = collections.Counter()
        self.present: dict[str, int] = {}  # sha256 -> id, answered 201 (or a finished 202)
        self.pending: dict[str, str] = {}  # job id -> sha256, answered 202
        self.deleted: set[int] = set()  # answered 200 deleted=true
        self.uncertain: set[str] = set()  # sha256 whose upload or delete got no answer
        self.delete_unanswered: set[int] = set()  # ids whose delete got no answer, a 5xx or a 202
        self.delete_jobs: dict[str, int] = {}  # job id -> image id, delete answered 202
        self.missing: set[int] = set()  # acknowledged images a delete found gone (a loss)
        self.api_epoch = 0  # bumped when the chaos loop kills the API and when it is back
        self.api_down = False

    def api_window(self) -> tuple[int, bool]:
        """(epoch, down) now: a transport error counts as 'API down' when the API was down, or killed or
        restarted, at any moment of the request."""
        with self.lock:
            return self.api_epoch, self.api_down

    def set_api_down(self, down: bool) -> None:
        with self.lock:
            self.api_down = down
            self.api_epoch += 1

    def count(self, kind: str, outcome: str) -> None:
        with self.lock:
            self.outcomes[f"{kind} {outcome}"] += 1


def client_loop(kind: str, url: str, ledger: Ledger, stop: threading.Event, seeds, queries: list[bytes],
                job_every: float = 15.0) -> None:
    http = httpx.Client(base_url=url, timeout=30)
    rng = random.Random(hash(kind) & 0xFFFF)
    while not stop.is_set():
        window = ledger.api_window()
        status = None
        try:
            if kind == "search":
                r = http.post("/v1/search", files={"file": ("q.png", rng.choice(queries))}, params={"k": 5})
            elif kind == "upload":
                seed = next(seeds)
                data = png(seed)
                import hashlib

                sha = hashlib.sha256(data).hexdigest()
                with ledger.lock:
                    ledger.uncertain.add(sha)
                r = http.post("/v1/images", files={"files": (f"{seed}.png", data)})
                with ledger.lock:
                    if r.status_code == 201:
                        ledger.present[sha] = r.json()["images"][0]["id"]
                        ledger.uncertain.discard(sha)
                    elif r.status_code == 202:
                        ledger.pending[r.json()["job_id"]] = sha
                        ledger.uncertain.discard(sha)
                    elif r.status_code < 500:
                        ledger.uncertain.discard(sha)
            elif kind == "delete":
                with ledger.lock:
                    candidates = [(s, i) for s, i in ledger.present.items()
                                  if i not in ledger.deleted and i not in ledger.missing]
                if len(candidates) < 5:
                    time.sleep(0.2)
                    continue
                sha, image_id = rng.choice(candidates)
                with ledger.lock:
                    ledger.uncertain.add(sha)
                    earlier = image_id in ledger.delete_unanswered  # an earlier delete got no definite answer
                    ledger.delete_unanswered.add(image_id)
                r = http.delete(f"/v1/images/{image_id}")
                with ledger.lock:
                    if r.status_code == 200:
                        if r.json()["deleted"]:
                            ledger.deleted.add(image_id)
                        ledger.delete_unanswered.discard(image_id)
                        ledger.uncertain.discard(sha)
                    elif r.status_code == 202:
                        ledger.delete_jobs[r.json()["job_id"]] = image_id
                    elif r.status_code == 404 and earlier:  # that earlier delete ran after all
                        ledger.deleted.add(image_id)
                        ledger.uncertain.discard(sha)
                        status = "404 (an earlier unanswered delete ran)"
                    elif r.status_code < 500 and not earlier:  # a definite answer (a plain 404 is a loss)
                        ledger.delete_unanswered.discard(image_id)
                        ledger.uncertain.discard(sha)
                        if r.status_code == 404:
                            ledger.missing.add(image_id)  # not picked again; the reconciliation counts it lost
            else:  # an index job over the photos folder (incremental: usually nothing to do)
                r = http.post("/v1/jobs/index", json={"folder": "photos"})
                time.sleep(job_every)
            ledger.count(kind, status or str(r.status_code))
        except httpx.HTTPError as exc:
            up = window == ledger.api_window() and not window[1]
            ledger.count(kind, type(exc).__name__ + ("" if up else " (API down)"))
            time.sleep(0.2)
    http.close()


def wait_http(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@dataclasses.dataclass
class Topology:
    """The deployment as processes on loopback: its own redis-server on a free port (never the system one on
    6379), the indexing worker and the API, over the bundled photos, with the tiny random encoder."""

    work: Path
    root: Path
    index: Path
    redis_url: str
    url: str
    redis: Proc
    worker: Proc
    api: Proc

    @classmethod
    def create(cls, prefix: str, extra_env: dict, appendonly: bool, worker_args: list[str]) -> Topology:
        """Lay out a temporary folder (images, index, logs) and the three processes, not started yet.

        Args:
            prefix: Redis key prefix and temporary folder name part.
            extra_env: REGIS_* settings on top of the common ones.
            appendonly: whether redis-server keeps an append-only file (the soak reads jobs back from it).
            worker_args: extra ``regis worker`` options.
        """
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            sys.exit("redis-server is not installed")
        work = Path(tempfile.mkdtemp(prefix=f"regis-{prefix}-"))
        root, index = work / "images", work / "index"
        from regis.data.sample_photos import collect_sample_photos

        collect_sample_photos(root / "photos")
        redis_port, api_port = free_port(), free_port()
        if redis_port == 6379:
            raise RuntimeError("free_port gave 6379, the system Redis")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "REGIS_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "REGIS_REDIS_PREFIX": prefix,
               "REGIS_INDEX_DIR": str(index), "REGIS_IMAGES_ROOT": str(root), "REGIS_BACKBONE": "vit-tiny-reg4-test",
               "REGIS_RANDOM_INIT": "true", "REGIS_ENABLE_JOBS": "true", "REGIS_BUILD_WORKERS": "0",
               "REGIS_TORCH_THREADS": "1", **extra_env}
        py = sys.executable
        redis = Proc("redis", [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "yes" if appendonly else "no", "--dir", str(work)], env,
                     work / "redis.log")
        worker = Proc("worker", [py, "-m", "regis", "worker", *worker_args, "--log-level", "warning"], env,
                      work / "worker.log")
        api = Proc("api", [py, "-m", "regis", "serve", "--port", str(api_port), "--log-level", "warning"], env,
                   work / "api.log")
        return cls(work, root, index, env["REGIS_REDIS_URL"], f"http://127.0.0.1:{api_port}", redis, worker, api)

    def start_and_index(self, timeout_s: float = 300) -> int | None:
        """Start Redis, the worker and the API, queue an index job of the photos and wait (up to ``timeout_s``)
        for its first version. Returns the index version (None if none was published in time)."""
        for p in (self.redis, self.worker, self.api):
            p.start()
            time.sleep(0.5)
        wait_http(self.url)
        httpx.post(f"{self.url}/v1/jobs/index", json={"folder": "photos"}, timeout=30)
        deadline = time.monotonic() + timeout_s
        while (version := httpx.get(f"{self.url}/healthz", timeout=10).json()["index_version"]) is None \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        return version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=1, help="threads per kind (search, upload, delete, job)")
    parser.add_argument("--chaos-every", type=float, default=12.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--job-every", type=float, default=15.0,
                        help="seconds between index jobs (a worker takes ~5-10 s per job on 2 cores)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here too")
    args = parser.parse_args()
    random.seed(args.seed)
    topo = Topology.create("soak", {"REGIS_WRITE_WAIT_S": "10", "REGIS_STAGING_GRACE_S": "0"}, appendonly=True,
                           worker_args=["--job-monitoring-interval", "1", "--heartbeat-grace", "3",
                                        "--maintenance-interval", "2"])
    work, root, index, url = topo.work, topo.root, topo.index, topo.url
    redis, worker, api = topo.redis, topo.worker, topo.api
    queries = [p.read_bytes() for p in sorted((root / "photos").iterdir())[:6]]
    topo.start_and_index()

    ledger = Ledger()
    stop = threading.Event()
    seeds = iter(range(10**6))
    seeds_lock = threading.Lock()

    def next_seed():
        while True:
            with seeds_lock:
                yield next(seeds)

    threads = [threading.Thread(target=client_loop, daemon=True,
                                args=(kind, url, ledger, stop, next_seed(), queries, args.job_every))
               for kind in ("search", "upload", "delete", "job") for _ in range(args.clients)]
    peak = {"api_rss": 0, "api_fds": 0, "worker_rss": 0, "worker_fds": 0}

    def sample():
        for name, p in (("api", api), ("worker", worker)):
            for pid in p.pids():
                rss, fds = rss_and_fds(pid)
                peak[f"{name}_rss"] = max(peak[f"{name}_rss"], rss)
                peak[f"{name}_fds"] = max(peak[f"{name}_fds"], fds)

    for t in threads:
        t.start()
    t0 = time.monotonic()
    kills = collections.Counter()
    while time.monotonic() - t0 < args.minutes * 60:
        deadline = time.monotonic() + random.expovariate(1 / args.chaos_every)
        while time.monotonic() < deadline:
            sample()
            time.sleep(0.5)
        victim = random.choice([redis, worker, api])
        if victim is api:
            ledger.set_api_down(True)
        victim.kill()
        kills[victim.name] += 1
        time.sleep(random.uniform(0.5, 3.0))
        victim.start()
        if victim is api:
            try:
                wait_http(url)
            except RuntimeError:
                pass
            ledger.set_api_down(False)
    stop.set()
    for t in threads:
        t.join(timeout=60)

    # settle: a clean restart of the API (start-up clean-up of staging), every job finished
    api.stop()
    api.start()
    wait_http(url)
    http = httpx.Client(base_url=url, timeout=30)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        jobs = http.get("/v1/jobs", params={"limit": 200}).json()["jobs"]
        if all(j["state"] in ("done", "failed") for j in jobs):
            break
        time.sleep(1)
    for job_id, sha in list(ledger.pending.items()):
        info = http.get(f"/v1/jobs/{job_id}").json()
        if info.get("state") == "done":
            ledger.present[sha] = next(im["id"] for im in info["result"]["images"])
    for job_id, image_id in list(ledger.delete_jobs.items()):
        info = http.get(f"/v1/jobs/{job_id}").json()
        if info.get("state") == "done" and image_id in info["result"].get("deleted", []):
            ledger.deleted.add(image_id)
    http.close()
    api.stop()
    worker.stop()

    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.uploads import STAGING_DIR, upload_file

    snap = IndexSnapshot.open(index)
    rows = list(snap.table.iter_all())
    snap.close()
    live_sha = collections.Counter(r.sha256 for r in rows)
    live_ids = {r.id for r in rows}
    lost = [sha for sha, i in ledger.present.items()
            if i not in ledger.deleted and sha not in ledger.uncertain and live_sha[sha] == 0]
    resurrected = [i for i in ledger.deleted if i in live_ids]
    duplicated = [sha for sha, n in live_sha.items() if n > 1]
    unanswered_live = [r for r in rows if r.path.startswith(".uploads/") and r.sha256 not in ledger.present]
    uploads_dir = root / ".uploads"
    referenced = {upload_file(uploads_dir, r.path) for r in rows if r.path.startswith(".uploads/")}
    stored = {p for p in uploads_dir.glob("??/*") if p.is_file()}
    orphan_files = sorted(str(p) for p in stored - referenced)
    staging = uploads_dir / STAGING_DIR
    from regis.jobs.names import RedisNames
    from regis.jobs.rq_queue import RedisJobQueue

    queue = RedisJobQueue(topo.redis_url, RedisNames("soak"))
    states = {p.name: (queue.get(p.name).state if queue.get(p.name) else None)
              for p in (staging.iterdir() if staging.is_dir() else [])}
    orphan_staged = sorted(b for b, state in states.items() if state in (None, "done", "failed"))
    staged_pending = len(states) - len(orphan_staged)  # their job is still queued: it will place them
    queue.close()
    redis.stop()

    figures = {
        "minutes": args.minutes, "clients_per_kind": args.clients, "kills": dict(kills),
        "requests": dict(sorted(ledger.outcomes.items())),
        "http_500": sum(n for k, n in ledger.outcomes.items() if k.endswith(" 500")),
        "dropped_while_api_up": sum(n for k, n in ledger.outcomes.items()
                                    if not k.split(" ", 1)[1][0].isdigit() and not k.endswith("(API down)")),
        "uploads_acknowledged": len(ledger.present), "deletes_acknowledged": len(ledger.deleted),
        "images_live": len(rows), "lost": len(lost), "deleted_but_present": len(resurrected),
        "duplicated": len(duplicated), "uploads_live_without_2xx": len(unanswered_live),
        "orphaned_files": len(orphan_files), "orphaned_staging": len(orphan_staged),
        "staged_for_queued_jobs": staged_pending,
        "peak_api_rss_mb": round(peak["api_rss"] / 2**20), "peak_api_fds": peak["api_fds"],
        "peak_worker_rss_mb": round(peak["worker_rss"] / 2**20), "peak_worker_fds": peak["worker_fds"],
        "workdir": str(work),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    if figures["lost"] or figures["duplicated"] or figures["orphaned_files"] or figures["orphaned_staging"] \
            or figures["http_500"] or figures["deleted_but_present"] or figures["dropped_while_api_up"]:
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
