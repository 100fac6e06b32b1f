"""Index swaps under load: concurrent searches over real HTTP while new versions are swapped in."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from conftest import build
from deploy.support import ServerThread
from service.app import create_app
from service.settings import Settings


def test_50_concurrent_searches_during_index_swaps_all_succeed(tmp_path, images_root, tiny_encoder):
    photos = images_root / "photos"
    index = tmp_path / "index"
    build(photos, index, tiny_encoder)  # version 1
    names = sorted(p.name for p in photos.iterdir())
    queries = [(photos / names[i % len(names)]).read_bytes() for i in range(50)]
    # no polling: the test decides when the service swaps
    app = create_app(Settings(index_dir=index, index_poll_s=3600, max_k=100))
    lock = threading.Lock()
    answered = []

    with ServerThread(app) as server:
        live = app.state.live
        shutil.copy(photos / names[0], photos / "new.png")
        assert build(photos, index, tiny_encoder).version == 2  # published; served once the test says so
        assert live.version == 1
        with httpx.Client(base_url=server.url, timeout=120,
                          limits=httpx.Limits(max_connections=60, max_keepalive_connections=60)) as http:

            def search(data: bytes):
                r = http.post("/v1/search", files={"file": ("q", data)}, params={"k": 3})
                with lock:
                    answered.append(r)
                    if len(answered) == 10:  # swap while about 40 queries are in flight or queued
                        assert live.refresh() and live.version == 2
                return r

            barrier = threading.Barrier(50)

            def start_together(data):
                barrier.wait(timeout=60)
                return search(data)

            with ThreadPoolExecutor(max_workers=50) as pool:
                responses = list(pool.map(start_together, queries))

    assert [r.status_code for r in responses] == [200] * 50, [r.text for r in responses if r.status_code != 200]
    versions = [r.json()["index_version"] for r in responses]
    assert set(versions) == {1, 2}, versions
    assert [r.json()["index_version"] for r in answered[:10]] == [1] * 10  # answered before the swap
    assert live.swaps == 1
    for data, r in zip(queries, responses, strict=True):  # each answer is right for the version it names
        top = r.json()["results"][0]
        assert top["score"] > 9.99 and (photos / top["path"]).read_bytes() == data
