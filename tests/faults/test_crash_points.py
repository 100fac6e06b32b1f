"""Fault injection at named crash points (``REGIS_CRASH_AT``, ``regis.faults``): the process SIGKILLs itself
inside the window, every time; afterwards nothing is left over, lost or duplicated (issue 14, faults 10 and
crash windows of the writer and the upload path)."""

from __future__ import annotations

import io
import signal

import httpx
import numpy as np
import pytest
from deploy.support import free_port, kill, regis_process, wait_until
from PIL import Image

from regis.indexes.collections import CollectionConfig, CollectionsRoot
from regis.indexes.uploads import STAGING_DIR

TINY_ENV = {"REGIS_BACKBONE": "vit-tiny-reg4-test", "REGIS_RANDOM_INIT": "true", "REGIS_ENABLE_JOBS": "true"}


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (72, 60), color).save(buf, format="PNG")
    return buf.getvalue()


def _serve(tmp_path, env: dict, log_name: str, *extra: str):
    port = free_port()
    args = ["serve", "--index", str(tmp_path / "index"), "--port", str(port), "--images-root", str(tmp_path / "root"),
            *extra]
    proc = regis_process(args, {**TINY_ENV, **env}, tmp_path / log_name)
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError((tmp_path / log_name).read_text()[-3000:])
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 90, 0.2, what="regis serve")
    return proc, url


@pytest.mark.slow
# the default collection, and a named one (the same crash, another staging folder: 14 s of make test at load 5-7,
# left to make test-heavy)
@pytest.mark.parametrize("collection", [None, pytest.param("other", marks=pytest.mark.heavy)])
def test_an_api_killed_between_staging_and_queueing_leaves_nothing_after_restart(tmp_path, collection):
    (tmp_path / "root").mkdir()
    staging = tmp_path / "root" / ".uploads" / STAGING_DIR
    extra, prefix = (), ""
    if collection is not None:
        collections = CollectionsRoot(tmp_path / "collections")
        collections.create(collection, CollectionConfig(backbone="vit-tiny-reg4-test", random_init=True))
        staging = collections.path(collection) / "uploads" / STAGING_DIR
        extra, prefix = ("--collections-root", str(collections.root)), f"/collections/{collection}"
    proc, url = _serve(tmp_path, {"REGIS_CRASH_AT": "upload.staged"}, "api-1.log", *extra)
    try:
        with pytest.raises(httpx.HTTPError):  # the process dies inside the request
            httpx.post(f"{url}/v1{prefix}/images", files={"files": ("red.png", _png("red"))}, timeout=60)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert len(list(staging.iterdir())) == 1  # the window: staged, never queued
    finally:
        kill(proc)
    proc, url = _serve(tmp_path, {"REGIS_STAGING_GRACE_S": "0"}, "api-2.log", *extra)
    try:
        assert list(staging.iterdir()) == []  # cleaned at start-up
        r = httpx.post(f"{url}/v1{prefix}/images", files={"files": ("red.png", _png("red"))}, timeout=60)
        assert r.status_code == 201 and r.json()["images"][0]["status"] == "added", r.text
        assert list(staging.iterdir()) == []
        if collection is None:
            assert httpx.get(f"{url}/healthz").json()["images"] == 1  # no loss, no duplicate
        else:
            assert httpx.get(f"{url}/v1/collections/{collection}").json()["images"] == 1
    finally:
        kill(proc)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["writer.version-renamed"])  # writer.segment-written: same test, one more minute
def test_a_build_killed_inside_the_commit_window_loses_and_leaves_nothing(tmp_path, photos_dir, point):
    """A build of 4 photos over an index of 3, killed inside the commit: the 3-image version still serves;
    the next build publishes all 7 exactly once and removes the dead writer's temporary files."""
    import shutil

    from regis.indexes.layout import SEGMENTS_DIR, TMP_PREFIX, VERSIONS_DIR
    from regis.indexes.snapshot import IndexSnapshot

    photos = sorted(photos_dir.iterdir())
    root, index = tmp_path / "root", tmp_path / "index"
    root.mkdir()
    for p in photos[:3]:
        shutil.copy(p, root / p.name)
    cmd = ["index", "build", str(root), "--index", str(index), "--backbone", "vit-tiny-reg4-test", "--random-init",
           "--workers", "0"]

    def run(env: dict, log: str) -> int:
        return regis_process(cmd, env, tmp_path / log).wait(timeout=180)

    assert run({}, "build-1.log") == 0
    for p in photos[3:7]:
        shutil.copy(p, root / p.name)
    assert run({"REGIS_CRASH_AT": point}, "build-2.log") == -signal.SIGKILL

    def paths() -> list[str]:
        snap = IndexSnapshot.open(index)
        try:
            return sorted(r.path for r in snap.table.iter_all())
        finally:
            snap.close()

    if point == "writer.segment-written":
        assert paths() == sorted(p.name for p in photos[:3])  # the old version serves
    assert run({}, "build-3.log") == 0
    assert paths() == sorted(p.name for p in photos[:7])  # nothing lost, nothing twice
    leftovers = [p.name for d in (index / VERSIONS_DIR, index / SEGMENTS_DIR) for p in d.iterdir()
                 if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []


SHARDED_WRITE = """
import sys

import numpy as np

from regis.indexes.table import ImageRecord
from regis.models.encoder import build_encoder
from regis.sharding.write import ShardedWriter

encoder = build_encoder("vit-tiny-reg4-test", random_init=True, seed=0)
config = encoder.config
collection, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokens = np.random.default_rng(first).standard_normal((n, config.tokens_per_image, config.dim))
tokens = (tokens / np.linalg.norm(tokens, axis=2, keepdims=True)).astype(np.float32)
with ShardedWriter(collection, 2, config, encoder.weights_info) as w:
    have = w.records_by_path()
    todo = [i for i in range(n) if f"p{first + i}.png" not in have]  # what the shards do not hold yet
    ids = w.allocate_ids(len(todo))
    w.put([ImageRecord(int(g), f"p{first + i}.png", "0" * 64, 8, 8, 1, 0.0) for g, i in zip(ids, todo)],
          tokens[todo])
    w.commit()
"""


@pytest.mark.slow
@pytest.mark.heavy  # 3 x ~45 s at load 17 (14 s of CPU each); the unsharded commit-window test stays in make test
@pytest.mark.parametrize("point", ["writer.segment-written", "sharded.shard-renamed", "sharded.record-written"])
def test_a_sharded_write_killed_inside_the_commit_window_is_seen_whole_or_not_at_all(tmp_path, point):
    """A write of 4 images over both shards of a collection, killed inside its commit: before the collection
    record is replaced (while writing shard versions, or between the two shards' renames into place: the second
    point) a reader opened after the crash sees the OLD state entirely, though shard 0 holds a renamed new
    version (it used to be live: half the write published); after the record (the third point) it sees the whole
    write. The rerun stores the 4 exactly once, removes the dead writer's versions and points every shard's
    CURRENT at the record's version."""
    import os
    import subprocess
    import sys

    from regis.indexes.layout import SEGMENTS_DIR, TMP_PREFIX, VERSIONS_DIR, read_current
    from regis.sharding.layout import read_state, shard_dir
    from regis.sharding.search import ShardedSearcher

    script, collection = tmp_path / "write.py", tmp_path / "c"
    script.write_text(SHARDED_WRITE)

    def run(env: dict, first: int) -> int:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
        return subprocess.run([sys.executable, str(script), str(collection), str(first), "4"], env=env,
                              timeout=180).returncode

    def rows() -> list[tuple[int, str]]:  # what a reader opening the collection now sees
        reader = ShardedSearcher(collection)
        try:
            return sorted((int(r.id), r.path) for r in reader.records(np.arange(16)).values())
        finally:
            reader.close()

    def versions(s: int) -> list[str]:
        return sorted(p.name for p in (shard_dir(collection, s) / VERSIONS_DIR).iterdir()
                      if not p.name.startswith(TMP_PREFIX))

    assert run({}, 0) == 0
    before, state = rows(), read_state(collection)
    assert run({"REGIS_CRASH_AT": point}, 4) == -signal.SIGKILL
    if point == "sharded.record-written":
        assert read_state(collection).version == state.version + 1
        assert sorted(p for _, p in rows()) == [f"p{i}.png" for i in range(8)]  # the whole write
    else:
        assert read_state(collection) == state and rows() == before  # the old state, every shard
        if point == "sharded.shard-renamed":
            assert versions(0) == ["v000001", "v000002"] and versions(1) == ["v000001"]  # read by nobody
    assert run({}, 4) == 0
    after = rows()
    assert sorted(path for _, path in after) == sorted(f"p{i}.png" for i in range(8))  # nothing lost or twice
    assert len({g for g, _ in after}) == 8
    final = read_state(collection)
    assert final.version == state.version + 1  # one write published, whether the first try or the rerun
    assert [read_current(shard_dir(collection, s)) for s in range(2)] == list(final.names)
    assert [versions(s)[-1] for s in range(2)] == list(final.names)  # no version newer than the record's
    leftovers = [p.name for s in range(2) for d in (VERSIONS_DIR, SEGMENTS_DIR)
                 for p in (shard_dir(collection, s) / d).iterdir() if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []


def test_a_pause_point_holds_until_released_and_needs_a_release_file(tmp_path, monkeypatch):
    """``pause_point``: a point not named passes; a named one without ``REGIS_PAUSE_RELEASE`` is a ConfigError; a
    named one marks its arrival (PATH.reached) and waits until PATH exists, then later passes go on at once."""
    import threading

    from regis.errors import ConfigError
    from regis.faults import PAUSE_ENV, RELEASE_ENV, pause_point

    pause_point("build.batch-reported")  # not named: passes
    monkeypatch.setenv(PAUSE_ENV, "build.batch-reported")
    with pytest.raises(ConfigError, match=RELEASE_ENV):
        pause_point("build.batch-reported")
    release = tmp_path / "release"
    monkeypatch.setenv(RELEASE_ENV, str(release))
    waiter = threading.Thread(target=pause_point, args=("build.batch-reported",))
    waiter.start()
    wait_until(lambda: (tmp_path / "release.reached").exists(), 10, 0.01, "the pause point")
    waiter.join(0.3)
    assert waiter.is_alive()  # held
    release.touch()
    waiter.join(5)
    assert not waiter.is_alive()
    pause_point("build.batch-reported")  # released: passes at once


@pytest.mark.slow
@pytest.mark.heavy  # two server starts: 1.5-2 minutes on 2 busy cores
def test_an_upload_to_a_sharded_collection_killed_between_shard_renames_is_not_seen_and_retries_once(
        tmp_path, photos_dir, tiny_encoder):
    """``regis serve`` (embedded jobs) on a collection of 2 shards: an upload of 2 images (one per shard) whose job
    is killed after the first shard's new version is renamed into place, before the collection record: readers
    (the restarted server) see the collection as before, and the retried upload adds both images exactly once, in
    one collection version; no temporary file and no version newer than the record is left."""
    from conftest import build
    from regis.indexes.layout import SEGMENTS_DIR, TMP_PREFIX, VERSIONS_DIR
    from regis.sharding.layout import read_state, shard_dir
    from regis.sharding.write import split_index

    (tmp_path / "root").mkdir()
    single = tmp_path / "single"
    images = tmp_path / "three"
    images.mkdir()
    for p in sorted(photos_dir.iterdir())[:3]:
        (images / p.name).write_bytes(p.read_bytes())
    build(images, single, tiny_encoder)
    split_index(single, tmp_path / "index", 2)
    state = read_state(tmp_path / "index")
    files = [("files", ("red.png", _png("red"))), ("files", ("blue.png", _png("blue")))]
    proc, url = _serve(tmp_path, {"REGIS_CRASH_AT": "sharded.shard-renamed"}, "api-1.log")
    try:
        with pytest.raises(httpx.HTTPError):  # the job runs in the API process: it dies inside the request
            httpx.post(f"{url}/v1/images", files=files, timeout=60)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill(proc)
    assert read_state(tmp_path / "index") == state  # the record: the write is not published
    renamed = [sorted(p.name for p in (shard_dir(tmp_path / "index", s) / VERSIONS_DIR).iterdir()
                      if not p.name.startswith(TMP_PREFIX)) for s in (0, 1)]
    assert sorted(map(len, renamed)) == [1, 2]  # one shard's new version in place, read by nobody
    proc, url = _serve(tmp_path, {"REGIS_STAGING_GRACE_S": "0"}, "api-2.log")
    try:
        assert httpx.get(f"{url}/readyz").json()["images"] == 3  # the old state
        r = httpx.post(f"{url}/v1/images", files=files, timeout=60)
        assert r.status_code == 201, r.text
        assert [(i["status"], i["id"]) for i in r.json()["images"]] == [("added", 3), ("added", 4)]
        assert r.json()["index_version"] == state.version + 1
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["images"] == 5 and [s["images"] for s in ready["shards"]] == [3, 2]
    finally:
        kill(proc)
    final = read_state(tmp_path / "index")
    for s in (0, 1):
        versions = sorted(p.name for p in (shard_dir(tmp_path / "index", s) / VERSIONS_DIR).iterdir())
        assert versions[-1] == final.names[s] and not any(v.startswith(TMP_PREFIX) for v in versions)
        assert not [p for p in (shard_dir(tmp_path / "index", s) / SEGMENTS_DIR).iterdir()
                    if p.name.startswith(TMP_PREFIX)]
