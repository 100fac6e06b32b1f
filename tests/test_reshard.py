"""Online re-sharding (``regis.sharding.reshard``): 2 -> 3 -> 1 shards while a search loop runs on the served
collection: every search answers, with the same ranking before, during and after; the new layout is published in
one step (one collection version each); ids, rows and tokens do not change; writes go on afterwards; the old
folders are removed once their grace is over; a re-sharding killed before it publishes leaves the collection as
it was. Tiny random encoder, the 21 bundled photos (Flat FAISS shards: ANN results equal exact ones too)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from conftest import build
from regis.sharding.layout import read_layout, read_state
from regis.sharding.reshard import reshard
from regis.sharding.search import ShardedSearcher
from regis.sharding.write import split_index


@pytest.fixture(scope="module")
def index(tmp_path_factory, photos_dir, tiny_encoder):
    path = tmp_path_factory.mktemp("reshard") / "index"
    build(photos_dir, path, tiny_encoder)
    return path


def _rows(collection) -> dict[int, tuple[str, bytes]]:
    reader = ShardedSearcher(collection)
    try:
        out = {}
        for shard in reader.shards:
            if shard.searcher is None:
                continue
            snap = shard.searcher.snapshot
            for rec in snap.table.iter_all():
                g = rec.id * shard.num_shards + shard.shard
                out[g] = (rec.path, snap.store.get(np.array([rec.id]))[0].tobytes())
        return out
    finally:
        reader.close()


def test_resharding_2_3_1_while_searches_run_keeps_every_answer_and_ranking(index, tmp_path, photos_dir):
    from service.app import create_app
    from service.settings import Settings

    collection = tmp_path / "collection"
    split_index(index, collection, 2)
    rows = _rows(collection)
    photos = sorted(photos_dir.iterdir())
    queries = [photos[i].read_bytes() for i in (0, 9, 17)]
    with TestClient(create_app(Settings(index_dir=collection, index_poll_s=0.05, enable_jobs=True))) as client:
        def ranking(data, mode):
            r = client.post("/v1/search", params={"k": 21, "mode": mode}, files={"file": ("q.png", data)})
            assert r.status_code == 200, r.text
            return [(h["id"], round(h["score"], 4)) for h in r.json()["results"]]

        want = {(q, mode): ranking(queries[q], mode) for q in range(3) for mode in ("exact", "ann")}
        assert all(len(v) == 21 for v in want.values())
        stop, seen, errors = threading.Event(), [], []

        def loop():
            while not stop.is_set():
                for q in range(3):
                    for mode in ("exact", "ann"):
                        try:
                            got = ranking(queries[q], mode)
                        except AssertionError as exc:
                            errors.append(str(exc))
                            continue
                        seen.append((client.get("/readyz").json().get("shards") and
                                     len(client.get("/readyz").json()["shards"]), got == want[(q, mode)]))

        searcher = threading.Thread(target=loop)
        searcher.start()
        try:
            versions = []
            for shards in (3, 1):
                time.sleep(0.5)
                report = reshard(collection, shards)
                assert (report.shards_after, report.images) == (shards, 21)
                versions.append(report.version)
                deadline = time.monotonic() + 30
                while len(client.get("/readyz").json()["shards"]) != shards:  # served at the next refresh
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            time.sleep(0.5)
        finally:
            stop.set()
            searcher.join(timeout=60)
        assert not errors, errors[:3]
        assert seen and all(same for _, same in seen), [s for s in seen if not s[1]][:3]
        assert {n for n, _ in seen} >= {2, 1}  # the loop ran on the layouts before and after
        assert versions == [2, 3]  # one collection version per re-sharding
        layout = read_layout(collection)
        assert layout["num_shards"] == 1 and layout["dirs"] == ["shard-000-g2"] and layout["generation"] == 2
        assert [len(r["dirs"]) for r in layout["retired"]] == [2, 3]
        assert _rows(collection) == rows  # the same ids, paths and tokens
        ready = client.get("/readyz").json()
        assert ready["images"] == 21 and ready["index_version"] == 3
        new = client.post("/v1/images", files={"files": ("new.png", _png())})  # writes go on
        assert new.status_code == 201 and new.json()["images"][0]["id"] == 21, new.text
        assert client.post("/v1/collections/default/reshard", json={"shards": 2}).json()["shards_after"] == 2
        assert [h["id"] for h in client.post("/v1/search", params={"k": 22, "mode": "exact"},
                                             files={"file": ("q.png", _png())}).json()["results"]][0] == 21
    assert read_layout(collection)["num_shards"] == 2 and len(_rows(collection)) == 22


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


def test_retired_folders_are_removed_by_a_writer_after_their_grace(index, tmp_path, tiny_encoder, monkeypatch):
    import regis.sharding.layout as layout_module
    from regis.sharding.write import ShardedWriter

    collection = tmp_path / "collection"
    split_index(index, collection, 2)
    reshard(collection, 3)
    assert (collection / "shard-000").is_dir()  # retired, kept for the readers of the state before
    with ShardedWriter(collection, 3, tiny_encoder.config, tiny_encoder.weights_info) as w:
        w.abort()
    assert (collection / "shard-000").is_dir()  # still within its grace
    monkeypatch.setattr(layout_module, "RETIRE_GRACE_S", 0.0)
    with ShardedWriter(collection, 3, tiny_encoder.config, tiny_encoder.weights_info) as w:
        ids = w.allocate_ids(1)
        from regis.indexes.table import ImageRecord

        tokens = np.ones((1, tiny_encoder.config.tokens_per_image, tiny_encoder.config.dim), np.float32)
        w.put([ImageRecord(int(ids[0]), "x.png", "0" * 64, 8, 8, 1, 0.0)], tokens / np.linalg.norm(tokens[0, 0]))
        w.commit()
    assert not (collection / "shard-000").exists() and not (collection / "shard-001").exists()
    assert "retired" not in read_layout(collection) and len(_rows(collection)) == 22


@pytest.mark.slow
def test_a_resharding_killed_before_it_publishes_leaves_the_collection_as_it_was(index, tmp_path):
    import os

    collection = tmp_path / "collection"
    split_index(index, collection, 2)
    state, rows = read_state(collection), _rows(collection)
    script = f"from regis.sharding.reshard import reshard; reshard({str(collection)!r}, 3)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "REGIS_CRASH_AT": "reshard.shards-written"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=300, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert read_state(collection) == state and _rows(collection) == rows  # nobody reads the new folders
    assert (collection / "shard-002-g1").is_dir()  # written, not published
    report = reshard(collection, 3)  # the rerun replaces them
    assert report.version == state.version + 1 and _rows(collection) == rows
    assert json.loads((collection / "shards.json").read_text())["dirs"] == [f"shard-00{s}-g1" for s in range(3)]
