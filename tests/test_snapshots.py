"""Snapshots (``regis.backups``): one published state of an index or a sharded collection as a tar file, taken
while writes go on, restored elsewhere to the same state: the same rows and tokens, the same search results.

The race the hard links are for is hit on purpose: the snapshot is held at ``snapshot.state-read`` (the state
read, its files not linked yet) while three writes publish and their clean-up removes that state's version; it
starts over from the newer state and still writes exactly one published state."""

from __future__ import annotations

import json
import tarfile
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import build
from regis.backups.restore import read_snapshot_manifest, restore
from regis.backups.snapshot import MANIFEST_NAME, snapshot
from regis.errors import ConfigError, IndexFormatError
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.retrieve.searcher import Searcher
from regis.sharding.layout import read_state
from regis.sharding.search import ShardedSearcher
from regis.sharding.write import ShardedWriter, split_index

SHARDS = 3


@pytest.fixture(scope="module")
def index(tmp_path_factory, photos_dir, tiny_encoder):
    path = tmp_path_factory.mktemp("snap") / "index"
    build(photos_dir, path, tiny_encoder)
    return path


def _rows_and_tokens(path) -> dict[int, tuple[str, np.ndarray]]:
    snap = IndexSnapshot.open(path)
    try:
        return {r.id: (r.path, np.asarray(snap.store.get(np.array([r.id]))[0])) for r in snap.table.iter_all()}
    finally:
        snap.close()


def _exact(searcher, queries) -> list[tuple[list[int], list[float]]]:
    out = []
    for q in queries:
        r = searcher.search(q, k=30, mode="exact")
        out.append((r.ids.tolist(), np.round(r.scores, 5).tolist()))
    return out


def test_an_index_snapshot_restores_to_the_same_rows_tokens_and_searches(index, tmp_path):
    report = snapshot(index, tmp_path / "index.tar")
    assert report.kind == "index" and report.version == 1 and report.images == 21 and report.attempts == 1
    manifest = read_snapshot_manifest(tmp_path / "index.tar")
    assert manifest["version"] == 1 and "CURRENT" in manifest["files"]
    with tarfile.open(tmp_path / "index.tar") as tar:
        assert tar.getnames()[-1] == MANIFEST_NAME
    restored = restore(tmp_path / "index.tar", tmp_path / "elsewhere" / "index")
    assert restored.images == 21 and restored.version == 1
    want, got = _rows_and_tokens(index), _rows_and_tokens(tmp_path / "elsewhere" / "index")
    assert sorted(want) == sorted(got)
    for i, (path, tokens) in want.items():
        assert got[i][0] == path and np.array_equal(got[i][1], tokens)
    queries = [np.asarray(want[i][1], dtype=np.float32) for i in (0, 7, 15)]
    a, b = Searcher(IndexSnapshot.open(index)), Searcher(IndexSnapshot.open(tmp_path / "elsewhere" / "index"))
    assert _exact(a, queries) == _exact(b, queries)
    for s in (a, b):
        s.snapshot.close()
    with pytest.raises(ConfigError, match="exists already"):
        restore(tmp_path / "index.tar", tmp_path / "elsewhere" / "index")
    with pytest.raises(ConfigError, match="must not be inside"):
        snapshot(index, index / "x.tar")


def test_a_damaged_snapshot_is_refused_and_leaves_nothing(index, tmp_path):
    snapshot(index, tmp_path / "index.tar")
    data = bytearray((tmp_path / "index.tar").read_bytes())
    with tarfile.open(tmp_path / "index.tar") as tar:
        member = next(m for m in tar.getmembers() if m.name.startswith("segments/"))
    data[member.offset_data + 100] ^= 0xFF  # one byte of the tokens
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="is damaged"):
        restore(tmp_path / "bad.tar", tmp_path / "restored")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar", "index.tar"]  # no target, no staging
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    with pytest.raises(IndexFormatError, match="not a readable regis snapshot"):
        restore(tmp_path / "junk.tar", tmp_path / "restored")


def _write(collection, first: int, n: int, config, weights) -> int:
    """n new images (random tokens, paths p{first}..) in one collection version; returns that version."""
    rng = np.random.default_rng(first)
    tokens = rng.standard_normal((n, config.tokens_per_image, config.dim))
    tokens = (tokens / np.linalg.norm(tokens, axis=2, keepdims=True)).astype(np.float32)
    with ShardedWriter(collection, SHARDS, config, weights, keep_versions=1) as w:
        ids = w.allocate_ids(n)
        w.put([ImageRecord(int(g), f"p{first + i}.png", "0" * 64, 8, 8, 1, 0.0) for i, g in enumerate(ids)], tokens)
        w.commit()
        return w.version


def _collection_rows(collection) -> dict[int, str]:
    reader = ShardedSearcher(collection)
    try:
        return {int(g): r.path for g, r in reader.records(np.arange(200)).items()}
    finally:
        reader.close()


def test_a_sharded_snapshot_taken_while_writes_go_on_is_one_published_state(index, tmp_path, tiny_encoder,
                                                                              monkeypatch):
    """Held after reading version V's record while 3 writes publish (each shard keeps 1 version: V's files are
    collected), the snapshot starts over and holds exactly the state of the newest version it read; restored
    elsewhere it has that version's rows and answers searches as the source at that version."""
    collection = tmp_path / "collection"
    split_index(index, collection, SHARDS)
    config, weights = tiny_encoder.config, tiny_encoder.weights_info
    states = {read_state(collection).version: _collection_rows(collection)}
    release = tmp_path / "release"
    monkeypatch.setenv("REGIS_PAUSE_AT", "snapshot.state-read")
    monkeypatch.setenv("REGIS_PAUSE_RELEASE", str(release))
    result: dict = {}
    taker = threading.Thread(target=lambda: result.update(r=snapshot(collection, tmp_path / "c.tar")))
    taker.start()
    reached = tmp_path / "release.reached"
    for _ in range(600):
        if reached.exists():
            break
        threading.Event().wait(0.05)
    assert reached.exists(), "the snapshot never reached its pause point"
    held = read_state(collection).version
    for k in range(3):  # a write loop while the snapshot is held
        version = _write(collection, 100 + 10 * k, 4, config, weights)
        states[version] = _collection_rows(collection)
    release.touch()
    taker.join(timeout=120)
    report = result["r"]
    assert report.kind == "sharded" and report.attempts == 2  # the first state's files were gone: started over
    assert report.version == held + 3 and report.images == 21 + 12
    restore(tmp_path / "c.tar", tmp_path / "restored")
    assert _collection_rows(tmp_path / "restored") == states[report.version]  # exactly that published state
    assert read_state(tmp_path / "restored") == read_state(collection)
    snap = IndexSnapshot.open(index)
    queries = [np.asarray(t, dtype=np.float32) for t in snap.store.get(np.array([0, 5, 9]))]
    snap.close()
    source, restored = ShardedSearcher(collection), ShardedSearcher(tmp_path / "restored")
    want = _exact(source, queries)  # the source at the snapshot's version (nothing written since)
    assert _exact(restored, queries) == want and len(want[0][0]) == 30
    for s in (source, restored):
        s.close()
    _write(collection, 500, 4, config, weights)  # the source moves on; the restored copy is a state of the past
    assert _collection_rows(tmp_path / "restored") == states[report.version]
    _write(tmp_path / "restored", 900, 2, config, weights)  # a restored collection takes writes
    assert len(_collection_rows(tmp_path / "restored")) == 21 + 12 + 2


def test_collections_snapshot_and_restore_commands(index, tmp_path, photos_dir):
    import shutil

    from cli.main import app

    root = tmp_path / "root"
    root.mkdir()
    split_index(index, root / "photos", SHARDS)
    shutil.copytree(index, root / "plain")
    runner = CliRunner()
    for name in ("photos", "plain"):
        done = runner.invoke(app, ["collections", "snapshot", name, str(tmp_path / f"{name}.tar.gz"), "--root",
                                   str(root), "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["images"] == 21
        done = runner.invoke(app, ["collections", "restore", str(tmp_path / f"{name}.tar.gz"), f"{name}-copy",
                                   "--root", str(root)])
        assert done.exit_code == 0 and "21 images" in done.output, done.output
    listed = runner.invoke(app, ["collections", "list", "--root", str(root), "--json"])
    rows = {r["name"]: r for r in json.loads(listed.output)}
    assert {n: (rows[n]["images"], rows[n]["index_version"]) for n in rows} == {
        "photos": (21, 1), "photos-copy": (21, 1), "plain": (21, 1), "plain-copy": (21, 1)}
    again = runner.invoke(app, ["collections", "restore", str(tmp_path / "plain.tar.gz"), "plain", "--root",
                                str(root)])
    assert again.exit_code != 0 and "exists already" in str(again.exception)


def test_snapshots_over_rest_take_list_download_and_restore(index, tmp_path, photos_dir):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    root = tmp_path / "root"
    root.mkdir()
    split_index(index, root / "photos", SHARDS)
    settings = Settings(collections_root=root, enable_jobs=True, snapshots_dir=tmp_path / "snaps")
    with TestClient(create_app(settings)) as client:
        taken = client.post("/v1/collections/photos/snapshots")
        assert taken.status_code == 201, taken.text
        info = taken.json()
        assert (info["kind"], info["version"], info["images"]) == ("sharded", 1, 21)
        assert client.get("/v1/collections/photos/snapshots").json()["snapshots"] == [info]
        got = client.get(f"/v1/collections/photos/snapshots/{info['name']}")
        assert got.status_code == 200 and got.content == (tmp_path / "snaps" / "photos" / info["name"]).read_bytes()
        assert client.get("/v1/collections/photos/snapshots/photos-20260101T000000Z-abcdef.tar").status_code == 404
        assert client.get("/v1/collections/photos/snapshots/..%2Fx.tar").status_code in (404, 422)
        restored = client.post(f"/v1/collections/photos/snapshots/{info['name']}/restore", json={"name": "copy"})
        assert restored.status_code == 201, restored.text
        assert (restored.json()["images"], restored.json()["index_version"]) == (21, 1)
        again = client.post(f"/v1/collections/photos/snapshots/{info['name']}/restore", json={"name": "copy"})
        assert again.status_code == 409
        photo = sorted(photos_dir.iterdir())[4].read_bytes()
        ranked = [client.post(f"/v1/collections/{c}/search", params={"k": 21, "mode": "exact"},
                              files={"file": ("q.jpg", photo)}).json() for c in ("photos", "copy")]
        assert "results" in ranked[0], ranked
        assert [(h["id"], h["score"]) for h in ranked[0]["results"]] == \
            [(h["id"], h["score"]) for h in ranked[1]["results"]]
        assert client.post("/v1/collections/nothere/snapshots").status_code == 404
