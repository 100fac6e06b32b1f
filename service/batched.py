"""Dynamic batching of concurrent searches: each request decodes its image in parallel (thread pool), then the
decoded images of concurrent requests are encoded in one forward pass and their candidate searches run as one
batched search (``QueryEngine.search_tokens_batch``). Results equal the unbatched ``QueryEngine.search_bytes``
(same ids and ranks; scores equal to float32 rounding of the batched forward pass).

Settings: ``REGIS_BATCH_MAX_SIZE`` (1 turns batching off), ``REGIS_BATCH_MAX_WAIT_MS`` and
``REGIS_BATCH_ENCODE_WORKERS`` (forward passes at once, each in its own thread with
``Settings.resolved_torch_threads()`` torch threads: ``REGIS_TORCH_THREADS``, else with the ONNX Runtime encoder
the cores its threads leave, else the cores shared out between them).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool

from regis.retrieve.query import QueryEngine
from service.batching import MicroBatcher

# FAISS threads of the batched search: one, as the encoder threads take the cores (two OpenMP teams spinning
# against the encoder's threads cost more than they save; BENCHMARKS.md section 6). Not torch.set_num_threads
# in that thread: it also sets torch's process-wide default, which the encoder threads would then pick up.
SEARCH_THREADS = 1


def _encode_batch(items: list[tuple[QueryEngine, torch.Tensor]]) -> list[np.ndarray]:
    """(engine, (3, H, W) pixels) items -> (m, D) query tokens each; one forward pass per encoder and input size."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (engine, pixels) in enumerate(items):
        groups[(id(engine.query_encoder), tuple(pixels.shape))].append(i)
    out: list = [None] * len(items)
    for members in groups.values():
        engine = items[members[0]][0]
        tokens = engine.encode_pixels(torch.stack([items[i][1] for i in members]))
        for row, i in enumerate(members):
            out[i] = tokens[row]
    return out


def _search_batch(items: list[tuple[QueryEngine, np.ndarray, tuple]]) -> list[dict]:
    """(engine, (m, D) query tokens, (k, depth, mode, nprobe)) items -> JSON-ready results; one batched search per
    engine and parameter set."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (engine, _, params) in enumerate(items):
        groups[(id(engine), params)].append(i)
    out: list = [None] * len(items)
    for (_, (k, depth, mode, nprobe)), members in groups.items():
        engine = items[members[0]][0]
        results = engine.search_tokens_batch(np.stack([items[i][1] for i in members]), k=k, depth=depth, mode=mode,
                                             nprobe=nprobe, threads=SEARCH_THREADS)
        for result, i in zip(results, members, strict=True):
            out[i] = result
    return out


def _traced(trace: list, fn, *args):
    """``fn(*args)`` in a worker thread, appending its start and end (``time.perf_counter()`` s) to ``trace``."""
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        trace.extend((start, time.perf_counter()))


def _trace_fields(trace: list, t0: float, t1: float, t2: float, t3: float) -> dict[str, float]:
    """The ``at_*`` timings of a traced search (absolute ``time.perf_counter()``, ms): entry, decode thread
    start / end, decoded, encoded, done, and per batcher (encode, search; absent when the search skipped the
    batchers) its batch's start / end in the worker thread; ``at_*_batch``: that batch's size, ``at_*_cpu``: its
    CPU time in the worker thread (ms)."""
    fields = {"at_entry": t0, "at_decode_start": trace[0], "at_decode_end": trace[1], "at_decoded": t1,
              "at_encoded": t2, "at_done": t3}
    out = {}
    for name, at in (("encode", 2), ("search", 6)):
        if len(trace) >= at + 4:
            fields[f"at_{name}_start"], fields[f"at_{name}_end"] = trace[at], trace[at + 1]
            out[f"at_{name}_batch"], out[f"at_{name}_cpu"] = float(trace[at + 2]), trace[at + 3] * 1e3
    return {**{key: value * 1e3 for key, value in fields.items()}, **out}


# Largest batch ``BatchedSearch.warm_up`` encodes at start-up (a GPU's batch of 256 is not worth warming per size).
WARM_UP_MAX_BATCH = 16


class BatchedSearch:
    """Query-by-image with dynamic batching of the encoder and of the candidate search.

    Args:
        max_batch_size: requests per forward pass / batched search at most.
        max_wait_ms: how long a batch waits for more requests after its first one, ms.
        encode_workers: forward passes running at once, each in its own thread.
        torch_threads: torch intra-op threads of each encoder thread (None: the cores // ``encode_workers``).
    """

    def __init__(self, max_batch_size: int = 4, max_wait_ms: float = 5.0, encode_workers: int = 1,
                 torch_threads: int | None = None):
        threads = torch_threads or max(1, (os.cpu_count() or 1) // encode_workers)
        self.encoder = MicroBatcher(_encode_batch, max_batch_size, max_wait_ms, name="regis-encode",
                                    workers=encode_workers, thread_init=lambda: torch.set_num_threads(threads))
        self.searcher = MicroBatcher(_search_batch, max_batch_size, max_wait_ms, name="regis-search")
        self.in_flight = 0  # searches between entry and result
        # bench-only tracing (bench.tail): REGIS_TRACE_STAGES=1 adds each stage's absolute time.perf_counter()
        # (ms, keys "at_*", CLOCK_MONOTONIC: comparable with a client's on the same machine) to timings_ms
        self.trace = os.environ.get("REGIS_TRACE_STAGES", "") not in ("", "0")
        self.alone = 0  # searches that found no other in flight and skipped the batchers (tests, metrics)

    def warm_up(self, engine: QueryEngine) -> list[int]:
        """Encode blank images once per batch size the encoder batcher can form (1 .. ``max_batch_size``, at
        most ``WARM_UP_MAX_BATCH``), at the encoder's input size, so that per-shape work (the ONNX Runtime
        copy's session per input shape, ``regis.models.inference.OrtBackbone``) is done at start-up rather than
        while the first concurrent requests wait behind it. Returns the batch sizes encoded.
        """
        size = engine.encoder.config.image_size
        sizes = list(range(1, min(self.encoder.max_batch_size, WARM_UP_MAX_BATCH) + 1))
        for b in sizes:
            engine.encode_pixels(torch.zeros((b, 3, size, size)))
        return sizes

    async def search_bytes(self, engine: QueryEngine, data: bytes, k: int = 10, depth: int | None = None,
                           mode: str = "ann", nprobe: int | None = None) -> dict:
        """``engine.search_bytes`` through the batchers; same result format. ``timings_ms.encode`` and the search
        timings include the time spent waiting for the batch (ms). A search with no other in flight once its image
        is decoded skips the batchers (nothing to batch with; on the 2-core CPU the direct path answered a lone
        client faster, BENCHMARKS.md section 6).

        Raises:
            ImageDecodeError: bad image bytes (this request only).
            ConfigError: bad parameters.
        """
        t0 = time.perf_counter()
        trace = [] if self.trace else None
        self.in_flight += 1
        try:
            if trace is None:
                pixels, decode_ms = await run_in_threadpool(engine.decode_bytes, data)
            else:
                pixels, decode_ms = await run_in_threadpool(_traced, trace, engine.decode_bytes, data)
            t1 = time.perf_counter()
            if self.in_flight == 1:
                self.alone += 1
                tokens = (await run_in_threadpool(engine.encode_pixels, pixels[None]))[0]
                t2 = time.perf_counter()
                result = await run_in_threadpool(engine.search_tokens, tokens, k=k, depth=depth, mode=mode,
                                                 nprobe=nprobe)
            else:
                tokens = await self.encoder.submit((engine, pixels), trace)
                t2 = time.perf_counter()
                result = await self.searcher.submit((engine, tokens, (k, depth, mode, nprobe)), trace)
        finally:
            self.in_flight -= 1
        t3 = time.perf_counter()
        result["timings_ms"] = {"decode": decode_ms, "encode": (t2 - t1) * 1e3, **result["timings_ms"],
                                "total": (t3 - t0) * 1e3}
        if trace is not None:
            result["timings_ms"].update(_trace_fields(trace, t0, t1, t2, t3))
        return result

    def close(self) -> None:
        """Stop the batchers' worker threads."""
        self.encoder.close()
        self.searcher.close()
