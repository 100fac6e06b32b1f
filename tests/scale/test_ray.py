"""regis on a local Ray cluster: ``ray start --head`` plus one worker node on this machine (1 logical CPU each,
``cluster.local.LocalRayCluster``, one cluster for the whole module, ended by its own process groups at the end).

A ``--ray`` build equals the single-machine build of the same folder (same ids, rows and tokens), a killed build
resumes without duplicates or losses, Ray Serve's sharded search equals the unsharded exact search, the Ray
ingress is ``regis serve``'s API (same routes and errors, explanations computed by the shard deployments; writes
a clear 501), and killing a shard replica mid-load leaves every request answered or failed with a clear error.

Tiny random encoder and 8 of the bundled photos: the cost is Ray itself (the nodes, the Serve replicas). Skipped
when Ray is not installed (``pip install 'regis[ray]'``; ``make test`` installs it) or with REGIS_SKIP_RAY=1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

if os.environ.get("REGIS_SKIP_RAY") == "1":
    pytest.skip("REGIS_SKIP_RAY=1: the local Ray cluster tests are switched off", allow_module_level=True)
pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'regis[ray]'")
pytest.importorskip("ray.serve", reason="the Ray tests need Ray Serve: pip install 'regis[ray]'")

from cluster.local import LocalRayCluster  # noqa: E402
from cluster.settings import RaySettings  # noqa: E402
from conftest import assert_same_json, build  # noqa: E402
from regis.indexes.snapshot import IndexSnapshot  # noqa: E402
from regis.sharding.layout import read_layout, shard_dir  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # 4-7 minutes on 2 shared cores: make test-heavy

SHARDS = 2
PHOTOS = 8
# Small enough for two 1-CPU nodes: the build's decode tasks and encoder actor, then the Serve replicas.
SETTINGS = dict(encoder_num_cpus=0.25, shard_num_cpus=0.1, ingress_num_cpus=0.1, build_decode_cpus=0.25,
                build_batch_size=4, build_checkpoint_images=4, proxy_location="HeadOnly", shard_timeout_s=20,
                namespace="regis-test")
TINY = 'build_encoder("vit-tiny-reg4-test", random_init=True, seed=0)'  # the tiny_encoder fixture


@pytest.fixture(scope="module")
def images(tmp_path_factory, photos_dir):
    """8 of the bundled photos (4 PNG, 4 JPEG)."""
    out = tmp_path_factory.mktemp("ray-images")
    photos = sorted(photos_dir.iterdir())
    for p in [p for p in photos if p.suffix == ".png"][:4] + [p for p in photos if p.suffix == ".jpg"][:4]:
        shutil.copy2(p, out / p.name)
    return out


@pytest.fixture(scope="module")
def single_index(tmp_path_factory, images, tiny_encoder):
    """The single-machine build of ``images``."""
    index = tmp_path_factory.mktemp("ray-single") / "index"
    build(images, index, tiny_encoder)
    return index


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray

    # the nodes' home holds a Ray auth token, as any local ray.init() leaves in ~/.ray: the cluster must still form
    home = tmp_path_factory.mktemp("ray-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    cluster = LocalRayCluster(head_cpus=1, worker_cpus=1, workers=1, env={**os.environ, "HOME": str(home)}).start()
    try:
        ray.init(address=cluster.address, namespace="regis-test", log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


@contextlib.contextmanager
def _logged(name: str):
    """The messages logged through logger ``name`` (and its children) inside the block."""
    messages: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def _rows(index_dir, shards: int | None = None) -> dict[str, tuple[dict, np.ndarray]]:
    """path -> (table row with the global id, (T, D) float16 tokens) of an index or a collection."""
    out = {}
    dirs = [(index_dir, 0, 1)] if shards is None else [(shard_dir(index_dir, s), s, shards) for s in range(shards)]
    for path, s, n in dirs:
        snap = IndexSnapshot.open(path)
        try:
            for rec in snap.table.iter_all():
                assert rec.path not in out, f"duplicate {rec.path}"
                out[rec.path] = ({**rec.__dict__, "id": rec.id * n + s}, snap.store.get(np.array([rec.id]))[0])
        finally:
            snap.close()
    return out


def _assert_same_build(collection, single_index):
    got, want = _rows(collection, SHARDS), _rows(single_index)
    assert sorted(got) == sorted(want) and len(want) == PHOTOS
    for path, (row, tokens) in want.items():
        assert got[path][0] == row, path  # same id, hash, size, mtime and metadata (file facts, EXIF)
        np.testing.assert_allclose(got[path][1].astype(np.float32), tokens.astype(np.float32), rtol=0, atol=2e-3)


@pytest.fixture(scope="module")
def ray_collection(ray_cluster, tmp_path_factory, images, tiny_encoder):
    import ray.data  # noqa: F401  (configures Ray Data's loggers first, which would drop a handler added before)

    from cluster.build import build_ray

    collection = tmp_path_factory.mktemp("ray") / "collection"
    with _logged("ray.data") as messages:
        report = build_ray(images, collection, tiny_encoder, SHARDS,
                           RaySettings(**{**SETTINGS, "build_checkpoint_images": 1000}))
    # the encoder pool is given as compute=ActorPoolStrategy, not the deprecated concurrency= (Ray >= 2.51)
    assert not [m for m in messages if "deprecated" in m], messages
    assert report.added == PHOTOS and report.checkpoints == 1 and not report.skipped
    # Ray Data's usage collection is off (RAY_USAGE_STATS_ENABLED=0): no endless Prometheus poller is left behind
    assert "data-usage-metrics-poller" not in [t.name for t in threading.enumerate()]
    return collection


def test_ray_build_equals_the_single_machine_build(ray_collection, single_index, images, tiny_encoder):
    from cluster.build import build_ray

    assert read_layout(ray_collection)["num_shards"] == SHARDS
    _assert_same_build(ray_collection, single_index)
    again = build_ray(images, ray_collection, tiny_encoder, SHARDS, RaySettings(**SETTINGS))
    assert again.added == again.updated == 0 and again.unchanged == PHOTOS  # incremental: nothing to embed


def test_a_killed_ray_build_resumes_without_duplicates_or_losses(ray_cluster, tmp_path, images, single_index,
                                                                 tiny_encoder):
    """The build process is killed (os._exit, no clean-up) after its first checkpoint (4 images) and one more
    written batch; the re-run embeds only the rest and the result equals the single-machine build."""
    from cluster.build import build_ray

    collection = tmp_path / "collection"
    script = textwrap.dedent(f"""
        import os, ray
        from cluster.build import build_ray
        from cluster.settings import RaySettings
        from regis.models.encoder import build_encoder

        def crash(event):
            if event["event"] == "batch" and event["done"] == 8:  # checkpoint 1 at 4 images, then 1 batch of 4
                os._exit(9)

        ray.init(address={ray_cluster.address!r}, namespace="regis-test", log_to_driver=False)
        build_ray({str(images)!r}, {str(collection)!r}, {TINY}, {SHARDS}, RaySettings(**{json.dumps(SETTINGS)}),
                  on_event=crash)
    """)
    killed = subprocess.run([sys.executable, "-c", script], env=os.environ, timeout=300, capture_output=True)
    assert killed.returncode == 9, killed.stderr.decode()[-2000:]
    assert len(_rows(collection, SHARDS)) == 4  # what the first checkpoint committed
    report = build_ray(images, collection, tiny_encoder, SHARDS, RaySettings(**SETTINGS))
    assert report.added == 4 and report.unchanged == 4
    _assert_same_build(collection, single_index)


@pytest.fixture(scope="module")
def ray_served(ray_collection, tmp_path_factory):
    """A copy of the Ray-built collection, served by ``ray_app`` (which takes writes: the last test writes)."""
    served = tmp_path_factory.mktemp("ray-served") / "collection"
    shutil.copytree(ray_collection, served)
    return served


@pytest.fixture(scope="module")
def ray_app(ray_served, images, tmp_path_factory):
    import httpx
    from ray import serve

    from cluster.local import _free_port
    from cluster.serve import start
    from service.settings import Settings

    # the Encoder deployment (what a GPU gets; tests/scale/test_ray_local.py serves with the CPU default, queries
    # encoded in the ingress)
    settings = RaySettings(**SETTINGS, shard_replicas=2, http_port=_free_port(), app_name="regis-test",
                           encoder_placement="deployment")
    service = Settings(index_dir=ray_served, index_poll_s=0.5, enable_jobs=True, images_root=images,
                       uploads_dir=tmp_path_factory.mktemp("ray-uploads"))
    with _logged("ray.serve") as messages:
        url = start(ray_served, service, settings)
    # Serve started here, with these options: no "... New http_options/controller_options will not be applied."
    assert any("Started Serve" in m for m in messages), messages
    assert not [m for m in messages if "will not be applied" in m], messages
    try:
        deadline = time.monotonic() + 300
        while httpx.get(url + "/readyz", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the Ray Serve application did not become ready"
            time.sleep(1)
        yield url
    finally:
        serve.delete("regis-test")
        serve.shutdown()


def _search(url, data, **params):
    import httpx

    return httpx.post(url + "/v1/search", files={"file": ("q.png", data, "image/png")}, params=params, timeout=120)


def _assert_same_ranking(got: dict, want: dict) -> None:
    """Same scores rank by rank, same ids wherever the score is not tied (within float rounding) with a
    neighbour: the Ray encoder batches queries, which may reorder exact ties."""
    ids, scores = [h["id"] for h in got["results"]], np.array([h["score"] for h in got["results"]])
    want_ids, want_scores = [h["id"] for h in want["results"]], np.array([h["score"] for h in want["results"]])
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=2e-4)
    gaps = np.abs(np.diff(want_scores))
    for r in range(len(want_ids)):
        tied = (r > 0 and gaps[r - 1] < 2e-4) or (r < len(gaps) and gaps[r] < 2e-4)
        assert tied or ids[r] == want_ids[r], (r, ids, want_ids)


def test_ray_serve_sharded_search_equals_unsharded_exact(ray_app, ray_collection, single_index, images):
    """Exact mode: the single index's ranking (QueryEngine on this process). ANN mode: the embedded
    ``regis serve`` of the same collection (the same per-shard candidates and merge)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(index_dir=single_index))) as plain, \
            TestClient(create_app(Settings(index_dir=ray_collection))) as embedded:
        for photo in sorted(images.iterdir())[:3]:
            data = photo.read_bytes()
            for client, params in ((plain, {"k": PHOTOS, "mode": "exact"}), (embedded, {"k": PHOTOS}),
                                   (plain, {"k": 3, "offset": 2, "mode": "exact"}),
                                   (plain, {"k": 5, "mode": "exact", "filter": json.dumps({"file.ext": "jpg"})})):
                r = _search(ray_app, data, **params)
                assert r.status_code == 200, r.text
                want = client.post("/v1/search", files={"file": ("q.png", data, "image/png")}, params=params).json()
                _assert_same_ranking(r.json(), want)
                assert "partial" not in r.json()
            assert _search(ray_app, data, k=1, mode="exact").json()["results"][0]["path"] == photo.name


def test_the_ray_ingress_is_the_regis_serve_api(ray_app, ray_collection, single_index, images):
    """The routes of ``regis serve`` with its errors: images, files, similar, health, readiness, metrics,
    OpenAPI."""
    import httpx

    data = sorted(images.iterdir())[0].read_bytes()
    with httpx.Client(base_url=ray_app, timeout=120) as c:
        bad = _search(ray_app, b"not an image")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_image"
        for params, code in (({"k": 1001}, "invalid_request"), ({"kk": 3}, "unknown_parameter"),
                             ({"filter": "{"}, "invalid_filter")):
            r = _search(ray_app, data, **params)
            assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
        listing = c.get("/v1/images", params={"limit": 3, "offset": 2}).json()
        snap = IndexSnapshot.open(single_index)
        single = {rec.path: rec for rec in snap.table.iter_all()}
        snap.close()
        assert listing["total"] == PHOTOS and [i["id"] for i in listing["images"]] == [2, 3, 4]
        for item in listing["images"]:
            assert item["path"] == next(p for p, rec in single.items() if rec.id == item["id"])
            info = c.get(f"/v1/images/{item['id']}").json()
            assert info["path"] == item["path"] and info["sha256"] == single[item["path"]].sha256
            assert c.get(f"/v1/images/{item['id']}/file").content == (images / item["path"]).read_bytes()
        similar = c.get("/v1/images/3/similar", params={"k": 4, "mode": "exact"})
        assert similar.status_code == 200 and similar.json()["results"][0]["id"] == 3
        assert c.get("/v1/images/999").json()["error"]["code"] == "image_not_found"
        assert c.get("/v1/images/999/similar").status_code == 404
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["images"] == PHOTOS
        ready = c.get("/readyz").json()
        assert ready["ready"] and ready["images"] == PHOTOS and ready["checks"]["shards"] == "ok"
        assert [(s["shard"], s["state"]) for s in ready["shards"]] == [(0, "ok"), (1, "ok")]
        assert "regis_index_images 8.0" in c.get("/metrics").text
        assert "/v1/images/{image_id}/similar" in c.get("/openapi.json").json()["paths"]
        assert c.delete("/v1/images/3", params={"bogus": 1}).status_code == 422  # writes are routes here too


def test_ray_explanations_equal_the_embedded_ones(ray_app, ray_collection, images):
    """``explain=true``, "more like this" explained and POST /v1/explain on Ray Serve (query encoded by the
    encoder deployment, each result explained by its shard deployment) equal the embedded ``regis serve`` of the
    same collection, result for result."""
    import httpx
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    data = sorted(images.iterdir())[1].read_bytes()
    with TestClient(create_app(Settings(index_dir=ray_collection))) as embedded, \
            httpx.Client(base_url=ray_app, timeout=120) as c:
        params = {"k": PHOTOS, "mode": "exact", "explain": "true"}
        got, want = _search(ray_app, data, **params), embedded.post(
            "/v1/search", files={"file": ("q.png", data, "image/png")}, params=params)
        assert got.status_code == want.status_code == 200, got.text
        assert {h["id"] % SHARDS for h in got.json()["results"]} == set(range(SHARDS))
        assert_same_json(got.json(), want.json())
        got, want = (x.get("/v1/images/5/similar", params=params) for x in (c, embedded))
        assert got.status_code == 200, got.text
        assert_same_json(got.json(), want.json())
        got, want = (x.post("/v1/explain", files={"file": ("q.png", data, "image/png")}, data={"id": "6"})
                     for x in (c, embedded))
        assert got.status_code == 200, got.text
        assert_same_json(got.json(), want.json())


def test_killing_a_shard_replica_mid_load_loses_no_request(ray_app, images):
    """Shard 0 runs 2 replicas (``--replicas 2``); one is killed while 4 clients search: every request is
    answered 200 with the full ranking (the ingress resends a call whose replica died, ``cluster.serve._RayCall``),
    none is a 503."""
    import httpx
    import ray

    photos = sorted(p for p in images.iterdir() if p.is_file())[:4]
    want = {p.name: _search(ray_app, p.read_bytes(), k=PHOTOS, mode="exact").json() for p in photos}
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if "shard-000" in a["name"] and "REPLICA" in a["name"]]
    assert len(replicas) == 2, replicas
    outcomes: list[tuple[str, int, dict]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as c:
            for j in range(6):
                photo = photos[(i + j) % len(photos)]
                r = c.post(ray_app + "/v1/search", files={"file": ("q.png", photo.read_bytes(), "image/png")},
                           params={"k": PHOTOS, "mode": "exact"})
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
        assert status == 200, (status, body)
        assert "partial" not in body
        _assert_same_ranking(body, want[name])  # in full


def _mirrored_png(photo) -> bytes:
    """A new image: the photo mirrored, as PNG bytes."""
    import io

    from PIL import Image, ImageOps

    out = io.BytesIO()
    ImageOps.mirror(Image.open(photo).convert("RGB")).save(out, format="PNG")
    return out.getvalue()


def _job(client, folder: str) -> dict:
    r = client.post("/v1/jobs/index", json={"folder": folder})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 300
    while (info := client.get(f"/v1/jobs/{r.json()['id']}").json())["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline, info
        time.sleep(0.2)
    assert info["state"] == "done", info
    return info["result"]


def test_writes_through_ray_serve_equal_the_single_machine_ones(ray_app, ray_collection, images, tmp_path):
    """Uploads, a metadata change, a delete and a folder job through Ray Serve (the ``Writer`` deployment, one
    collection version each) and through the embedded ``regis serve`` of another copy of the same collection:
    the same answers, ids and versions, then the same listing and rankings (runs last: it writes the served
    collection and adds a folder to the images)."""
    import httpx
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    shutil.copytree(ray_collection, tmp_path / "collection")
    photos = sorted(p for p in images.iterdir() if p.is_file())
    service = Settings(index_dir=tmp_path / "collection", enable_jobs=True, images_root=images,
                       uploads_dir=tmp_path / "uploads")
    with TestClient(create_app(service)) as embedded, httpx.Client(base_url=ray_app, timeout=300) as ray:
        version = ray.get("/readyz").json()["index_version"]
        assert embedded.get("/readyz").json()["index_version"] == version
        files = [("files", (f"new{i}.png", _mirrored_png(photos[i]), "image/png")) for i in range(2)]
        meta = json.dumps([{"album": "mirror"}, {}])
        got, want = (c.post("/v1/images", files=files, data={"metadata": meta}) for c in (ray, embedded))
        assert got.status_code == want.status_code == 201, got.text
        assert_same_json({**got.json(), "job_id": ""}, {**want.json(), "job_id": ""})
        assert [i["id"] for i in got.json()["images"]] == [PHOTOS, PHOTOS + 1]
        assert got.json()["index_version"] == version + 1  # one collection version, both shards written
        assert {i["id"] % SHARDS for i in got.json()["images"]} == {0, 1}
        for method, path, kwargs in (("PATCH", f"/v1/images/{PHOTOS + 1}", {"json": {"metadata": {"x": 1}}}),
                                     ("DELETE", "/v1/images/3", {})):
            got, want = (c.request(method, path, **kwargs) for c in (ray, embedded))
            assert got.status_code == want.status_code == 200, got.text
            assert_same_json({**got.json(), "job_id": ""}, {**want.json(), "job_id": ""})
        (images / "extra").mkdir()
        for i in (2, 3):
            (images / "extra" / f"m{i}.png").write_bytes(_mirrored_png(photos[i]))
        got, want = _job(ray, "extra"), _job(embedded, "extra")
        keys = ("version", "added", "updated", "deleted", "unchanged", "skipped_count")
        assert {k: got[k] for k in keys} == {k: want[k] for k in keys} and got["added"] == 2, (got, want)
        assert got["version"] == version + 4
        ray_list, emb_list = (c.get("/v1/images", params={"limit": 100}).json() for c in (ray, embedded))
        assert [(i["id"], i["path"], i["sha256"], i["metadata"]) for i in ray_list["images"]] == \
            [(i["id"], i["path"], i["sha256"], i["metadata"]) for i in emb_list["images"]]
        assert ray_list["total"] == PHOTOS + 2 - 1 + 2
        for data in (files[0][1][1], photos[2].read_bytes()):
            params = {"k": PHOTOS + 4, "mode": "exact"}
            got, want = _search(ray_app, data, **params), embedded.post(
                "/v1/search", files={"file": ("q.png", data, "image/png")}, params=params)
            assert got.status_code == 200, got.text
            _assert_same_ranking(got.json(), want.json())
            assert 3 not in [h["id"] for h in got.json()["results"]]
        assert ray.get(f"/v1/images/{PHOTOS}/file").content == files[0][1][1]
        ready = ray.get("/readyz").json()
        assert ready["images"] == PHOTOS + 3 and ready["index_version"] == version + 4


def test_resharding_2_3_1_on_ray_serve_while_searching_keeps_every_answer(ray_app, ray_served, images):
    """``regis collections reshard`` 2 -> 3 -> 1 on the collection Ray Serve serves, while 2 clients search it:
    every request answers 200 with the ranking of before (exact mode), the ingress moves to each new layout at its
    next refresh, and the 2 shard deployments serve the 3 shards of the middle layout (shard 2 on deployment 0)
    (runs after the writes: the collection then holds 11 images)."""
    import httpx

    from regis.sharding.reshard import reshard

    photos = sorted(p for p in images.iterdir() if p.is_file())[:3]
    n = httpx.get(ray_app + "/readyz", timeout=60).json()["images"]
    want = {p.name: _search(ray_app, p.read_bytes(), k=n, mode="exact").json() for p in photos}
    stop, outcomes, layouts = threading.Event(), [], set()

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                photo = photos[i % len(photos)]
                r = c.post(ray_app + "/v1/search", files={"file": ("q.png", photo.read_bytes(), "image/png")},
                           params={"k": n, "mode": "exact"})
                outcomes.append((photo.name, r.status_code, r.json()))
                layouts.add(len(c.get(ray_app + "/readyz").json()["shards"]))
                i += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for shards in (3, 1):
            time.sleep(2)
            assert reshard(ray_served, shards).shards_after == shards
            deadline = time.monotonic() + 120
            while len(httpx.get(ray_app + "/readyz", timeout=60).json()["shards"]) != shards:
                assert time.monotonic() < deadline, "the ingress did not move to the new layout"
                time.sleep(0.2)
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert len(outcomes) >= 6 and layouts >= {2, 3, 1}, (len(outcomes), layouts)
    for name, status, body in outcomes:
        assert status == 200, (status, body)
        _assert_same_ranking(body, want[name])
    ready = httpx.get(ray_app + "/readyz", timeout=60).json()
    assert ready["images"] == n and [s["state"] for s in ready["shards"]] == ["ok"]


def test_a_snapshot_taken_while_ray_serve_takes_uploads_restores_elsewhere_to_the_same_results(
        ray_app, ray_served, images, tmp_path):
    """A snapshot of the collection Ray Serve serves, taken while a client uploads images through it (each upload
    a collection version), restores in another folder to one published state: exactly the images of that version,
    and the same exact rankings over them as the live collection (whose later images the ranking leaves out)."""
    import io

    import httpx
    from fastapi.testclient import TestClient
    from PIL import Image

    from regis.backups.restore import restore
    from regis.backups.snapshot import snapshot
    from service.app import create_app
    from service.settings import Settings

    stop, uploaded = threading.Event(), []

    def uploads() -> None:
        with httpx.Client(base_url=ray_app, timeout=300) as c:
            i = 0
            while not stop.is_set() and i < 12:
                buf = io.BytesIO()
                Image.new("RGB", (48, 40), (17 * i % 256, 90, 200 - 9 * i)).save(buf, format="PNG")
                r = c.post("/v1/images", files={"files": (f"u{i}.png", buf.getvalue(), "image/png")})
                assert r.status_code == 201, r.text
                uploaded.append(r.json()["index_version"])
                i += 1

    writer = threading.Thread(target=uploads)
    writer.start()
    try:
        while len(uploaded) < 2:  # mid-write-loop
            time.sleep(0.1)
        report = snapshot(ray_served, tmp_path / "snap.tar")
        # an upload committed after the snapshot (the one in flight may have committed just before it read)
        while uploaded[-1] <= report.version and writer.is_alive():
            time.sleep(0.1)
    finally:
        stop.set()
        writer.join(timeout=300)
    assert uploaded[1] <= report.version <= uploaded[-1] and len(uploaded) >= 3  # taken amid the write loop
    restore(tmp_path / "snap.tar", tmp_path / "elsewhere" / "collection")
    data = sorted(p for p in images.iterdir() if p.is_file())[0].read_bytes()
    total = httpx.get(ray_app + "/readyz", timeout=60).json()["images"]
    live = _search(ray_app, data, k=total, mode="exact").json()
    with TestClient(create_app(Settings(index_dir=tmp_path / "elsewhere" / "collection"))) as restored:
        ready = restored.get("/readyz").json()
        assert ready["index_version"] == report.version and ready["images"] == report.images < total
        got = restored.post("/v1/search", files={"file": ("q.png", data, "image/png")},
                            params={"k": report.images, "mode": "exact"}).json()
    kept = {h["id"] for h in got["results"]}
    assert len(kept) == report.images
    _assert_same_ranking(got, {"results": [h for h in live["results"] if h["id"] in kept]})
