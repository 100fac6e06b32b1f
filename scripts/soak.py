"""Soak test under faults (not in CI): bounded concurrent searches, uploads, deletes, index jobs, metadata
patches with poisoned values, filters, and a second collection created and deleted again and again, against the
deployment run as processes, while its processes are SIGKILLed and restarted at random.

Two modes (``--mode``):

- ``redis``: the compose topology: API, worker and a Redis of its own on a free loopback port (an append-only
  file, as in docker-compose.yml); the chaos loop kills Redis, the worker or the API.
- ``embedded``: one API that runs the jobs itself (no Redis, no worker); the chaos loop kills the API.

Both run with a collections root beside the default collection's index, as compose does. Clients (one thread
each, ``--clients`` of the first four):

- ``search``, ``upload``, ``delete``, ``job`` on the default collection (unique images: their bytes are their
  identity);
- ``meta``: PATCHes of live images with good metadata (``{"tag": n}``, remembered for the final check) or
  poisoned metadata (NaN, Infinity, lone surrogates as escapes and as raw bytes, 600 levels of nesting, integers
  past 64 bits: each must be 422), uploads with poisoned metadata (422), filters that must answer 200 (listing
  and search) and filters with bad values (422), thumbnails;
- ``churn``: creates collection ``chaos``, leaves it live a few seconds, deletes it, and while it is deleted
  checks it stays so (API and disk; any sighting is a *resurrection*);
- ``chaos-write`` and ``chaos-read``: uploads, index jobs, patches (good and poisoned), searches and filters to
  ``chaos`` whatever its state. A write sent after its delete was answered, and answered before it was created
  again, must be 404 (a 2xx is ``accepted_while_deleted``).

At the end every process is restarted cleanly, the jobs are let finish, ``chaos`` is deleted, and the script
reconciles what clients were told with the index:

- lost (each image once, ``Ledger.losses``): an upload answered 201 (or 202 whose job finished) whose image is
  not live at the end, that no delete acknowledged and that no delete without a definite answer may have
  removed (those are ``gone_after_unanswered_delete``, not counted; in Redis mode only those a finished delete
  job of the run removed, read back from the job records); an image a delete's job found already gone
  (200 ``deleted: false``) with no unanswered delete before. A delete answered 404 proves nothing by itself (the
  API may still serve the version before the upload's job): the final index judges. A PATCH answered 200 whose
  value is not the live one (``metadata_lost``; a later unanswered PATCH of that image makes it uncertain, not
  counted);
- duplicated: two live rows with the same bytes;
- orphaned: uploaded files no live row points at, staged batches whose job is unknown or finished, thumbnails of
  contents no live image has, anything left in the collections root but the tombstone of ``chaos``.

5xx answers are counted by kind, status and error code, and each is *explained* only when a process it
depends on was down or restarted during the request (``503 queue_unavailable`` while Redis was; a ``503
index_unavailable`` never is: a collection without a version answers its searches 200 with no results);
``http_5xx_while_up`` counts the others and fails the run, as do answers outside the expected set of a
request kind (``unexpected``: a poisoned value answered 2xx, a good filter 422 ...), transport errors while the
API was up all along (``dropped_while_api_up``), and the losses above. Peak and final RSS and descriptors of the
API and worker (with its work horse) and the disk bytes of the index, uploads and collections root are sampled.

    python scripts/soak.py --mode redis --minutes 15 --out docs/results/soak/redis.json
    python scripts/soak.py --mode embedded --minutes 15 --out docs/results/soak/embedded.json

Uses the tiny random test encoder (the mechanics, not the model, are under test). Never touches Redis on 6379.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
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
MODES = ("embedded", "redis")
CHAOS = "chaos"  # the collection the churn client creates and deletes
SLOW_S = 20.0  # a request slower than this is counted as slow (the clients wait up to 60 s)
CHAOS_CONFIG = {"name": CHAOS, "backbone": "vit-tiny-reg4-test", "random_init": True}


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


def disk_bytes(paths: list[Path]) -> int:
    """Bytes allocated on disk under ``paths`` (each inode once: hard-linked uploads count once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in paths:
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:  # removed meanwhile
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def png(seed: int) -> bytes:
    """A unique small image (its bytes are its identity)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


# ---------------------------------------------------------------- chaos values (issue 27, items 1, 2, 3, 8)
def _nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def poisoned_metadata() -> list[tuple[str, bytes]]:
    """(name, UTF-8 JSON text of a metadata object) regis must refuse with 422: non-finite numbers, lone
    surrogates (as JSON escapes, and as raw surrogate code points encoded with ``surrogatepass``: bytes that are
    not UTF-8), 600 levels of nesting (about 4 KB, item 1), integers past 64 bits (item 8)."""
    raw = '{"s": "x\ud800y"}'.encode("utf-8", "surrogatepass")
    return [
        ("nan", b'{"n": NaN}'),
        ("infinity", b'{"n": {"m": [1, Infinity]}}'),
        ("-infinity", b'{"n": -Infinity}'),
        ("surrogate", b'{"s": "\\ud800"}'),
        ("surrogate-key", b'{"\\udc00": 1}'),
        ("surrogate-raw", raw),
        ("nesting-600", json.dumps({"d": _nested(600)}).encode()),
        ("int-2^64", b'{"big": 18446744073709551616}'),
        ("int-below-int64", b'{"neg": -9223372036854775809}'),
    ]


def bad_filters() -> list[tuple[str, str]]:
    """(name, filter) that must answer 422 ``invalid_filter`` (item 8)."""
    return [
        ("int-2^64", '{"tag": 18446744073709551616}'),
        ("int-2^64-short", "tag:99999999999999999999"),
        ("infinity", '{"tag": {"gte": 1e400}}'),
        ("surrogate", '{"s": "\\udc00"}'),
        ("surrogate-in", '{"s": {"in": ["a", "\\ud800"]}}'),
        ("nesting-3000", '{"a": ' + "[" * 3000 + "]" * 3000 + "}"),
    ]


GOOD_FILTERS = ['{"tag": {"gte": 0}}', "tag:7", '{"tag": {"in": [1, 2, 3]}, "strict": false}',
                '{"n": {"gt": 1}, "strict": false}']  # field "tag" exists from the start (main patches a photo)
CHAOS_FILTERS = ['{"tag": {"gte": 0}, "strict": false}', '{"n": {"gt": 1}, "strict": false}']  # a new collection

# the answers each kind of request may get while everything it depends on is up (5xx are counted apart)
EXPECTED: dict[str, set[int]] = {
    "search": {200}, "upload": {201, 202}, "delete": {200, 202, 404}, "job": {202},
    "meta-patch": {200, 202, 404}, "meta-poison-patch": {422}, "meta-poison-upload": {422},
    "filter-list": {200}, "filter-search": {200}, "bad-filter-list": {422}, "bad-filter-search": {422},
    "thumbnail": {200, 404},
    "coll-create": {201, 409}, "coll-delete": {204, 404}, "coll-get": {200, 404}, "coll-list": {200},
    "chaos-upload": {201, 202, 404}, "chaos-job": {202, 404}, "chaos-patch": {200, 202, 404},
    "chaos-poison-patch": {404, 422}, "chaos-search": {200, 404}, "chaos-filter": {200, 404},
    "chaos-bad-filter": {404, 422},
}


def explain_5xx(status: int, code: str | None, disturbed: set[str]) -> str | None:
    """Why a 5xx answer is not a defect, or None when nothing explains it.

    Args:
        status: the HTTP status (>= 500).
        code: the ``error.code`` of its JSON body (None when it had none).
        disturbed: the processes that were down, killed or restarted during the request ("redis", "worker",
            "api").

    A 503 ``index_unavailable`` is never explained: a collection without a published version answers its
    searches 200 with no results (issue 27's soak counted 4,608 such 503s from ``chaos`` before that).
    """
    if status == 503 and code == "queue_unavailable" and "redis" in disturbed:
        return "redis down"
    return None


class Ledger:
    """What the clients were told, for the final reconciliation; which processes were down when."""

    def __init__(self, components=("redis", "worker", "api")):
        self.lock = threading.Lock()
        self.outcomes: collections.Counter = collections.Counter()
        self.fivexx: collections.Counter = collections.Counter()  # "kind status code (explanation)"
        self.unexpected: collections.Counter = collections.Counter()  # "kind status"
        self.dropped_while_api_up = 0
        self.present: dict[str, int] = {}  # sha256 -> id, answered 201 (or a finished 202)
        self.pending: dict[str, str] = {}  # job id -> sha256, answered 202
        self.deleted: set[int] = set()  # answered 200 deleted=true (or a 202 whose job deleted it)
        self.uncertain: set[str] = set()  # sha256 whose upload got no answer
        # ids a delete of which got no definite answer (none, a 5xx or a 202): that delete may have run, now or
        # later. Never cleared: a later answer to another delete does not say the earlier one did not run.
        self.delete_unanswered: set[int] = set()
        self.delete_jobs: dict[str, tuple[int, bool]] = {}  # job id -> (image id, earlier unanswered delete),
        # a delete answered 202
        self.gone_by_unanswered: set[int] = set()  # a delete's job found it gone after an unanswered delete
        self.not_found: set[int] = set()  # a delete answered 404: not in the version the API served (not proof
        # of a loss: the API may still serve the version before the upload's job; the end judges)
        self.missing: set[int] = set()  # a delete's job found it gone with no unanswered delete before (a loss)
        self.delete_notes: collections.Counter = collections.Counter()  # how ambiguous delete answers were read
        self.tags: dict[int, int | None] = {}  # image id -> the tag the last PATCH answered 200 set
        self.tags_uncertain: set[int] = set()  # images a PATCH of which got no 200 or 4xx (its job may run later)
        self.windows = {name: [0, False] for name in components}  # name -> [epoch, down]
        # the churn client's view of collection "chaos"
        self.chaos_epoch = 0  # bumped on every state change
        self.chaos_state = "absent"  # "live", "deleted" (its delete answered), "changing" (create / delete sent)
        self.chaos_ids: list[int] = []  # ids of this incarnation
        self.accepted_while_deleted: collections.Counter = collections.Counter()
        self.resurrections = 0  # deleted periods in which the collection was seen again
        self.resurrection_sightings: collections.Counter = collections.Counter()
        self.chaos_cycles = 0
        self.max_latency: dict[str, float] = {}  # kind -> seconds of its slowest request (answered or not)
        self.slow: collections.Counter = collections.Counter()  # kind -> requests slower than SLOW_S
        self.fixed_ids: list[int] = []  # images of the photos folder (never deleted by the clients)
        # embedded mode: one thread runs the jobs in order and a killed API takes its queue with it, so a PATCH
        # answered 200 comes after every earlier one that will ever run (Redis: a retried job may run later)
        self.jobs_in_order = False

    # -- processes
    def set_down(self, name: str, down: bool) -> None:
        with self.lock:
            self.windows[name][0] += 1
            self.windows[name][1] = down

    def window(self) -> dict[str, tuple[int, bool]]:
        with self.lock:
            return {name: (e, d) for name, (e, d) in self.windows.items()}

    def disturbed(self, before: dict[str, tuple[int, bool]]) -> set[str]:
        """The processes that were down at ``before`` or killed / restarted since."""
        now = self.window()
        return {name for name, (epoch, down) in before.items() if down or now[name][0] != epoch}

    # -- chaos collection
    def chaos_view(self) -> tuple[int, str]:
        with self.lock:
            return self.chaos_epoch, self.chaos_state

    def set_chaos(self, state: str) -> None:
        with self.lock:
            self.chaos_epoch += 1
            self.chaos_state = state
            if state != "live":
                self.chaos_ids = []

    # -- answers
    def took(self, kind: str, seconds: float) -> None:
        """Keep the slowest request of each kind, and count those over ``SLOW_S``."""
        with self.lock:
            self.max_latency[kind] = max(self.max_latency.get(kind, 0.0), seconds)
            if seconds > SLOW_S:
                self.slow[kind] += 1

    def record(self, kind: str, status: int, code: str | None, before: dict, label: str | None = None) -> str:
        """Count one HTTP answer; classify a 5xx (explained or not) and an answer outside ``EXPECTED[kind]``.
        Returns the outcome key counted ("kind status" or "kind label")."""
        key = f"{kind} {label or status}"
        with self.lock:
            self.outcomes[key] += 1
        if status >= 500:
            why = explain_5xx(status, code, self.disturbed(before))
            with self.lock:
                self.fivexx[f"{kind} {status} {code} ({why or 'while up'})"] += 1
        elif status not in EXPECTED[kind]:
            with self.lock:
                self.unexpected[f"{kind} {status} {code}"] += 1
        return key

    def record_transport(self, kind: str, exc: Exception, before: dict) -> None:
        up = "api" not in self.disturbed(before)
        with self.lock:
            self.outcomes[f"{kind} {type(exc).__name__}{'' if up else ' (API down)'}"] += 1
            if up:
                self.dropped_while_api_up += 1

    def http_5xx_while_up(self) -> int:
        return sum(n for k, n in self.fivexx.items() if k.endswith("(while up)"))

    # -- deletes of the default collection, and what they say at the end
    def deletable(self) -> list[tuple[str, int]]:
        """(sha256, id) of acknowledged images no delete has answered for (deleted, gone or not found)."""
        with self.lock:
            done = self.deleted | self.gone_by_unanswered | self.not_found | self.missing
            return [(s, i) for s, i in self.present.items() if i not in done]

    def delete_sent(self, image_id: int) -> bool:
        """Note a delete about to be sent; returns whether an earlier delete of it got no definite answer."""
        with self.lock:
            earlier = image_id in self.delete_unanswered
            self.delete_unanswered.add(image_id)  # until answered: it may run whatever happens to the request
            return earlier

    def delete_answered(self, image_id: int, status: int, body: dict, earlier: bool) -> None:
        """Read a delete's answer (``status`` < 500; a 5xx or no answer leaves it unanswered).

        - 200 ``deleted: true``: acknowledged. 202: its job is read back at the end (``delete_jobs``).
        - 200 ``deleted: false``: the API served a version holding the image, and the job found it gone from the
          index: an earlier unanswered delete ran (``gone_by_unanswered``); with none, a loss (``missing``).
        - 404: the image is not in the version the API served. Either an earlier delete ran, or the API still
          serves the version before the upload's job (a 202 promises no read-your-writes; the client may have
          seen the job done), or a loss: only the final index tells (``not_found``; not picked again).
        """
        with self.lock:
            if status == 202:
                self.delete_jobs[body["job_id"]] = (image_id, earlier)
                return
            if status == 200 or status == 404 or 400 <= status < 500:
                if not earlier:
                    self.delete_unanswered.discard(image_id)  # a definite answer, and no earlier doubt
            if status == 200 and body.get("deleted"):
                self.deleted.add(image_id)
            elif status == 200:
                (self.gone_by_unanswered if earlier else self.missing).add(image_id)
                self.delete_notes["200 deleted:false " + ("after an unanswered delete" if earlier
                                                          else "(a loss)")] += 1
            elif status == 404:
                self.not_found.add(image_id)
                self.delete_notes["404 " + ("after an unanswered delete" if earlier else "(judged at the end)")] += 1

    def losses(self, live_sha: collections.Counter, live_ids: set[int],
               removed_by_jobs: set[int] | None = None) -> dict[str, list]:
        """Reconcile the answers with the final index; each image counted once.

        Args:
            live_sha: sha256 -> live rows holding those bytes.
            live_ids: ids of the live rows.
            removed_by_jobs: ids the run's finished delete jobs removed (Redis mode: read back from the job
                records); an image not live with only an unanswered delete to explain it is then lost unless one
                of them removed it. None (embedded mode: the jobs died with the API): not checked.

        Returns:
            {"lost": acknowledged images not live that no delete acknowledged and no unanswered delete may
            have removed, and images a delete's job found gone with no delete before; "deleted_but_present":
            images acknowledged deleted (or found gone) that are live; "gone_after_unanswered_delete": not live,
            with only an unanswered delete to explain it (not counted as lost)} as sorted id lists.
        """
        with self.lock:
            gone = self.deleted | self.gone_by_unanswered
            not_live = {i for sha, i in self.present.items() if live_sha[sha] == 0 and i not in gone}
            explained = self.delete_unanswered if removed_by_jobs is None else \
                self.delete_unanswered & removed_by_jobs
            lost = {i for i in not_live if i not in explained} | (self.missing - gone)
            return {"lost": sorted(lost), "deleted_but_present": sorted(i for i in gone if i in live_ids),
                    "gone_after_unanswered_delete": sorted((not_live & self.delete_unanswered) - lost)}


def error_code(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------- clients
class Seeds:
    """Image seeds shared by the client threads: each ``next()`` a new one. (A generator yielding inside a lock
    kept the lock while suspended: with two threads drawing seeds, both hung.)"""

    def __init__(self):
        self._next = 0
        self._lock = threading.Lock()

    def __iter__(self):
        return self

    def __next__(self) -> int:
        with self._lock:
            self._next += 1
            return self._next - 1


class Client:
    """One client thread's loop: a kind of traffic against the API until ``stop``."""

    def __init__(self, kind: str, url: str, ledger: Ledger, stop: threading.Event, seeds, queries: list[bytes],
                 job_every: float, seed: int):
        self.kind, self.ledger, self.stop, self.seeds, self.queries = kind, ledger, stop, seeds, queries
        self.job_every = job_every
        self.http = httpx.Client(base_url=url, timeout=60)
        self.rng = random.Random(seed)

    def run(self) -> None:
        step = getattr(self, "step_" + self.kind.replace("-", "_"))
        while not self.stop.is_set():
            try:
                step()
            except httpx.HTTPError:  # counted by call(); the API is likely being killed
                time.sleep(0.2)
        self.http.close()

    def call(self, kind: str, method: str, path: str, **kw) -> httpx.Response:
        """One request, counted in the ledger (answer or transport error)."""
        before = self.ledger.window()
        t = time.monotonic()
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            self.ledger.took(kind, time.monotonic() - t)
            self.ledger.record_transport(kind, exc, before)
            raise
        self.ledger.took(kind, time.monotonic() - t)
        self.ledger.record(kind, r.status_code, error_code(r), before)
        return r

    def live_image(self) -> int | None:
        """A live image of the default collection: an acknowledged upload not deleted, or one of the photos."""
        candidates = [i for _, i in self.ledger.deletable()] + self.ledger.fixed_ids
        return self.rng.choice(candidates) if candidates else None

    # -- the default collection
    def step_search(self) -> None:
        self.call("search", "POST", "/v1/search", files={"file": ("q.png", self.rng.choice(self.queries))},
                  params={"k": 5})

    def step_upload(self) -> None:
        ledger = self.ledger
        data = png(next(self.seeds))
        sha = hashlib.sha256(data).hexdigest()
        with ledger.lock:
            ledger.uncertain.add(sha)
        r = self.call("upload", "POST", "/v1/images", files={"files": ("u.png", data)})
        with ledger.lock:
            if r.status_code == 201:
                ledger.present[sha] = r.json()["images"][0]["id"]
                ledger.uncertain.discard(sha)
            elif r.status_code == 202:
                ledger.pending[r.json()["job_id"]] = sha
                ledger.uncertain.discard(sha)
            elif r.status_code < 500:
                ledger.uncertain.discard(sha)

    def step_delete(self) -> None:
        candidates = self.ledger.deletable()
        if len(candidates) < 5:
            self.learn_finished_uploads()
            time.sleep(0.2)
            return
        _, image_id = self.rng.choice(candidates)
        earlier = self.ledger.delete_sent(image_id)
        r = self.call("delete", "DELETE", f"/v1/images/{image_id}")
        if r.status_code < 500:
            self.ledger.delete_answered(image_id, r.status_code, r.json() if r.status_code in (200, 202) else {},
                                        earlier)

    def learn_finished_uploads(self, limit: int = 20) -> None:
        """Ask for the jobs of uploads answered 202 (Redis mode under load: most are): a finished one makes its
        image acknowledged, so deletes have images to delete during the run, not only at the end."""
        with self.ledger.lock:
            pending = list(self.ledger.pending.items())
        pending = self.rng.sample(pending, min(limit, len(pending)))  # (failed ones stay pending: any 20)
        for job_id, sha in pending:
            r = self.http.get(f"/v1/jobs/{job_id}")  # (not counted: bookkeeping, not load)
            info = r.json() if r.status_code == 200 else {}
            if info.get("state") == "done":
                with self.ledger.lock:
                    self.ledger.present[sha] = next(im["id"] for im in info["result"]["images"])
                    self.ledger.pending.pop(job_id, None)

    def step_job(self) -> None:  # an index job over the photos folder (incremental: usually nothing to do)
        try:
            self.call("job", "POST", "/v1/jobs/index", json={"folder": "photos"})
        finally:
            self.stop.wait(self.job_every)

    def step_meta(self) -> None:
        """One of: a good PATCH, a poisoned PATCH, a poisoned upload, a good and a bad filter, a thumbnail."""
        ledger, rng = self.ledger, self.rng
        action = rng.choices(["patch", "poison-patch", "poison-upload", "filters", "thumbnail"],
                             weights=[3, 3, 1, 3, 1])[0]
        image_id = self.live_image()
        if action in ("patch", "poison-patch", "thumbnail") and image_id is None:
            time.sleep(0.2)
            return
        if action == "patch":
            tag = rng.randrange(10)
            with ledger.lock:
                was_uncertain = image_id in ledger.tags_uncertain
                ledger.tags_uncertain.add(image_id)  # until answered: its job may run whatever the answer
            r = self.call("meta-patch", "PATCH", f"/v1/images/{image_id}", json={"metadata": {"tag": tag}})
            with ledger.lock:
                if r.status_code == 200:
                    ledger.tags[image_id] = tag
                if (not was_uncertain or ledger.jobs_in_order) and (r.status_code == 200 or 400 <= r.status_code < 500):
                    ledger.tags_uncertain.discard(image_id)  # a definite answer: nothing of it runs later
        elif action == "poison-patch":
            _, body = rng.choice(poisoned_metadata())
            self.call("meta-poison-patch", "PATCH", f"/v1/images/{image_id}",
                      content=b'{"metadata": ' + body + b"}", headers={"content-type": "application/json"})
        elif action == "poison-upload":
            _, body = rng.choice(poisoned_metadata())
            self.call("meta-poison-upload", "POST", "/v1/images", data={"metadata": body},
                      files={"files": ("p.png", png(10**7 + next(self.seeds)))})
        elif action == "filters":
            good = rng.choice(GOOD_FILTERS)
            _, bad = rng.choice(bad_filters())
            self.call("filter-list", "GET", "/v1/images", params={"filter": good, "limit": 5})
            self.call("bad-filter-list", "GET", "/v1/images", params={"filter": bad, "limit": 5})
            query = {"file": ("q.png", rng.choice(self.queries))}
            self.call("filter-search", "POST", "/v1/search", params={"filter": good, "k": 5}, files=query)
            self.call("bad-filter-search", "POST", "/v1/search", params={"filter": bad, "k": 5}, files=query)
        else:
            self.call("thumbnail", "GET", f"/v1/images/{image_id}/thumbnail", params={"size": 64})
        time.sleep(0.05)

    # -- collection "chaos"
    def step_churn(self) -> None:
        """Create ``chaos``, leave it live, delete it, and watch it stay deleted."""
        ledger, rng = self.ledger, self.rng
        ledger.set_chaos("changing")
        while not self._definite("coll-create", "POST", "/v1/collections", json=CHAOS_CONFIG):
            pass
        ledger.set_chaos("live")
        self.stop.wait(rng.uniform(3, 10))
        ledger.set_chaos("changing")
        while not self._definite("coll-delete", "DELETE", f"/v1/collections/{CHAOS}"):
            pass
        ledger.set_chaos("deleted")
        with ledger.lock:
            ledger.chaos_cycles += 1
        seen = False
        end = time.monotonic() + rng.uniform(1, 3)
        while time.monotonic() < end:
            seen |= self._sighted()
            time.sleep(0.2)
        if seen:
            with ledger.lock:
                ledger.resurrections += 1

    def _definite(self, kind: str, method: str, path: str, **kw) -> bool:
        """Send a create / delete of ``chaos``; True once the answer says what the state is (2xx, 404, 409)."""
        try:
            r = self.call(kind, method, path, **kw)
        except httpx.HTTPError:
            time.sleep(0.5)
            return False
        if r.status_code >= 500:
            time.sleep(0.5)
        return r.status_code in (201, 204, 404, 409)

    def _sighted(self) -> bool:
        """Whether deleted collection ``chaos`` shows anywhere: answered by the API, listed, or on disk."""
        from regis.indexes.collections import CollectionsRoot

        sightings = []
        if CollectionsRoot(self.collections_root).exists(CHAOS):
            sightings.append("on disk")
        try:
            if self.call("coll-get", "GET", f"/v1/collections/{CHAOS}").status_code == 200:
                sightings.append("GET 200")
            listed = self.call("coll-list", "GET", "/v1/collections")
            if listed.status_code == 200 and CHAOS in [c["name"] for c in listed.json()["collections"]]:
                sightings.append("listed")
        except httpx.HTTPError:
            pass
        with self.ledger.lock:
            for s in sightings:
                self.ledger.resurrection_sightings[s] += 1
        return bool(sightings)

    def chaos_call(self, kind: str, method: str, path: str, **kw) -> httpx.Response | None:
        """A request to collection ``chaos``: counted (a 5xx is never explained by its state: searched before its
        first write it answers 200 with no results), and a 2xx to a write sent after the delete was answered and
        answered before the next create was sent counted as ``accepted_while_deleted``."""
        ledger = self.ledger
        epoch, state = ledger.chaos_view()
        before = ledger.window()
        t = time.monotonic()
        try:
            r = self.http.request(method, f"/v1/collections/{CHAOS}{path}", **kw)
        except httpx.HTTPError as exc:
            ledger.took(kind, time.monotonic() - t)
            ledger.record_transport(kind, exc, before)
            time.sleep(0.2)
            return None
        ledger.took(kind, time.monotonic() - t)
        epoch_after, _ = ledger.chaos_view()
        label = None
        if state == "deleted" and epoch_after == epoch:
            label = f"{r.status_code} (deleted)"
            if r.status_code < 300:  # a write taken, or a read answered, for a deleted collection
                with ledger.lock:
                    ledger.accepted_while_deleted[kind] += 1
        ledger.record(kind, r.status_code, error_code(r), before, label=label)
        if state == "live" and epoch_after == epoch and r.status_code in (200, 201) and kind == "chaos-upload":
            with ledger.lock:
                if ledger.chaos_epoch == epoch:
                    ledger.chaos_ids += [im["id"] for im in r.json()["images"]]
        return r

    def step_chaos_write(self) -> None:
        rng = self.rng
        with self.ledger.lock:
            ids = list(self.ledger.chaos_ids)
        action = rng.choices(["upload", "job", "patch", "poison"], weights=[4, 1, 2, 2])[0]
        if action == "upload":
            params = {"wait": "false"} if rng.random() < 0.3 else {}
            self.chaos_call("chaos-upload", "POST", "/images", params=params,
                            files={"files": ("c.png", png(2 * 10**7 + next(self.seeds)))})
        elif action == "job":
            self.chaos_call("chaos-job", "POST", "/jobs/index", json={"folder": "photos"})
        elif action == "patch":
            self.chaos_call("chaos-patch", "PATCH", f"/images/{rng.choice(ids) if ids else 0}",
                            json={"metadata": {"tag": rng.randrange(10)}})
        else:
            _, body = rng.choice(poisoned_metadata())
            self.chaos_call("chaos-poison-patch", "PATCH", f"/images/{rng.choice(ids) if ids else 0}",
                            content=b'{"metadata": ' + body + b"}", headers={"content-type": "application/json"})
        time.sleep(0.1)

    def step_chaos_read(self) -> None:
        rng = self.rng
        action = rng.choice(["search", "filter", "bad-filter"])
        if action == "search":
            self.chaos_call("chaos-search", "POST", "/search", params={"k": 5},
                            files={"file": ("q.png", rng.choice(self.queries))})
        elif action == "filter":
            self.chaos_call("chaos-filter", "GET", "/images", params={"filter": rng.choice(CHAOS_FILTERS)})
        else:
            self.chaos_call("chaos-bad-filter", "GET", "/images", params={"filter": rng.choice(bad_filters())[1]})
        time.sleep(0.1)


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
    """The deployment as processes on loopback, over the bundled photos, with the tiny random encoder: in Redis
    mode its own redis-server on a free port (never the system one on 6379), the indexing worker and the API; in
    embedded mode the API alone. Laid out as docker-compose.yml: the default collection's index, the images root
    (with its ``.uploads``) and a collections root."""

    work: Path
    root: Path
    index: Path
    collections: Path
    redis_url: str | None
    url: str
    redis: Proc | None
    worker: Proc | None
    api: Proc
    mode: str = "redis"

    @property
    def procs(self) -> list[Proc]:
        return [p for p in (self.redis, self.worker, self.api) if p is not None]

    @classmethod
    def create(cls, prefix: str, extra_env: dict, appendonly: bool, worker_args: list[str],
               mode: str = "redis") -> Topology:
        """Lay out a temporary folder (images, index, collections, logs) and the processes, not started yet.

        Args:
            prefix: Redis key prefix and temporary folder name part.
            extra_env: REGIS_* settings on top of the common ones.
            appendonly: whether redis-server keeps an append-only file (the soak reads jobs back from it).
            worker_args: extra ``regis worker`` options.
            mode: "redis" (API, worker, Redis) or "embedded" (the API runs the jobs).

        Raises:
            ValueError: an unknown mode.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        work = Path(tempfile.mkdtemp(prefix=f"regis-{prefix}-"))
        root, index, colls = work / "images", work / "index", work / "collections"
        from regis.data.sample_photos import collect_sample_photos

        collect_sample_photos(root / "photos")
        api_port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "REGIS_INDEX_DIR": str(index), "REGIS_IMAGES_ROOT": str(root), "REGIS_COLLECTIONS_ROOT": str(colls),
               "REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true", "REGIS_ENABLE_JOBS": "true",
               "REGIS_BUILD_WORKERS": "0", "REGIS_TORCH_THREADS": "1", **extra_env}
        env.pop("REGIS_REDIS_URL", None)
        env.pop("REGIS_API_KEYS_FILE", None)
        py = sys.executable
        redis = worker = None
        redis_url = None
        if mode == "redis":
            redis_server = shutil.which("redis-server")
            if redis_server is None:
                sys.exit("redis-server is not installed (make system-deps)")
            redis_port = free_port()
            if redis_port == 6379:
                raise RuntimeError("free_port gave 6379, the system Redis")
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            env.update({"REGIS_REDIS_URL": redis_url, "REGIS_REDIS_PREFIX": prefix})
            redis = Proc("redis", [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "yes" if appendonly else "no", "--dir", str(work)], env,
                         work / "redis.log")
            worker = Proc("worker", [py, "-m", "regis", "worker", *worker_args, "--log-level", "warning"], env,
                          work / "worker.log")
        api = Proc("api", [py, "-m", "regis", "serve", "--port", str(api_port), "--log-level", "warning"], env,
                   work / "api.log")
        return cls(work, root, index, colls, redis_url, f"http://127.0.0.1:{api_port}", redis, worker, api, mode)

    def start_and_index(self, timeout_s: float = 300) -> int | None:
        """Start the processes, queue an index job of the photos and wait (up to ``timeout_s``) for its first
        version. Returns the index version (None if none was published in time)."""
        for p in self.procs:
            p.start()
            time.sleep(0.5)
        wait_http(self.url)
        httpx.post(f"{self.url}/v1/jobs/index", json={"folder": "photos"}, timeout=30)
        deadline = time.monotonic() + timeout_s
        while (version := httpx.get(f"{self.url}/healthz", timeout=10).json()["index_version"]) is None \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        return version


# ---------------------------------------------------------------- the run
def redis_ready(url: str, timeout_s: float = 30) -> bool:
    """Wait until Redis answers PING (a restarted Redis answers "LOADING" while it reads its append-only file:
    not up yet for the 5xx bookkeeping); False on time out."""
    import redis

    conn = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                if conn.ping():
                    return True
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.2)
        return False
    finally:
        conn.close()


def wait_jobs(http: httpx.Client, timeout_s: float = 300) -> bool:
    """Wait until every job of the default collection is done or failed; False on time out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            jobs = http.get("/v1/jobs", params={"limit": 200}).json()["jobs"]
            if all(j["state"] in ("done", "failed") for j in jobs):
                return True
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(1)
    return False


def reconcile_jobs(http: httpx.Client, ledger: Ledger) -> dict:
    """Read back the jobs of 202 answers: a finished upload is acknowledged, a finished delete too. Returns
    {"pending_jobs_gone": 202 answers whose job no longer exists (an embedded queue killed with the API),
    "pending_jobs_failed": ...}."""
    gone = failed = 0
    for job_id, sha in list(ledger.pending.items()):
        r = http.get(f"/v1/jobs/{job_id}")
        info = r.json() if r.status_code == 200 else {}
        if info.get("state") == "done":
            ledger.present[sha] = next(im["id"] for im in info["result"]["images"])
            del ledger.pending[job_id]
        elif r.status_code == 404:
            gone += 1
        elif info.get("state") == "failed":
            failed += 1
    for job_id, (image_id, earlier) in list(ledger.delete_jobs.items()):
        r = http.get(f"/v1/jobs/{job_id}")
        info = r.json() if r.status_code == 200 else {}
        if info.get("state") == "done":  # the job ran: read as if its request had waited for it
            ledger.delete_answered(image_id, 200, {"deleted": image_id in info["result"].get("deleted", [])},
                                   earlier)
    return {"pending_jobs_gone": gone, "pending_jobs_failed": failed}


def removed_by_delete_jobs(queue, history: int = 1000) -> set[int]:
    """Ids removed by the default collection's finished delete jobs, from the job records (``RedisJobQueue``;
    its last ``history`` jobs: the API keeps 1,000)."""
    removed: set[int] = set()
    for info in queue.list(limit=history, collection=None):
        if info.kind == "delete" and info.state == "done" and info.result:
            removed.update(info.result.get("deleted", []))
    return removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="redis")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=1, help="threads per kind (search, upload, delete, job)")
    parser.add_argument("--chaos-every", type=float, default=12.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--job-every", type=float, default=15.0,
                        help="seconds between index jobs (a worker takes ~5-10 s per job on 2 cores)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here too")
    args = parser.parse_args()
    random.seed(args.seed)
    started = time.time()
    topo = Topology.create("soak", {"REGIS_WRITE_WAIT_S": "10", "REGIS_STAGING_GRACE_S": "0"}, appendonly=True,
                           worker_args=["--job-monitoring-interval", "1", "--heartbeat-grace", "3",
                                        "--maintenance-interval", "2"], mode=args.mode)
    work, root, index, url = topo.work, topo.root, topo.index, topo.url
    queries = [p.read_bytes() for p in sorted((root / "photos").iterdir())[:6]]
    topo.start_and_index()

    ledger = Ledger()
    ledger.jobs_in_order = args.mode == "embedded"
    ledger.fixed_ids = [im["id"] for im in httpx.get(f"{url}/v1/images", params={"limit": 1000},
                                                     timeout=30).json()["images"]]
    r = httpx.patch(f"{url}/v1/images/{ledger.fixed_ids[0]}", json={"metadata": {"tag": 0}}, timeout=60)
    if r.status_code != 200:
        sys.exit(f"the first metadata PATCH failed: {r.status_code} {r.text[:200]}")
    ledger.tags[ledger.fixed_ids[0]] = 0
    stop = threading.Event()
    seeds = Seeds()
    kinds = [k for k in ("search", "upload", "delete", "job") for _ in range(args.clients)]
    kinds += ["meta", "churn", "chaos-write", "chaos-read"]
    clients = []
    for n, kind in enumerate(kinds):
        c = Client(kind, url, ledger, stop, seeds, queries, args.job_every, args.seed * 1000 + n)
        c.collections_root = topo.collections
        clients.append(c)
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    disk_paths = [index, topo.collections, root / ".uploads"]
    peak = {"api_rss": 0, "api_fds": 0, "worker_rss": 0, "worker_fds": 0, "disk": 0}
    timeline: list[dict] = []  # every 30 s: minutes, RSS MB and descriptors of the API and worker, disk MB
    last = {"disk": 0.0, "timeline": 0.0}

    def sample(now: dict | None = None) -> dict:
        """Sample RSS and descriptors (every call) and disk (every 5 s, or when ``now`` is given); peaks kept.
        Returns the sample ({name_rss, name_fds, disk?})."""
        now = {} if now is None else now
        for name, p in (("api", topo.api), ("worker", topo.worker)):
            if p is None:
                continue
            rss = fds = 0
            for pid in p.pids():  # the worker's work horse counted with it
                r, f = rss_and_fds(pid)
                rss, fds = rss + r, fds + f
            peak[f"{name}_rss"] = max(peak[f"{name}_rss"], rss)
            peak[f"{name}_fds"] = max(peak[f"{name}_fds"], fds)
            now[f"{name}_rss"], now[f"{name}_fds"] = rss, fds
        if "disk" in now or time.monotonic() - last["disk"] > 5:
            last["disk"] = time.monotonic()
            now["disk"] = disk_bytes(disk_paths)
            peak["disk"] = max(peak["disk"], now["disk"])
        if time.monotonic() - last["timeline"] > 30 and "disk" in now:
            last["timeline"] = time.monotonic()
            timeline.append({"min": round((time.monotonic() - t0) / 60, 1),
                             **{k: round(v / 2**20, 1) if k.endswith(("rss", "disk")) else v for k, v in now.items()}})
        return now

    t0 = time.monotonic()
    for t in threads:
        t.start()
    kills = collections.Counter()
    victims = [p for p in (topo.redis, topo.worker, topo.api) if p is not None]
    while time.monotonic() - t0 < args.minutes * 60:
        deadline = time.monotonic() + random.expovariate(1 / args.chaos_every)
        while time.monotonic() < deadline:
            sample()
            time.sleep(0.5)
        victim = random.choice(victims)
        ledger.set_down(victim.name, True)
        victim.kill()
        kills[victim.name] += 1
        time.sleep(random.uniform(0.5, 3.0))
        victim.start()
        if victim is topo.api:
            try:
                wait_http(url)
            except RuntimeError:
                pass
        elif victim is topo.redis:
            redis_ready(topo.redis_url)
        ledger.set_down(victim.name, False)
    chaos_minutes = (time.monotonic() - t0) / 60
    stop.set()
    for t in threads:
        t.join(timeout=90)
    stuck = [c.kind for c, t in zip(clients, threads, strict=True) if t.is_alive()]
    end_of_load = sample({"disk": 0})

    # settle: every job finished, a clean restart of the API (start-up clean-up), every job finished again
    http = httpx.Client(base_url=url, timeout=60)
    settled = wait_jobs(http)
    jobs_before_restart = reconcile_jobs(http, ledger)
    topo.api.stop()
    topo.api.start()
    wait_http(url)
    settled &= wait_jobs(http)
    jobs_after = reconcile_jobs(http, ledger)
    # collection "chaos": deleted at the end (the churn client stops after a delete; again in case), then it must
    # stay deleted, also once the worker has ended whatever it held
    final_delete = http.delete(f"/v1/collections/{CHAOS}").status_code
    time.sleep(3)
    settled &= wait_jobs(http)
    final = sample({"disk": 0})
    chaos_seen_after = http.get(f"/v1/collections/{CHAOS}").status_code != 404
    http.close()
    topo.api.stop()
    if topo.worker is not None:
        topo.worker.stop()

    from regis.indexes.collections import CollectionsRoot
    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.thumbnails import stale_thumbnails
    from regis.indexes.uploads import STAGING_DIR, upload_file

    chaos_seen_after |= CollectionsRoot(topo.collections).exists(CHAOS)
    left_in_root = sorted(p.name for p in topo.collections.iterdir()
                          if not (p.name == CHAOS and p.is_file())) if topo.collections.is_dir() else []
    snap = IndexSnapshot.open(index)
    rows = list(snap.table.iter_all())
    snap.close()
    live_sha = collections.Counter(r.sha256 for r in rows)
    live_ids = {r.id for r in rows}
    by_id = {r.id: r for r in rows}
    duplicated = [sha for sha, n in live_sha.items() if n > 1]
    unanswered_live = [r for r in rows if r.path.startswith(".uploads/") and r.sha256 not in ledger.present]
    metadata_lost = [i for i, tag in ledger.tags.items() if i not in ledger.tags_uncertain and i in by_id
                     and by_id[i].metadata.get("tag") != tag]
    uploads_dir = root / ".uploads"
    referenced = {upload_file(uploads_dir, r.path) for r in rows if r.path.startswith(".uploads/")}
    stored = {p for p in uploads_dir.glob("??/*") if p.is_file()}
    orphan_files = sorted(str(p) for p in stored - referenced)
    orphan_thumbs = [str(p) for p in stale_thumbnails(index, set(live_sha))]
    staging = uploads_dir / STAGING_DIR
    batches = [p.name for p in staging.iterdir()] if staging.is_dir() else []
    redis_files = disk_bytes([work / "appendonlydir"]) if topo.redis is not None else 0  # its append-only file
    if topo.redis is not None:
        from regis.jobs.names import RedisNames
        from regis.jobs.rq_queue import RedisJobQueue

        queue = RedisJobQueue(topo.redis_url, RedisNames("soak"))
        states = {b: (queue.get(b).state if queue.get(b) else None) for b in batches}
        removed_by_jobs = removed_by_delete_jobs(queue)
        queue.close()
        topo.redis.stop()
    else:  # the embedded queue died with the API: a batch still staged has no job
        states = {b: None for b in batches}
        removed_by_jobs = None  # (and so did the records of its delete jobs)
    judged = ledger.losses(live_sha, live_ids, removed_by_jobs)
    lost, resurrected = judged["lost"], judged["deleted_but_present"]
    orphan_staged = sorted(b for b, state in states.items() if state in (None, "done", "failed"))

    figures = {
        "mode": args.mode, "minutes": args.minutes, "chaos_minutes": round(chaos_minutes, 2),
        "clients_per_kind": args.clients, "chaos_every_s": args.chaos_every, "seed": args.seed,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "command": " ".join(["python", "scripts/soak.py", *sys.argv[1:]]),
        "kills": dict(kills), "kills_total": sum(kills.values()),
        "requests_total": sum(ledger.outcomes.values()),
        "requests": dict(sorted(ledger.outcomes.items())),
        "http_5xx": dict(sorted(ledger.fivexx.items())),
        "http_5xx_while_up": ledger.http_5xx_while_up(),
        "http_500": sum(n for k, n in ledger.fivexx.items() if k.split(" ")[1] == "500"),
        "unexpected": dict(sorted(ledger.unexpected.items())),
        "dropped_while_api_up": ledger.dropped_while_api_up,
        "poisoned_refused_422": sum(n for k, n in ledger.outcomes.items()
                                    if ("poison" in k or "bad-filter" in k) and k.endswith(" 422")),
        "uploads_acknowledged": len(ledger.present), "deletes_acknowledged": len(ledger.deleted),
        "patches_acknowledged": sum(n for k, n in ledger.outcomes.items() if k == "meta-patch 200"),
        "patched_images_checked": sum(1 for i in ledger.tags if i not in ledger.tags_uncertain and i in by_id),
        **jobs_before_restart, "pending_jobs_gone_after_restart": jobs_after["pending_jobs_gone"],
        "images_live": len(rows), "lost": len(lost), "metadata_lost": len(metadata_lost),
        "gone_after_unanswered_delete": len(judged["gone_after_unanswered_delete"]),
        "gone_after_unanswered_delete_checked": removed_by_jobs is not None,
        "delete_answers_read": dict(ledger.delete_notes),
        "deleted_but_present": len(resurrected), "duplicated": len(duplicated),
        "uploads_live_without_2xx": len(unanswered_live),
        "orphaned_files": len(orphan_files), "orphaned_staging": len(orphan_staged),
        "orphaned_thumbnails": len(orphan_thumbs), "collections_root_leftovers": left_in_root,
        "chaos_cycles": ledger.chaos_cycles, "resurrections": ledger.resurrections,
        "resurrection_sightings": dict(ledger.resurrection_sightings),
        "chaos_back_at_end": chaos_seen_after, "final_chaos_delete": final_delete,
        "accepted_while_deleted": dict(ledger.accepted_while_deleted),
        "settled": settled, "clients_stuck_at_end": stuck,
        "max_latency_s": {k: round(v, 1) for k, v in sorted(ledger.max_latency.items())},
        f"slower_than_{SLOW_S:g}_s": dict(ledger.slow),
        "peak_api_rss_mb": round(peak["api_rss"] / 2**20), "peak_api_fds": peak["api_fds"],
        "end_of_load_api_rss_mb": round(end_of_load.get("api_rss", 0) / 2**20),
        "end_of_load_api_fds": end_of_load.get("api_fds", 0),
        "peak_worker_rss_mb": round(peak["worker_rss"] / 2**20), "peak_worker_fds": peak["worker_fds"],
        "end_of_load_worker_rss_mb": round(end_of_load.get("worker_rss", 0) / 2**20),
        "end_of_load_worker_fds": end_of_load.get("worker_fds", 0),
        "peak_disk_mb": round(peak["disk"] / 2**20, 1), "end_of_load_disk_mb": round(end_of_load["disk"] / 2**20, 1),
        "settled_disk_mb": round(final["disk"] / 2**20, 1),
        "disk_paths": ["index", "collections", "images/.uploads"], "redis_aof_mb": round(redis_files / 2**20, 1),
        "timeline": timeline,
        "load_avg_end": os.getloadavg(),
        "workdir": str(work),
        "examples": {"lost": lost[:5], "gone_after_unanswered_delete": judged["gone_after_unanswered_delete"][:5],
                     "orphan_files": orphan_files[:5],
                     "orphan_staged": orphan_staged[:5], "orphan_thumbnails": orphan_thumbs[:5],
                     "metadata_lost": metadata_lost[:5]},
    }
    failed = failures(figures)
    figures["failures"] = failed
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    if failed:
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


def failures(figures: dict) -> list[str]:
    """The figures that fail a soak run (empty: it passed)."""
    zero = ["lost", "metadata_lost", "duplicated", "deleted_but_present", "orphaned_files", "orphaned_staging",
            "orphaned_thumbnails", "http_5xx_while_up", "http_500", "dropped_while_api_up", "resurrections"]
    out = [k for k in zero if figures[k]]
    out += [k for k in ("unexpected", "accepted_while_deleted", "collections_root_leftovers",
                        "clients_stuck_at_end") if figures[k]]
    out += [k for k in ("chaos_back_at_end",) if figures[k]]
    out += [k for k in ("settled",) if not figures[k]]
    return out


if __name__ == "__main__":
    main()
