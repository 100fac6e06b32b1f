"""``AsyncClient``: ``regis.client.Client`` for asyncio (``httpx.AsyncClient``); the same methods, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import httpx

from regis.api import schemas
from regis.api.explain import PairExplanation
from regis.client import calls
from regis.client.calls import Filter, ImageInput
from regis.client.sync import FINISHED
from regis.jobs.model import JobInfo


class AsyncClient:
    """``regis.client.Client`` for asyncio: the same arguments (``sleep``: ``asyncio.sleep``) and methods, each
    a coroutine (``iter_images`` an async iterator). See ``Client`` for what each route does.

    Example::

        import asyncio
        from regis.client import AsyncClient

        async def main():
            async with AsyncClient("http://127.0.0.1:8000", api_key="regis_...") as regis:
                answers = await asyncio.gather(*(regis.search(p, k=3) for p in ("a.jpg", "b.jpg")))
                print([a.results[0].path for a in answers])

        asyncio.run(main())
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 collection: str | None = None, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.routes = calls.Routes(collection)
        self.retry = calls.RetryPolicy(retries, backoff_s, max_backoff_s)
        self.sleep = sleep
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=calls.auth_headers(api_key),
                                      timeout=timeout_s, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def _run(self, call: calls.Call):
        attempt = 0
        while True:
            response = await self.http.request(call.method, call.path, **call.request_kwargs())
            delay = self.retry.delay(attempt, response)
            if delay is None:
                break
            await self.sleep(delay)
            attempt += 1
        calls.raise_for_error(response)
        return call.read(response)

    async def search(self, image: ImageInput, k: int | None = None, *, depth: int | None = None,
                     mode: str | None = None, filter: Filter = None, offset: int = 0,
                     score_threshold: float | None = None, explain: bool = False,
                     collection: str | None = None) -> schemas.SearchResponse:
        """``Client.search``."""
        return await self._run(self.routes.search(image, k, depth, mode, filter, offset, score_threshold, explain,
                                                  collection))

    async def search_batch(self, images: Sequence[ImageInput], k: int | None = None, *, depth: int | None = None,
                           mode: str | None = None, filter: Filter = None, offset: int = 0,
                           score_threshold: float | None = None, explain: bool = False,
                           collection: str | None = None) -> schemas.BatchSearchResponse:
        """``Client.search_batch``."""
        return await self._run(self.routes.search_batch(images, k, depth, mode, filter, offset, score_threshold,
                                                        explain, collection))

    async def similar(self, image_id: int, k: int | None = None, *, depth: int | None = None,
                      mode: str | None = None, filter: Filter = None, offset: int = 0,
                      score_threshold: float | None = None, explain: bool = False,
                      collection: str | None = None) -> schemas.SearchResponse:
        """``Client.similar``."""
        return await self._run(self.routes.similar(image_id, k, depth, mode, filter, offset, score_threshold,
                                                   explain, collection))

    async def explain(self, image: ImageInput, image_id: int, *, collection: str | None = None) -> PairExplanation:
        """``Client.explain``."""
        return await self._run(self.routes.explain(image, image_id, collection))

    async def image(self, image_id: int, *, collection: str | None = None) -> schemas.ImageInfo:
        """``Client.image``."""
        return await self._run(self.routes.image(image_id, collection))

    async def image_file(self, image_id: int, *, collection: str | None = None) -> bytes:
        """``Client.image_file``."""
        return await self._run(self.routes.image_file(image_id, collection))

    async def thumbnail(self, image_id: int, size: int | None = None, *, format: str | None = None,
                        collection: str | None = None) -> bytes:
        """``Client.thumbnail``."""
        return await self._run(self.routes.thumbnail(image_id, size, format, collection))

    async def images(self, filter: Filter = None, limit: int | None = None, offset: int = 0, *,
                     collection: str | None = None) -> schemas.ImageList:
        """``Client.images``."""
        return await self._run(self.routes.images(filter, limit, offset, collection))

    async def iter_images(self, filter: Filter = None, page_size: int = 500, *,
                          collection: str | None = None) -> AsyncIterator[schemas.ImageRow]:
        """``Client.iter_images``, as an async iterator (``async for row in regis.iter_images(...)``)."""
        page = await self.images(filter, page_size, collection=collection)
        while page.images:
            for row in page.images:
                yield row
            if len(page.images) < page_size:
                return
            page = await self.images(calls.with_id_after(filter, page.images[-1].id), page_size, collection=collection)

    async def update_metadata(self, image_id: int, metadata: dict, *, replace: bool = False,
                              wait: bool | None = None, collection: str | None = None) -> schemas.MetadataPatchResponse:
        """``Client.update_metadata``."""
        return await self._run(self.routes.update_metadata(image_id, metadata, replace, wait, collection))

    async def upload(self, images: Sequence[ImageInput], metadata: dict | list[dict] | None = None, *,
                     wait: bool | None = None, collection: str | None = None) -> schemas.UploadResponse:
        """``Client.upload``."""
        return await self._run(self.routes.upload(images, metadata, wait, collection))

    async def delete_image(self, image_id: int, *, wait: bool | None = None,
                           collection: str | None = None) -> schemas.DeleteResponse:
        """``Client.delete_image``."""
        return await self._run(self.routes.delete_image(image_id, wait, collection))

    async def index_folder(self, folder: str = "", *, collection: str | None = None) -> JobInfo:
        """``Client.index_folder``."""
        return await self._run(self.routes.index_folder(folder, collection))

    async def job(self, job_id: str, *, collection: str | None = None) -> JobInfo:
        """``Client.job``."""
        return await self._run(self.routes.job(job_id, collection))

    async def jobs(self, limit: int | None = None, *, collection: str | None = None) -> schemas.JobList:
        """``Client.jobs``."""
        return await self._run(self.routes.jobs(limit, collection))

    async def wait_for_job(self, job_id: str, timeout_s: float = 600.0, poll_s: float = 0.5, *,
                           collection: str | None = None) -> JobInfo:
        """``Client.wait_for_job``.

        Raises:
            TimeoutError: still queued or running after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.job(job_id, collection=collection)
            if info.state in FINISHED:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {info.state} after {timeout_s:.0f} s")
            await self.sleep(poll_s)

    async def collections(self) -> schemas.CollectionList:
        """``Client.collections``."""
        return await self._run(self.routes.collections())

    async def collection_info(self, name: str) -> schemas.CollectionInfo:
        """``Client.collection_info``."""
        return await self._run(self.routes.collection_info(name))

    async def create_collection(self, name: str, backbone: str | None = None, *, random_init: bool = False,
                                description: str = "", layout: str | None = None, frame: str | None = None,
                                query_layout: str | None = None) -> schemas.CollectionInfo:
        """``Client.create_collection`` (``layout``: "default" or "compact"; ``frame``: "center-crop", "pad",
        "squash", "aspect" or "center-crop+aspect"; ``query_layout``: "tokens" or "tokens+roi-cues"; the index
        records them; another value: a 422, ``UnprocessableError``)."""
        return await self._run(self.routes.create_collection(name, backbone, random_init, description, layout,
                                                             frame=frame, query_layout=query_layout))

    async def delete_collection(self, name: str) -> None:
        """``Client.delete_collection``."""
        return await self._run(self.routes.delete_collection(name))

    async def health(self) -> schemas.Health:
        """``Client.health``."""
        return await self._run(self.routes.health())

    async def ready(self) -> schemas.Readiness:
        """``Client.ready``."""
        response = await self.http.get("/readyz")
        if response.status_code not in (200, 503):
            calls.raise_for_error(response)
        return schemas.Readiness.model_validate(response.json())
