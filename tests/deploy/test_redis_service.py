"""The service against a real redis-server: the query cache, and what still works while Redis is down."""

from __future__ import annotations

import hashlib
import json

import redis
from fastapi.testclient import TestClient

from conftest import build
from deploy.support import wait_until
from regis.jobs.names import CACHE_ANSWER_FORMAT, RedisNames
from service.app import create_app
from service.settings import Settings


def _search(client, data: bytes, **params):
    return client.post("/v1/search", files={"file": ("q.png", data, "application/octet-stream")}, params=params)


def test_query_cache_is_keyed_by_image_version_and_parameters(tmp_path, images_root, tiny_encoder, redis_url,
                                                              prefix):
    index = tmp_path / "index"
    build(images_root / "photos", index, tiny_encoder)
    settings = Settings(index_dir=index, redis_url=redis_url, redis_prefix=prefix, cache_ttl_s=120,
                        index_poll_s=0.1)
    coffee = (images_root / "photos" / "skimage-coffee.png").read_bytes()
    conn = redis.Redis.from_url(redis_url)
    with TestClient(create_app(settings)) as c:
        first = _search(c, coffee, k=3)
        assert first.status_code == 200 and first.headers["x-regis-cache"] == "miss"
        second = _search(c, coffee, k=3)
        assert second.headers["x-regis-cache"] == "hit"
        assert second.json()["results"] == first.json()["results"] and second.json()["index_version"] == 1
        assert second.json()["timings_ms"]["encode"] == 0.0
        assert _search(c, coffee, k=4).headers["x-regis-cache"] == "miss"  # other parameters
        moon = (images_root / "photos" / "skimage-moon.png").read_bytes()
        assert _search(c, moon, k=3).headers["x-regis-cache"] == "miss"  # another image
        keys = conn.keys(f"{prefix}:cache:*")
        assert len(keys) == 3 and all(k.startswith(f"{prefix}:cache:a{CACHE_ANSWER_FORMAT}:v1:".encode()) for k in keys)
        assert 0 < conn.ttl(keys[0]) <= 120

        # a new version (written by another process, seen by polling): new keys, the old entry is not used
        (images_root / "photos" / "skimage-coffee.png").rename(images_root / "photos" / "coffee-moved.png")
        build(images_root / "photos", index, tiny_encoder)
        wait_until(lambda: c.get("/healthz").json()["index_version"] == 2, 10, what="the swap to version 2")
        third = _search(c, coffee, k=3)
        assert third.headers["x-regis-cache"] == "miss" and third.json()["index_version"] == 2
        assert third.json()["results"][0]["path"] == "coffee-moved.png"
        assert _search(c, coffee, k=3).headers["x-regis-cache"] == "hit"
        text = c.get("/metrics").text
        assert 'regis_cache_requests_total{result="hit"} 2.0' in text
        assert 'regis_cache_requests_total{result="miss"} 4.0' in text
    conn.delete(*conn.keys(f"{prefix}:*"))


def test_an_answer_cached_before_max_score_is_not_served(tmp_path, images_root, tiny_encoder, redis_url, prefix):
    """An answer cached by a service from before ``max_score`` (93505f0) has none, and the page divides scores by
    it: after an upgrade, such an entry (written here in that shape, under that service's key layout
    ``{prefix}:cache:v{version}:{sha256}:{params}``) must be a miss, the answer computed anew with its max_score."""
    index = tmp_path / "index"
    build(images_root / "photos", index, tiny_encoder)
    settings = Settings(index_dir=index, redis_url=redis_url, redis_prefix=prefix, cache_ttl_s=120)
    coffee = (images_root / "photos" / "skimage-coffee.png").read_bytes()
    conn = redis.Redis.from_url(redis_url)
    with TestClient(create_app(settings)) as c:
        first = _search(c, coffee, k=3)
        assert first.headers["x-regis-cache"] == "miss" and first.json()["max_score"] > 0
        [key] = conn.keys(f"{prefix}:cache:*")
        params = key.decode().rsplit(":", 1)[1]  # the digest of the search's parameters, as the service made it
        old = {name: value for name, value in first.json().items() if name != "max_score"}
        conn.delete(key)
        conn.set(f"{prefix}:cache:v1:{hashlib.sha256(coffee).hexdigest()}:{params}", json.dumps(old), ex=120)
        second = _search(c, coffee, k=3)
        assert second.headers["x-regis-cache"] == "miss"
        assert second.json()["max_score"] == first.json()["max_score"]
        assert second.json()["results"] == first.json()["results"]
        assert _search(c, coffee, k=3).headers["x-regis-cache"] == "hit"  # the new entry, in today's shape
    conn.delete(*conn.keys(f"{prefix}:*"))


def test_with_redis_down_search_answers_and_jobs_say_503(tmp_path, images_root, tiny_encoder, own_redis, prefix):
    index = tmp_path / "index"
    build(images_root / "photos", index, tiny_encoder)
    settings = Settings(index_dir=index, images_root=images_root, enable_jobs=True, redis_url=own_redis.url,
                        redis_prefix=prefix, write_wait_s=0, index_poll_s=0.2)
    coffee = (images_root / "photos" / "skimage-coffee.png").read_bytes()
    with TestClient(create_app(settings)) as c:
        assert c.get("/readyz").json()["checks"] == {"index": "ok", "redis": "ok"}
        assert c.post("/v1/jobs/index", json={"folder": "photos"}).status_code == 202

        own_redis.stop()
        for _ in range(3):
            r = _search(c, coffee, k=2)
            assert r.status_code == 200 and r.json()["results"][0]["path"] == "skimage-coffee.png"
        for method, url, kw in [("post", "/v1/jobs/index", {"json": {"folder": "photos"}}), ("get", "/v1/jobs", {}),
                                ("get", "/v1/jobs/" + "0" * 32, {}),
                                ("post", "/v1/images", {"files": [("files", ("c.png", coffee))]}),
                                ("delete", "/v1/images/0", {})]:
            r = getattr(c, method)(url, **kw)
            assert r.status_code == 503, (url, r.text)
            error = r.json()["error"]
            assert error["code"] == "queue_unavailable" and "cannot be reached" in error["message"]
            assert "search still works" in error["message"] and "Traceback" not in r.text
        staging = images_root / ".uploads" / ".staging"
        assert not staging.exists() or not any(staging.iterdir())  # the refused upload left nothing behind
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"] == "unreachable"
        text = c.get("/metrics").text
        assert "regis_redis_up 0.0" in text and 'regis_cache_requests_total{result="error"}' in text

        own_redis.start()  # same port: everything comes back without a restart of the service
        wait_until(lambda: c.get("/readyz").status_code == 200, 10, what="readiness after Redis came back")
        assert c.post("/v1/jobs/index", json={"folder": "photos"}).status_code == 202
        assert [j["state"] for j in c.get("/v1/jobs").json()["jobs"]] == ["queued"]  # a fresh, empty Redis
        assert RedisNames(prefix).queue in [q.decode().split(":")[-1] for q in
                                            redis.Redis.from_url(own_redis.url).smembers("rq:queues")]
