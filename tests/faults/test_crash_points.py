"""Fault injection at named crash points (``REGIS_CRASH_AT``, ``regis.faults``): the process SIGKILLs itself
inside the window, every time; afterwards nothing is left over, lost or duplicated (issue 14, faults 10 and
crash windows of the writer and the upload path)."""

from __future__ import annotations

import io
import signal

import httpx
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
@pytest.mark.parametrize("collection", [None, "other"])  # the default collection, and a named one
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
@pytest.mark.parametrize("point", ["writer.version-renamed"])  # the later of the two windows
def test_a_sharded_write_killed_inside_the_commit_window_publishes_no_shard(tmp_path, point):
    """A write of 4 images over both shards of a collection, killed inside the first shard's commit window:
    every shard still serves its old version (each shard's version is written before any is published); the
    rerun publishes the 4 exactly once and removes the dead writer's prepared versions."""
    import os
    import subprocess
    import sys

    from regis.indexes.layout import SEGMENTS_DIR, TMP_PREFIX, VERSIONS_DIR, read_current
    from regis.indexes.snapshot import IndexSnapshot
    from regis.sharding.layout import shard_dir

    script, collection = tmp_path / "write.py", tmp_path / "c"
    script.write_text(SHARDED_WRITE)

    def run(env: dict, first: int) -> int:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
        return subprocess.run([sys.executable, str(script), str(collection), str(first), "4"], env=env,
                              timeout=180).returncode

    def currents() -> list:
        return [read_current(shard_dir(collection, s)) for s in range(2)]

    assert run({}, 0) == 0
    before = currents()
    assert run({"REGIS_CRASH_AT": point}, 4) == -signal.SIGKILL
    assert currents() == before  # no shard published: the collection serves what it served
    assert run({}, 4) == 0
    rows = []
    for s in range(2):
        snap = IndexSnapshot.open(shard_dir(collection, s))
        try:
            rows += [(r.id * 2 + s, r.path) for r in snap.table.iter_all()]
        finally:
            snap.close()
    assert sorted(path for _, path in rows) == sorted(f"p{i}.png" for i in range(8))  # nothing lost or twice
    assert len({g for g, _ in rows}) == 8
    leftovers = [p.name for s in range(2) for d in (VERSIONS_DIR, SEGMENTS_DIR)
                 for p in (shard_dir(collection, s) / d).iterdir() if p.name.startswith(TMP_PREFIX)]
    assert leftovers == []
