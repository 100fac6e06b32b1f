"""A deleted collection stays deleted (issue 27, item 4, and 13: jobs per collection in Redis mode).

The audit deleted a collection while an index job, searches and uploads ran: 204, and the collection came back
(2 of 2 runs: reopened with 5 images, grew to 187, its config reset; 190 uploads sent after the delete answered
202). Here the delete lands while an index job is held inside its embedding (pause point
``build.batch-reported``: it holds the writer, nothing committed) with an upload and another index job queued
behind it and searches and uploads running; then the job goes on. It must fail (its writes meet the tombstone),
the queued jobs must be cancelled (before, the queued index job ran after the delete into a fresh folder: the
collection was back, with its images and a default config), every later write must answer 404, nothing may
answer 500, and the collection must never be listed again nor come back with old images when a new one of that
name is created."""

from __future__ import annotations

import io
import shutil
import threading
import time

import numpy as np
import pytest
from deploy.conftest import images_root, prefix, redis_url  # noqa: F401 (fixtures)
from deploy.support import REDIS_SERVER, TINY, wait_until
from fastapi.testclient import TestClient
from PIL import Image

from regis.faults import PAUSE_ENV, RELEASE_ENV
from regis.indexes.collections import CollectionConfig, CollectionsRoot
from service.app import create_app
from service.settings import Settings

TINY_CONFIG = {"backbone": "vit-tiny-reg4-test", "random_init": True}


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def world(tmp_path, photos_dir):
    images = tmp_path / "images"
    shutil.copytree(photos_dir, images / "photos")
    root = CollectionsRoot(tmp_path / "collections")
    root.create("doomed", CollectionConfig(**TINY_CONFIG))
    settings = Settings(collections_root=root.root, images_root=images, enable_jobs=True, build_batch_size=2,
                        write_wait_s=20, **TINY)
    return root, settings


def test_a_collection_deleted_during_a_build_searches_and_uploads_stays_deleted(world, tmp_path, monkeypatch,
                                                                               one_thread):
    root, settings = world
    base = "/v1/collections/doomed"
    release = tmp_path / "release"
    with TestClient(create_app(settings)) as c:
        r = c.post(f"{base}/images", files=[("files", ("a.png", _png(1))), ("files", ("b.png", _png(2)))])
        assert r.status_code == 201, r.text
        monkeypatch.setenv(PAUSE_ENV, "build.batch-reported")
        monkeypatch.setenv(RELEASE_ENV, str(release))
        build = c.post(f"{base}/jobs/index", json={"folder": "photos"}).json()["id"]
        wait_until(lambda: (tmp_path / "release.reached").exists(), 120, 0.05, "the build's pause point")
        queued = c.post(f"{base}/images", params={"wait": "false"}, files={"files": ("c.png", _png(3))}).json()
        (images_dir := settings.images_root / "more").mkdir()
        (images_dir / "m.png").write_bytes(_png(9))
        second = c.post(f"{base}/jobs/index", json={"folder": "more"}).json()["id"]  # queued behind the build
        queue = c.app.state.collections.jobs("doomed")  # kept to read the jobs' ends after the delete

        answers: list[tuple[str, int]] = []
        stop = threading.Event()

        def hammer(kind: str) -> None:
            n = 100
            while not stop.is_set():
                n += 1
                if kind == "search":
                    r = c.post(f"{base}/search", files={"file": ("q.png", _png(1))})
                else:
                    r = c.post(f"{base}/images", params={"wait": "false"}, files={"files": ("x.png", _png(n))})
                answers.append((kind, r.status_code))
                time.sleep(0.01)

        threads = [threading.Thread(target=hammer, args=(k,)) for k in ("search", "upload", "upload")]
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        r = c.delete(base)
        assert r.status_code == 204, r.text
        assert time.monotonic() - t0 < 5  # the delete does not wait for the build
        deleted_at = len(answers)
        time.sleep(0.5)
        release.touch()  # the build goes on: its writes meet the tombstone
        info = wait_until(lambda: (i := queue.get(build)) and i.state in ("done", "failed") and i, 120, 0.05,
                          "the build to end")
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)

        for job_id in (queued["job_id"], second):
            wait_until(lambda j=job_id: (i := queue.get(j)) and i.state in ("done", "failed"), 120, 0.05,
                       "the queued jobs to end")
        time.sleep(0.5)
        assert not root.exists("doomed"), root.describe("doomed")  # it came back (the audit: 2 of 2 runs)
        assert "doomed" not in [x["name"] for x in c.get("/v1/collections").json()["collections"]]
        assert info.state == "failed" and info.error.code == "collection_not_found", info
        for job_id in (queued["job_id"], second):
            cancelled = queue.get(job_id)
            assert cancelled.state == "failed" and cancelled.error.code == "collection_deleted", cancelled
        assert all(status != 500 for _, status in answers), answers
        after = answers[deleted_at + 20:]  # a few requests were under way when the delete came
        assert after and all(status == 404 for _, status in after), after
        for method, path, kw in [("GET", base, {}), ("GET", f"{base}/images", {}), ("GET", f"{base}/jobs", {}),
                                 ("POST", f"{base}/images", {"files": {"files": ("d.png", _png(4))}}),
                                 ("PATCH", f"{base}/images/0", {"json": {"metadata": {"a": 1}}}),
                                 ("DELETE", f"{base}/images/0", {}), ("DELETE", base, {}),
                                 ("POST", f"{base}/jobs/index", {"json": {"folder": "photos"}})]:
            r = c.request(method, path, **kw)
            assert r.status_code == 404 and r.json()["error"]["code"] == "collection_not_found", (method, path, r.text)
        assert "doomed" not in [x["name"] for x in c.get("/v1/collections").json()["collections"]]
        assert not root.exists("doomed") and root.is_tombstone("doomed")
        assert [p.name for p in root.root.iterdir()] == ["doomed"]  # the tombstone; no renamed folder left

        # created again: a new, empty collection; nothing of the old one comes back
        r = c.post("/v1/collections", json={"name": "doomed", **TINY_CONFIG})
        assert r.status_code == 201 and r.json()["images"] == 0, r.text
        up = c.post(f"{base}/images", files={"files": ("e.png", _png(5))})
        assert up.status_code == 201 and c.get(f"{base}/images").json()["total"] == 1, up.text


def test_writes_waiting_for_their_jobs_when_the_collection_is_deleted_answer_404(world, tmp_path, monkeypatch,
                                                                                 one_thread):
    """Found by scripts/soak.py (embedded mode): an upload, an image delete and a PATCH queued behind a running
    job and waiting for their own (REGIS_WRITE_WAIT_S) when the collection is deleted: their jobs are cancelled
    (``collection_deleted``) and each write was answered 500. Now the same 404 ``collection_not_found`` as a write
    sent after the delete."""
    root, settings = world
    base = "/v1/collections/doomed"
    release = tmp_path / "release"
    with TestClient(create_app(settings)) as c:
        r = c.post(f"{base}/images", files={"files": ("a.png", _png(1))})
        assert r.status_code == 201, r.text
        image_id = r.json()["images"][0]["id"]
        monkeypatch.setenv(PAUSE_ENV, "build.batch-reported")
        monkeypatch.setenv(RELEASE_ENV, str(release))
        c.post(f"{base}/jobs/index", json={"folder": "photos"})
        wait_until(lambda: (tmp_path / "release.reached").exists(), 120, 0.05, "the build's pause point")
        queue = c.app.state.collections.jobs("doomed")
        writes = {"upload": ("POST", f"{base}/images", {"files": {"files": ("b.png", _png(2))}}),
                  "delete": ("DELETE", f"{base}/images/{image_id}", {}),
                  "patch": ("PATCH", f"{base}/images/{image_id}", {"json": {"metadata": {"a": 1}}})}
        answers = {}

        def write(kind: str) -> None:
            method, path, kw = writes[kind]
            answers[kind] = c.request(method, path, **kw)

        threads = [threading.Thread(target=write, args=(k,)) for k in writes]
        for t in threads:
            t.start()
        wait_until(lambda: sum(j.state == "queued" for j in queue.list(10)) == 3, 30, 0.05, "the writes' jobs")
        try:
            assert c.delete(base).status_code == 204
            for t in threads:
                t.join(30)
        finally:
            release.touch()
        for kind, r in answers.items():
            assert r.status_code == 404 and r.json()["error"]["code"] == "collection_not_found", (kind, r.text)
        assert len(answers) == 3 and not root.exists("doomed")


def test_a_search_under_way_when_its_collection_is_deleted_finishes_on_its_version(world, one_thread):
    """Found by scripts/soak.py (embedded mode, 14 of 1,900 searches of a collection created and deleted again
    and again): the delete closed the collection's index under a search that held it, which answered 500
    ("Cannot operate on a closed database"). The search is held inside the engine while the collection is
    deleted; it must finish on the version it holds (200), and the next one answer 404."""
    root, settings = world
    base = "/v1/collections/doomed"
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        assert c.post(f"{base}/images", files={"files": ("a.png", _png(1))}).status_code == 201
        table = c.app.state.collections.live("doomed").engine.snapshot.table
        entered, go = threading.Event(), threading.Event()
        original = table.get_many

        def held(*args, **kwargs):  # the search has its candidates; it reads their rows next
            entered.set()
            go.wait(30)
            return original(*args, **kwargs)

        table.get_many = held
        answer = {}
        t = threading.Thread(target=lambda: answer.update(
            r=c.post(f"{base}/search", files={"file": ("q.png", _png(1))})))
        t.start()
        try:
            assert entered.wait(60), ("the search did not reach the table", t.join(30), answer)
            assert c.delete(base).status_code == 204
        finally:
            go.set()
            t.join(60)
        r = answer["r"]
        assert r.status_code == 200 and r.json()["results"][0]["score"] > 0, r.text
        after = c.post(f"{base}/search", files={"file": ("q.png", _png(1))})
        assert after.status_code == 404 and after.json()["error"]["code"] == "collection_not_found", after.text


def test_a_redis_submission_cut_by_its_collections_delete_is_collection_not_found_not_an_outage():
    """Found by scripts/soak.py (Redis mode, 4 of ~100 index jobs to a collection created and deleted again and
    again): a delete closes the collection's Redis queue, whose connection then failed under a submission in
    flight (redis-py: "I/O operation on closed file"), answered 503 ``queue_unavailable`` as if Redis were down.
    The inner queue's submit is held until the delete has closed the collection's queue, then fails as redis-py
    does; the submission must end as the delete says (``collection_deleted``: 404), and later ones at once."""
    from regis.jobs.model import JobSpec, QueueClosedError, QueueUnavailableError
    from service.jobs import CollectionJobQueue

    entered, go = threading.Event(), threading.Event()

    class Inner:  # a RedisJobQueue whose connection is closed under a submit in flight
        backend = "redis"
        closed = False

        def submit(self, spec, job_id=None):
            entered.set()
            go.wait(10)
            if self.closed:
                raise QueueUnavailableError("the job queue (Redis) cannot be reached")
            return spec

        def close(self):
            self.closed = True

    queue = CollectionJobQueue(Inner(), "doomed", uid="0" * 32)
    outcome = _cut_by_delete(queue, lambda: queue.submit(JobSpec(kind="index", folder="photos")), entered, go)
    assert isinstance(outcome.get("error"), QueueClosedError) and outcome["error"].code == "collection_deleted", outcome
    with pytest.raises(QueueClosedError) as later:
        queue.submit(JobSpec(kind="index", folder="photos"))
    assert later.value.code == "collection_deleted"
    plain = CollectionJobQueue(Inner(), "other")  # not closed: an outage stays an outage (503)
    plain.queue.closed = True
    with pytest.raises(QueueUnavailableError):
        plain.submit(JobSpec(kind="index", folder="photos"))


def test_a_redis_job_read_cut_by_its_collections_delete_is_collection_not_found_not_a_crash():
    """Found by scripts/soak.py (Redis mode, one upload to a collection created and deleted again and again): the
    upload waited for its job (``await_job`` reading it) as the delete closed the collection's Redis queue, and
    redis-py failed under the read with ``AttributeError: 'NoneType' object has no attribute 'readline'``: 500.
    The read must end as the delete says (``collection_deleted``: 404), and later reads at once."""
    from regis.jobs.model import QueueClosedError
    from service.jobs import CollectionJobQueue

    entered, go = threading.Event(), threading.Event()

    class Inner:  # a RedisJobQueue whose connection is closed under a read in flight
        backend = "redis"
        closed = False

        def get(self, job_id):
            entered.set()
            go.wait(10)
            if self.closed:
                raise AttributeError("'NoneType' object has no attribute 'readline'")  # as redis-py did

        def list(self, limit, collection=None):
            return []

        def close(self):
            self.closed = True

    queue = CollectionJobQueue(Inner(), "doomed", uid="0" * 32)
    outcome = _cut_by_delete(queue, lambda: queue.get("0" * 32), entered, go)
    assert isinstance(outcome.get("error"), QueueClosedError) and outcome["error"].code == "collection_deleted", outcome
    for call in (lambda: queue.get("0" * 32), lambda: queue.list(5)):
        with pytest.raises(QueueClosedError):
            call()
    assert CollectionJobQueue(Inner(), "other").list(5) == []  # an open queue reads as before


def test_a_job_queued_for_a_deleted_collection_never_writes_into_its_successor(tmp_path):
    """The incarnation check: a job submitted for collection ``c`` that only runs after ``c`` was deleted and
    created again is refused (``collection_not_found``); the new ``c`` stays empty."""
    from indexer.jobs import JobContext, execute_job
    from regis.errors import RegisError

    root = CollectionsRoot(tmp_path / "collections")
    root.create("c", CollectionConfig(**TINY_CONFIG))
    old_uid = root.uid("c")
    root.delete("c")
    root.create("c", CollectionConfig(**TINY_CONFIG))
    assert root.uid("c") != old_uid
    ctx = JobContext(index_dir=root.path("c"), uploads_dir=root.path("c") / "uploads", images_root=None,
                     encoder=lambda: None, check_alive=lambda: root.check_alive("c", old_uid))
    from regis.jobs.model import JobSpec

    with pytest.raises(RegisError, match="deleted"):
        execute_job(JobSpec(kind="delete", ids=[0]), ctx, lambda p: None)
    assert root.describe("c")["index_version"] is None


@pytest.mark.slow
@pytest.mark.skipif(REDIS_SERVER is None, reason="needs redis-server (make system-deps installs it)")
def test_redis_jobs_are_listed_per_collection_and_refused_once_their_collection_is_gone(
        tmp_path, redis_url, prefix, images_root):  # noqa: F811
    """Redis mode: ``GET /v1/collections/X/jobs`` used to list every collection's jobs; now each collection sees
    its own (and the default routes the default collection's). A job queued for a collection deleted before a
    worker took it is refused by the worker, and does not write into a collection created again meanwhile."""
    import os
    import subprocess
    import sys

    root = CollectionsRoot(tmp_path / "collections")
    for name in ("a", "b"):
        root.create(name, CollectionConfig(**TINY_CONFIG))
    settings = Settings(collections_root=root.root, images_root=images_root, enable_jobs=True, redis_url=redis_url,
                        redis_prefix=prefix, write_wait_s=0, **TINY)
    with TestClient(create_app(settings)) as c:
        ids = {name: c.post(f"/v1/collections/{name}/jobs/index", json={"folder": "photos"}).json()["id"]
               for name in ("a", "b")}
        ids["default"] = c.post("/v1/jobs/index", json={"folder": "photos"}).json()["id"]
        for name, path in (("a", "/v1/collections/a"), ("b", "/v1/collections/b"), ("default", "/v1")):
            listed = [j["id"] for j in c.get(f"{path}/jobs").json()["jobs"]]
            assert listed == [ids[name]], (name, listed)
            assert c.get(f"{path}/jobs/{ids[name]}").status_code == 200
            other = ids["b" if name == "a" else "a"]
            assert c.get(f"{path}/jobs/{other}").status_code == 404  # another collection's job
        assert c.delete("/v1/collections/a").status_code == 204
        assert c.post("/v1/collections", json={"name": "a", **TINY_CONFIG}).status_code == 201
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "REGIS_REDIS_URL": redis_url,
               "REGIS_REDIS_PREFIX": prefix, "REGIS_COLLECTIONS_ROOT": str(root.root),
               "REGIS_IMAGES_ROOT": str(images_root), "REGIS_BUILD_WORKERS": "0", "REGIS_TORCH_THREADS": "1",
               "REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true"}
        subprocess.run([sys.executable, "-m", "regis", "worker", "--burst", "--log-level", "warning"], env=env,
                       timeout=300, check=True)
        info = c.get(f"/v1/collections/a/jobs/{ids['a']}").json()  # (the name's job list keeps it, failed)
        assert info["state"] == "failed" and info["error"]["code"] == "collection_not_found", info
        assert c.get("/v1/collections/a").json()["images"] == 0
        assert c.get(f"/v1/collections/b/jobs/{ids['b']}").json()["state"] == "done"
        assert c.get("/v1/collections/b").json()["images"] == 21


def _cut_by_delete(queue, call, entered: threading.Event, go: threading.Event) -> dict:
    """Run ``call`` on a thread; once its inner queue signals ``entered`` (the call is in flight), close ``queue``
    as a collection delete does, then let the call go on (``go``). Returns {"info": result} or {"error": exc}."""
    from regis.jobs.model import JobError

    outcome = {}

    def run():
        try:
            outcome["info"] = call()
        except Exception as exc:  # noqa: BLE001 (the outcome under test)
            outcome["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    assert entered.wait(10)
    queue.close(cancel=JobError(code="collection_deleted", message="collection 'doomed' was deleted"))
    go.set()
    t.join(10)
    return outcome


@pytest.mark.parametrize("then", ["deleted", "created again"])
def test_a_collection_deleted_while_a_request_opens_its_version_is_404_or_empty_not_503(world, tmp_path, monkeypatch,
                                                                                      one_thread, then):
    """Found by scripts/soak.py (embedded mode, 9 of ~11,000 requests to a collection created and deleted again
    and again, on 6238282: searches, filtered lists and PATCHes answered 503 ``index_unavailable``): a request whose
    collection has a published version its live index has not opened yet (another replica, or this one's job,
    published it) opens it itself; deleted in between, the open found no version and the request answered 503
    "the published index version cannot be opened". The request is held at the named point
    ``engine.version-unopened`` while the collection is deleted (and, in the second case, created again, empty);
    it must answer as a request sent after: 404 ``collection_not_found``, or 200 with no results."""
    root, settings = world
    settings = settings.model_copy(update={"index_poll_s": 3600})  # the watcher must not open the version first
    base = "/v1/collections/doomed"
    release = tmp_path / "release"
    with TestClient(create_app(settings)) as c, TestClient(create_app(settings)) as replica:
        assert c.get(f"{base}/images").json()["total"] == 0  # opened here, no version yet
        assert replica.post(f"{base}/images", files={"files": ("a.png", _png(1))}).status_code == 201
        monkeypatch.setenv(PAUSE_ENV, "engine.version-unopened")
        monkeypatch.setenv(RELEASE_ENV, str(release))
        answer = {}
        t = threading.Thread(target=lambda: answer.update(
            r=c.post(f"{base}/search", params={"k": 5}, files={"file": ("q.png", _png(1))})))
        t.start()
        try:
            wait_until(lambda: (tmp_path / "release.reached").exists(), 60, 0.02, "the request's pause point")
            assert c.delete(base).status_code == 204
            if then == "created again":
                assert c.post("/v1/collections", json={"name": "doomed", **TINY_CONFIG}).status_code == 201
        finally:
            release.touch()
            t.join(60)
        r = answer["r"]
        if then == "deleted":
            assert r.status_code == 404 and r.json()["error"]["code"] == "collection_not_found", r.text
        else:
            assert r.status_code == 200 and r.json()["results"] == [], r.text
