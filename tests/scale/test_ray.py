"""regis on a local Ray cluster (``ray start --head`` plus one worker node on this machine, 1 CPU each, stopped
with ``ray stop --force`` at the end): a ``--ray`` build equals the single-machine build of the same folder, a
killed build resumes without duplicates or losses, Ray Serve's sharded search equals the unsharded exact search,
and killing a shard replica mid-load leaves every request answered or failed with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

if os.environ.get("REGIS_TEST_RAY") != "1":
    pytest.skip("set REGIS_TEST_RAY=1 to run the local Ray cluster tests: they start two Ray nodes (several minutes "
                "on 2 shared cores) and end with `ray stop --force`, which stops every Ray process of the machine, so "
                "they are opt-in where several people share one", allow_module_level=True)
pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'regis[ray]'")

from cluster.local import LocalRayCluster  # noqa: E402
from cluster.settings import RaySettings  # noqa: E402
from regis.indexes.snapshot import IndexSnapshot  # noqa: E402
from regis.sharding.layout import read_layout, shard_dir  # noqa: E402

pytestmark = pytest.mark.slow

SHARDS = 2
# Small enough for two 1-CPU nodes: the build's decode tasks and encoder actor, then the Serve replicas.
SETTINGS = dict(encoder_num_cpus=0.25, shard_num_cpus=0.1, ingress_num_cpus=0.1, build_decode_cpus=0.25,
                build_batch_size=4, build_checkpoint_images=8, proxy_location="HeadOnly", shard_timeout_s=20,
                namespace="regis-test")


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    cluster = LocalRayCluster(head_cpus=1, worker_cpus=1, workers=1).start()
    try:
        ray.init(address=cluster.address, namespace="regis-test", log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


def _by_path(index_dir, shards: int | None = None) -> dict[str, tuple[int, np.ndarray, tuple]]:
    """path -> (global id, (T, D) float16 tokens, (sha256, width, height)) of an index or a collection."""
    out = {}
    dirs = [(index_dir, 0, 1)] if shards is None else [(shard_dir(index_dir, s), s, shards) for s in range(shards)]
    for path, s, n in dirs:
        snap = IndexSnapshot.open(path)
        try:
            for rec in snap.table.iter_all():
                assert rec.path not in out, f"duplicate {rec.path}"
                out[rec.path] = (rec.id * n + s, snap.store.get(np.array([rec.id]))[0], (rec.sha256, rec.width,
                                                                                          rec.height))
        finally:
            snap.close()
    return out


def _assert_same_build(collection, single_index):
    got, want = _by_path(collection, SHARDS), _by_path(single_index)
    assert sorted(got) == sorted(want)
    for path, (gid, tokens, meta) in want.items():
        assert got[path][0] == gid, path  # same id as the single-machine build
        assert got[path][2] == meta, path
        np.testing.assert_allclose(got[path][1].astype(np.float32), tokens.astype(np.float32), rtol=0, atol=2e-3)


@pytest.fixture(scope="module")
def ray_collection(ray_cluster, tmp_path_factory, photos_dir, lite0_encoder):
    from cluster.build import build_ray

    collection = tmp_path_factory.mktemp("ray") / "collection"
    report = build_ray(photos_dir, collection, lite0_encoder, SHARDS,
                       RaySettings(**{**SETTINGS, "build_checkpoint_images": 1000}))
    assert report.added == 21 and report.checkpoints == 1 and not report.skipped
    return collection


def test_ray_build_equals_the_single_machine_build(ray_collection, lite0_index, photos_dir, lite0_encoder):
    from cluster.build import build_ray

    assert read_layout(ray_collection)["num_shards"] == SHARDS
    _assert_same_build(ray_collection, lite0_index)
    again = build_ray(photos_dir, ray_collection, lite0_encoder, SHARDS, RaySettings(**SETTINGS))
    assert again.added == again.updated == 0 and again.unchanged == 21  # incremental: nothing to embed


def test_a_killed_ray_build_resumes_without_duplicates_or_losses(ray_cluster, tmp_path, photos_dir, lite0_index,
                                                                 lite0_encoder):
    """The build process is killed (os._exit, no clean-up) after its first checkpoint and one more written
    batch; the re-run embeds only the rest and the result equals the single-machine build."""
    from cluster.build import build_ray

    collection = tmp_path / "collection"
    script = textwrap.dedent(f"""
        import os, ray
        from cluster.build import build_ray
        from cluster.settings import RaySettings
        from regis.models.encoder import build_encoder

        def crash(event):
            if event["event"] == "batch" and event["done"] == 12:  # checkpoint 1 at 8 images, then 1 batch of 4
                os._exit(9)

        ray.init(address={ray_cluster.address!r}, namespace="regis-test", log_to_driver=False)
        build_ray({str(photos_dir)!r}, {str(collection)!r}, build_encoder("efficientnet-lite0"), {SHARDS},
                  RaySettings(**{json.dumps(SETTINGS)}), on_event=crash)
    """)
    killed = subprocess.run([sys.executable, "-c", script], env=os.environ, timeout=600, capture_output=True)
    assert killed.returncode == 9, killed.stderr.decode()[-2000:]
    assert len(_by_path(collection, SHARDS)) == 8  # what the first checkpoint committed
    report = build_ray(photos_dir, collection, lite0_encoder, SHARDS, RaySettings(**SETTINGS))
    assert report.added == 13 and report.unchanged == 8
    _assert_same_build(collection, lite0_index)


@pytest.fixture(scope="module")
def ray_app(ray_collection):
    import httpx
    from ray import serve

    from cluster.local import _free_port
    from cluster.serve import start
    from service.settings import Settings

    settings = RaySettings(**SETTINGS, shard_replicas=2, http_port=_free_port(), app_name="regis-test")
    url = start(ray_collection, Settings(index_dir=ray_collection), settings)
    try:
        deadline = time.monotonic() + 300
        while httpx.get(url + "/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the Ray Serve application did not become ready"
            time.sleep(1)
        yield url
    finally:
        serve.delete("regis-test")
        serve.shutdown()


def test_ray_serve_sharded_search_equals_unsharded_exact(ray_app, ray_collection, lite0_index, photos_dir):
    """Exact mode: the single index's ranking, result for result. ANN mode: the in-process sharded search of the
    same collection (the same per-shard candidates and merge)."""
    import httpx

    from regis.retrieve.query import QueryEngine
    from regis.sharding.search import ShardedSearcher

    engine = QueryEngine.open(lite0_index)
    sharded = ShardedSearcher(ray_collection)
    try:
        for photo in sorted(photos_dir.iterdir())[:3]:
            data = photo.read_bytes()
            tokens, _ = engine.encode_bytes(data)
            exact = engine.search_bytes(data, k=21, mode="exact")
            ann = sharded.search(tokens, k=21)
            for mode, want_ids, want_scores in (
                ("exact", [h["id"] for h in exact["results"]], [h["score"] for h in exact["results"]]),
                ("ann", ann.ids.tolist(), ann.scores.tolist()),
            ):
                r = httpx.post(ray_app + "/v1/search", files={"file": ("q.jpg", data, "image/jpeg")},
                               params={"k": 21, "mode": mode}, timeout=120)
                assert r.status_code == 200, r.text
                got = r.json()
                assert not got["partial"] and got["missing_shards"] == []
                assert [h["id"] for h in got["results"]] == want_ids, mode
                np.testing.assert_allclose([h["score"] for h in got["results"]], want_scores, rtol=0, atol=2e-3)
                assert got["results"][0]["path"] == photo.name
            assert [h["path"] for h in got["results"]] == [sharded.records(ann.ids)[i].path for i in ann.ids]
        bad = httpx.post(ray_app + "/v1/search", files={"file": ("q.jpg", b"not an image", "image/jpeg")},
                         timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_image"  # same errors as regis serve
        too_many = httpx.post(ray_app + "/v1/search", files={"file": ("q.jpg", data, "image/jpeg")},
                              params={"k": 101}, timeout=60)
        assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "invalid_parameter"
    finally:
        engine.close()
        sharded.close()


def test_killing_a_shard_replica_mid_load_answers_or_fails_every_request_clearly(ray_app, photos_dir, lite0_index):
    import httpx
    import ray

    from regis.retrieve.query import QueryEngine

    photos = sorted(photos_dir.iterdir())[:4]
    engine = QueryEngine.open(lite0_index)
    want = {p.name: [h["id"] for h in engine.search_bytes(p.read_bytes(), k=5, mode="exact")["results"]]
            for p in photos}
    engine.close()
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if "shard-000" in a["name"] and "REPLICA" in a["name"]]
    assert len(replicas) == 2, replicas
    outcomes: list[tuple[str, int, dict]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as c:
            for j in range(6):
                photo = photos[(i + j) % len(photos)]
                r = c.post(ray_app + "/v1/search", files={"file": ("q.jpg", photo.read_bytes(), "image/jpeg")},
                           params={"k": 5, "mode": "exact"})
                with lock:
                    outcomes.append((photo.name, r.status_code, r.json()))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while len(outcomes) < 4:  # mid-load
        time.sleep(0.05)
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == 24
    for name, status, body in outcomes:
        assert status in (200, 503), (status, body)
        if status == 200:
            assert not body["partial"] and [h["id"] for h in body["results"]] == want[name]
        else:
            assert body["error"]["code"] == "shards_unavailable" and "shards [0]" in body["error"]["message"]
    assert sum(status == 200 for _, status, _ in outcomes) >= 12
