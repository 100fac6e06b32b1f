"""Dynamic batching: the micro-batcher's batch formation, max wait and per-item errors, and the service's batched
searches equal to unbatched ones on real photos."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from regis.errors import ConfigError
from service.app import create_app
from service.batching import MicroBatcher
from service.settings import Settings


def _double(items):
    return [2 * x for x in items]


def test_concurrent_items_form_batches_up_to_the_max_size():
    batcher = MicroBatcher(_double, max_batch_size=4, max_wait_ms=50)

    async def main():
        return await asyncio.gather(*(batcher.submit(i) for i in range(10)))

    assert asyncio.run(main()) == [2 * i for i in range(10)]
    assert batcher.batch_sizes == [4, 4, 2]
    batcher.close()


def test_a_batch_waits_at_most_max_wait_for_more_items():
    async def staggered(batcher):
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.2)  # the second item arrives 200 ms after the first
        return await asyncio.gather(first, batcher.submit(2))

    quick = MicroBatcher(_double, max_batch_size=8, max_wait_ms=20)
    assert asyncio.run(staggered(quick)) == [2, 4]
    assert quick.batch_sizes == [1, 1]  # the first batch left before the second item came
    patient = MicroBatcher(_double, max_batch_size=2, max_wait_ms=3000)
    t0 = time.perf_counter()
    assert asyncio.run(staggered(patient)) == [2, 4]
    assert patient.batch_sizes == [2]  # waited for it ...
    assert time.perf_counter() - t0 < 2.0  # ... and left when the batch was full, not at the 3 s deadline
    quick.close()
    patient.close()


def test_errors_reach_only_their_own_caller():
    calls = []

    def fn(items):
        calls.append(list(items))
        if "boom" in items:  # the whole batch raises because of one item: each is retried alone
            raise ValueError("bad item")
        return [ValueError("odd") if x == "odd" else x.upper() for x in items]

    batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=50)

    async def main():
        return await asyncio.gather(*(batcher.submit(x) for x in ["a", "boom", "odd", "b"]), return_exceptions=True)

    out = asyncio.run(main())
    assert out[0] == "A" and out[3] == "B"
    assert isinstance(out[1], ValueError) and str(out[1]) == "bad item"
    assert isinstance(out[2], ValueError) and str(out[2]) == "odd"
    assert calls[0] == ["a", "boom", "odd", "b"] and ["a"] in calls and ["boom"] in calls
    batcher.close()


def test_workers_run_batches_at_once_each_in_a_thread_set_up_by_thread_init():
    barrier = threading.Barrier(2, timeout=10)  # only two batches running at the same time get past it
    local = threading.local()
    threads = set()

    def setup():
        local.ready = True

    def fn(items):
        threads.add(threading.get_ident())
        if not getattr(local, "ready", False):
            raise RuntimeError("thread_init did not run in this worker thread")
        barrier.wait()
        return _double(items)

    batcher = MicroBatcher(fn, max_batch_size=2, max_wait_ms=0, workers=2, thread_init=setup)

    async def main():
        return await asyncio.gather(*(batcher.submit(i) for i in range(4)))

    assert asyncio.run(main()) == [0, 2, 4, 6]
    assert batcher.batch_sizes == [2, 2] and len(threads) == 2
    batcher.close()


def test_one_worker_forms_the_next_batch_while_the_first_runs():
    started = threading.Event()
    release = threading.Event()

    def fn(items):
        started.set()
        release.wait(10)
        return _double(items)

    batcher = MicroBatcher(fn, max_batch_size=8, max_wait_ms=0, workers=1)

    async def main():
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]  # queued while the worker is busy
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *rest)

    assert asyncio.run(main()) == [0, 2, 4, 6, 8, 10]
    assert batcher.batch_sizes == [1, 5]
    batcher.close()


def test_bad_batcher_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="max_batch_size"):
        MicroBatcher(_double, max_batch_size=0)
    with pytest.raises(ConfigError, match="max_wait_ms"):
        MicroBatcher(_double, max_wait_ms=-1)
    with pytest.raises(ConfigError, match="workers"):
        MicroBatcher(_double, workers=0)
    with pytest.raises(ValueError, match="batch_max_size"):
        Settings(index_dir=tmp_path, batch_max_size=0)


def test_batched_service_results_equal_unbatched_ones(lite0_index, photos_dir, one_thread, monkeypatch):
    """Five concurrent queries and a corrupt upload: the five are encoded in one forward pass and searched in one
    batched search, each result equal to the unbatched search of the same image; the corrupt one alone gets
    its 400."""
    photos = sorted(photos_dir.iterdir())[:5]
    # the batch closes when its 5th image arrives; the long wait only keeps a busy machine's slow decodes in it
    settings = Settings(index_dir=lite0_index, batch_max_size=5, batch_max_wait_ms=10_000)
    app = create_app(settings)
    with TestClient(app) as client:
        engine = app.state.live.engine
        responses: dict[str, object] = {}

        def post(name: str, data: bytes, params: dict) -> None:
            responses[name] = client.post("/v1/search", files={"file": ("q.jpg", data, "image/jpeg")}, params=params)

        jobs = [(p.name, p.read_bytes(), {"k": 8}) for p in photos] + [("corrupt", b"\xff\xd8 not a jpeg", {"k": 8})]
        # Each request decodes once all six are in flight: else on a busy machine the first one can finish
        # decoding before the others arrive and take the lone-request path (a race of the test, not the batcher).
        # The first waiter to see all six sets ``all_in`` for the others: the corrupt upload fails its decode at
        # once and leaves, so a waiter that looked a moment later would see five and wait out its deadline.
        gate, all_in, real_decode = threading.Event(), threading.Event(), engine.decode_bytes

        def decode_when_all_in_flight(data: bytes):
            deadline = time.monotonic() + 30
            while gate.is_set() and not all_in.is_set() and time.monotonic() < deadline:
                if app.state.batched.in_flight >= len(jobs):
                    all_in.set()
                else:
                    time.sleep(0.005)
            return real_decode(data)

        gate.set()
        monkeypatch.setattr(engine, "decode_bytes", decode_when_all_in_flight)
        threads = [threading.Thread(target=post, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gate.clear()
        assert app.state.batched.encoder.batch_sizes == [5]
        assert app.state.batched.searcher.batch_sizes == [5]
        bad = responses["corrupt"]
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_image"
        for photo in photos:
            got = responses[photo.name]
            assert got.status_code == 200, got.text
            want = engine.search_bytes(photo.read_bytes(), k=8)
            got = got.json()
            assert [h["id"] for h in got["results"]] == [h["id"] for h in want["results"]]
            assert [h["path"] for h in got["results"]] == [h["path"] for h in want["results"]]
            np.testing.assert_allclose([h["score"] for h in got["results"]], [h["score"] for h in want["results"]],
                                       rtol=0, atol=1e-4)
            assert got["num_candidates"] == want["num_candidates"] and got["depth"] == want["depth"]
            assert got["results"][0]["path"] == photo.name  # the photo itself is its own best match
        assert app.state.batched.alone == 0
        # a search alone in flight skips the batchers, same result
        exact = client.post("/v1/search", files={"file": ("q.jpg", photos[0].read_bytes(), "image/jpeg")},
                            params={"k": 3, "mode": "exact"}).json()
        want = engine.search_bytes(photos[0].read_bytes(), k=3, mode="exact")
        assert [h["id"] for h in exact["results"]] == [h["id"] for h in want["results"]]
        assert app.state.batched.alone == 1 and app.state.batched.encoder.batch_sizes == [5]


def test_a_caller_can_have_its_batchs_times_and_cpu_recorded():
    def slow(items):
        sum(range(200_000))  # some CPU in the worker thread
        return _double(items)

    batcher = MicroBatcher(slow, max_batch_size=4, max_wait_ms=50)
    traced, untraced = [], []

    async def main():
        t0 = time.perf_counter()
        got = await asyncio.gather(batcher.submit(1, traced), batcher.submit(2), batcher.submit(3, untraced))
        return t0, got, time.perf_counter()

    t0, got, t1 = asyncio.run(main())
    assert got == [2, 4, 6] and batcher.batch_sizes == [3]
    start, end, size, cpu = traced
    assert t0 <= start <= end <= t1 and size == 3 and 0 < cpu <= end - start + 0.01
    assert untraced == traced  # the same batch
    batcher.close()


class _StubEngine:
    """decode / encode / batched search of ``BatchedSearch`` without a model: decoding waits for the other
    request so both go through the batchers."""

    def __init__(self):
        self.query_encoder = object()
        self.both_in = threading.Barrier(2, timeout=10)

    def decode_bytes(self, data):
        self.both_in.wait()
        import torch

        return torch.full((3, 4, 4), float(data[0])), 1.0

    def encode_pixels(self, pixels):
        return pixels.reshape(len(pixels), 3, 16).numpy()

    def search_tokens_batch(self, tokens, **params):
        return [{"results": [float(t[0, 0])], "timings_ms": {"candidates": 1.0, "rerank": 1.0}} for t in tokens]


def test_traced_searches_carry_their_stage_times_in_order(monkeypatch):
    """REGIS_TRACE_STAGES=1 (bench.tail): each batched search's timings hold its stages' absolute times, in
    order, and its batches' sizes and CPU; the metrics do not observe them; without it they are absent."""
    from service.batched import BatchedSearch
    from service.metrics import Metrics

    monkeypatch.setenv("REGIS_TRACE_STAGES", "1")
    batched = BatchedSearch(max_batch_size=2, max_wait_ms=1000)
    t0 = time.perf_counter() * 1e3
    results = asyncio.run(_two_searches(batched, _StubEngine()))
    t1 = time.perf_counter() * 1e3
    assert [r["results"] for r in results] == [[1.0], [2.0]] and batched.alone == 0
    order = ["at_entry", "at_decode_start", "at_decode_end", "at_decoded", "at_encode_start", "at_encode_end",
             "at_encoded", "at_search_start", "at_search_end", "at_done"]
    metrics = Metrics()
    for r in results:
        t = r["timings_ms"]
        assert t0 <= t["at_entry"] and t["at_done"] <= t1
        assert [t[k] for k in order] == sorted(t[k] for k in order), t
        assert t["at_encode_batch"] == t["at_search_batch"] == 2.0 and t["at_encode_cpu"] >= 0
        metrics.observe_search(t)
    stages = {s.labels["stage"] for m in metrics.registry.collect() for s in m.samples if "stage" in s.labels}
    assert stages == {"decode", "encode", "candidates", "rerank", "total"}
    batched.close()

    monkeypatch.delenv("REGIS_TRACE_STAGES")
    plain = BatchedSearch(max_batch_size=2, max_wait_ms=1000)
    results = asyncio.run(_two_searches(plain, _StubEngine()))
    assert [r["results"] for r in results] == [[1.0], [2.0]]
    assert not any(k.startswith("at_") for r in results for k in r["timings_ms"])
    plain.close()


async def _two_searches(batched, engine):
    return await asyncio.gather(batched.search_bytes(engine, b"\x01"), batched.search_bytes(engine, b"\x02"))
