"""Running a search for a request: the query-result cache (when configured) and the per-stage metrics."""

from __future__ import annotations

import hashlib
import time

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from regis.jobs.cache import params_key
from regis.retrieve.query import QueryEngine


async def _search(request: Request, engine: QueryEngine, data: bytes, params: dict) -> dict:
    """One search: through the dynamic batcher when the app has one (``service.batched``), else alone."""
    batched = getattr(request.app.state, "batched", None)
    extras = set(params) - {"k", "depth", "mode", "nprobe"}  # filter, offset, threshold: not batched
    if batched is not None and isinstance(engine, QueryEngine) and not extras:
        return await batched.search_bytes(engine, data, **params)
    return await run_in_threadpool(engine.search_bytes, data, **params)


async def run_search(request: Request, response: Response, engine: QueryEngine, data: bytes, **params) -> dict:
    """``engine.search_bytes(data, **params)``, through the cache when there is one, and through the dynamic
    batcher when batching is on (``REGIS_BATCH_MAX_SIZE`` > 1).

    A hit is keyed by the query bytes' SHA-256, the index version served now and ``params``; its stage
    timings read 0 and ``total`` is the lookup time (ms). The ``X-Regis-Cache`` header says hit or miss.
    """
    metrics = request.app.state.metrics
    cache = getattr(request.app.state, "cache", None)
    if cache is None:
        result = await _search(request, engine, data, params)
        metrics.observe_search(result["timings_ms"])
        return result
    t0 = time.perf_counter()
    sha = hashlib.sha256(data).hexdigest()
    pkey = params_key(**params, index=str(engine.snapshot.index_dir))  # one cache per collection
    hit, failed = await run_in_threadpool(cache.get, engine.snapshot.version, sha, pkey)
    if hit is not None:
        metrics.cache.labels(result="hit").inc()
        response.headers["X-Regis-Cache"] = "hit"
        hit["timings_ms"] = {**dict.fromkeys(hit.get("timings_ms", {}), 0.0),
                             "total": (time.perf_counter() - t0) * 1e3}
        return hit
    metrics.cache.labels(result="error" if failed else "miss").inc()
    response.headers["X-Regis-Cache"] = "miss"
    result = await _search(request, engine, data, params)
    metrics.observe_search(result["timings_ms"])
    if not failed:
        await run_in_threadpool(cache.put, result["index_version"], sha, pkey, result)
    return result


async def run_search_id(request: Request, engine: QueryEngine, image_id: int, search=None, **params) -> dict:
    """``engine.search_id`` ("more like this"), with the per-stage metrics; ``search(engine, image_id, **params)``
    replaces it when given (``regis.retrieve.explain.similar_explained``).

    Raises:
        APIError: 404 when the image is not in the version served now.
    """
    from service.errors import APIError

    t0 = time.perf_counter()
    try:
        if search is None:
            result = await run_in_threadpool(engine.search_id, image_id, **params)
        else:
            result = await run_in_threadpool(search, engine, image_id, **params)
    except KeyError:
        raise APIError(404, "image_not_found", f"no image with id {image_id} in index version "
                                               f"{engine.snapshot.version}") from None
    result["timings_ms"] = {"decode": 0.0, "encode": 0.0, **result["timings_ms"],
                            "total": (time.perf_counter() - t0) * 1e3}
    request.app.state.metrics.observe_search(result["timings_ms"])
    return result


async def run_search_batch(request: Request, engine: QueryEngine, images: list[bytes], **params) -> list[dict]:
    """Several query images in one go: decoded and encoded as one batch, then the batched search path
    (``QueryEngine.search_tokens_batch``). Results equal one-by-one searches (float32 rounding of the batched
    forward pass aside).

    Raises:
        ImageDecodeError: an image does not decode (the message names it).
    """
    from regis.errors import ImageDecodeError

    def work() -> list[dict]:
        t0 = time.perf_counter()
        pixels = []
        for n, data in enumerate(images):
            try:
                pixels.append(engine.decode_bytes(data)[0])
            except ImageDecodeError as exc:
                raise ImageDecodeError(f"image {n + 1}: {exc}") from None
        t1 = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(pixels):  # one forward pass per input size
            groups.setdefault(tuple(p.shape), []).append(i)
        tokens: list = [None] * len(pixels)
        import torch

        for members in groups.values():
            out = engine.encode_pixels(torch.stack([pixels[i] for i in members]))
            for row, i in enumerate(members):
                tokens[i] = out[row]
        t2 = time.perf_counter()
        import numpy as np

        results = engine.search_tokens_batch(np.stack(tokens), **params)
        t3 = time.perf_counter()
        b = len(images)
        for r in results:
            r["timings_ms"] = {"decode": (t1 - t0) * 1e3 / b, "encode": (t2 - t1) * 1e3 / b, **r["timings_ms"],
                               "total": (t3 - t0) * 1e3 / b}
        return results

    results = await run_in_threadpool(work)
    for r in results:
        request.app.state.metrics.observe_search(r["timings_ms"])
    return results


EMPTY_VERSION = 0  # the index_version of an answer from a collection without a published version (versions start at 1)


def empty_search(k: int, depth: int | None, mode: str) -> dict:
    """The answer of a search on a collection that has no published index version yet: no results,
    ``index_version`` 0, ``num_candidates`` 0, every timing 0 ms (``depth`` 0 when the request gave none: there
    is no manifest to take the tuned default from)."""
    return {"index_version": EMPTY_VERSION, "mode": mode, "k": k, "depth": depth or 0, "num_candidates": 0,
            "results": [], "timings_ms": dict.fromkeys(("decode", "encode", "candidates", "rerank", "total"), 0.0)}


async def check_query_images(images: list[bytes], max_pixels: int) -> None:
    """Decode each query image once (no encoder, no index: the check a search of an empty collection still
    makes, so a non-image upload is a 400 whatever the collection holds).

    Raises:
        ImageDecodeError: an image does not decode or is over ``max_pixels`` (with several, the message names
            which: "image 2: ...").
    """
    from regis.errors import ImageDecodeError
    from regis.images.decode import decode_image

    def work() -> None:
        for n, data in enumerate(images):
            try:
                decode_image(data, max_pixels=max_pixels, draft_size=64)
            except ImageDecodeError as exc:
                raise type(exc)(f"image {n + 1}: {exc}" if len(images) > 1 else str(exc)) from None

    await run_in_threadpool(work)
