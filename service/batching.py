"""An asyncio micro-batcher: concurrent ``submit`` calls are grouped into one call of a batch function.

The service's dynamic batching (``service.batched``) runs the encoder and the candidate search through two of
these. A batch is formed from the first waiting item plus whatever else arrives within ``max_wait_ms`` (or is
already queued), up to ``max_batch_size`` items; batches run in ``workers`` dedicated threads (one by default;
the next batch forms while every worker is busy, as in Triton's dynamic batcher), so the event loop never
blocks. ``thread_init`` runs once in each worker thread (the service sets each encoder thread's torch threads
there: torch's and OpenMP's thread counts are per calling thread).

Errors are per item: the batch function may return an exception in place of an item's result; when it raises
for a whole batch of more than one item, each item is retried alone, so one bad item fails only its own
request. A library was considered first: ``batched`` (mixedbread, PyPI 0.1.5) binds its worker to the first
event loop it sees and fails the whole batch on any exception; Ray Serve's ``@serve.batch`` (used by
``cluster/``) needs a running Ray.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from regis.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("regis.service")


class MicroBatcher(Generic[T, R]):
    """Group concurrent calls into batches.

    Args:
        fn: the batch function: list of B items -> sequence of B results, where a result may be an
            ``Exception`` instance (raised to that item's caller alone). Runs in the batcher's worker thread.
        max_batch_size: items per batch at most (1: no batching, each item alone).
        max_wait_ms: how long a batch waits for more items after its first one, ms (0: take only what is
            already queued).
        name: thread name prefix (logs, debugging).
        workers: batches running at once, each in its own thread.
        thread_init: called once in each worker thread before its first batch (None: nothing).

    Raises:
        ConfigError: max_batch_size < 1, max_wait_ms < 0 or workers < 1.
    """

    def __init__(self, fn: Callable[[list[T]], Sequence[R | BaseException]], max_batch_size: int = 16,
                 max_wait_ms: float = 5.0, name: str = "batcher", workers: int = 1,
                 thread_init: Callable[[], object] | None = None):
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1e3
        self.workers = workers
        self.batch_sizes: list[int] = []  # size of every batch run so far (tests, metrics)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=thread_init)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def _ensure_worker(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            # first use, or a new event loop (a test client per test): a fresh queue and worker on this loop
            self._loop = loop
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._worker())
        return self._queue

    async def submit(self, item: T, times: list | None = None) -> R:
        """Queue ``item`` and wait for its result.

        Args:
            times: given, its batch's start and end in the worker thread (``time.perf_counter()`` s), size and
                CPU time in that thread (s) are appended to it (tracing, ``service.batched``).

        Raises:
            Exception: whatever the batch function returned or raised for this item.
        """
        queue = self._ensure_worker()
        future = asyncio.get_running_loop().create_future()
        await queue.put((item, future, times))
        return await future

    async def _collect(self, queue: asyncio.Queue) -> list[tuple[T, asyncio.Future, list | None]]:
        batch = [await queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            try:
                batch.append(queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return [entry for entry in batch if not entry[1].done()]  # a cancelled caller is dropped

    def _run(self, items: list[T]) -> list[R | BaseException]:
        """The batch function, with per-item retries when it raises for a batch of several items."""
        try:
            results = list(self.fn(items))
            if len(results) != len(items):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
            return results
        except Exception as exc:
            if len(items) == 1:
                return [exc]
            log.warning("batch of %d failed (%s); retrying its items one by one", len(items), type(exc).__name__)
            return [self._run([item])[0] for item in items]

    def _run_timed(self, items: list[T]) -> tuple[tuple[float, float, int, float], list[R | BaseException]]:
        """``_run`` and (start, end, size, this thread's CPU seconds) of the batch."""
        start, cpu = time.perf_counter(), time.thread_time()
        results = self._run(items)
        return (start, time.perf_counter(), len(items), time.thread_time() - cpu), results

    async def _worker(self) -> None:
        queue = self._queue
        slots = asyncio.Semaphore(self.workers)
        running: set[asyncio.Task] = set()
        try:
            while True:
                await slots.acquire()  # a batch is collected only when a worker can take it at once
                batch = await self._collect(queue)
                if not batch:
                    slots.release()
                    continue
                self.batch_sizes.append(len(batch))
                task = asyncio.get_running_loop().create_task(self._dispatch(batch))
                running.add(task)
                task.add_done_callback(lambda t: (running.discard(t), slots.release()))
        finally:
            for task in running:
                task.cancel()

    async def _dispatch(self, batch: list[tuple[T, asyncio.Future, list | None]]) -> None:
        """Run one batch in a worker thread and hand each caller its result."""
        loop = asyncio.get_running_loop()
        try:
            stats, results = await loop.run_in_executor(self._executor, self._run_timed, [item for item, _, _ in batch])
        except BaseException as exc:  # the loop is closing, or the executor is gone
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("batcher stopped"))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, fut, times), result in zip(batch, results, strict=True):
            if times is not None:
                times.extend(stats)
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def close(self) -> None:
        """Stop the worker and its thread (pending callers get an error)."""
        if self._task is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._executor.shutdown(wait=False, cancel_futures=True)
