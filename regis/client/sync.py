"""``Client``: the regis HTTP API from Python, on httpx, with typed results (``regis.api`` models)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import httpx

from regis.api import schemas
from regis.api.explain import PairExplanation
from regis.client import calls
from regis.client.calls import Filter, ImageInput
from regis.jobs.model import JobInfo

FINISHED = ("done", "failed")


class Client:
    """A client of one regis service (``regis serve``).

    Args:
        base_url: the service, e.g. "http://127.0.0.1:8000".
        api_key: sent as ``Authorization: Bearer <key>`` (``regis keys create``); None: no key.
        collection: the collection every call uses unless it names another (None: the service's default
            collection, the routes without ``/collections/{name}``).
        timeout_s: per request, seconds (a search encodes an image: allow a few seconds on a busy CPU).
        retries, backoff_s, max_backoff_s: ``RetryPolicy``: a 503 (no index yet, a shard down) is retried
            ``retries`` times with exponential back-off (or the answer's ``Retry-After``), then raised.
        transport: an httpx transport (tests: ``httpx.MockTransport``).
        sleep: how to wait between retries (``time.sleep``).

    Every method returns the service's own pydantic model (``regis.api.schemas``) and raises a
    ``regis.client.errors.RegisAPIError`` subclass on an error answer (with the service's JSON error), or httpx's
    exceptions when the service cannot be reached.

    Example::

        from regis.client import Client

        with Client("http://127.0.0.1:8000", api_key="regis_...") as regis:
            found = regis.search("query.jpg", k=5, filter={"album": "trip"})
            for hit in found.results:
                print(hit.rank, round(hit.score, 3), hit.path)
            more = regis.similar(found.results[0].id, k=5)          # "more like this"
            regis.upload(["new.jpg"], metadata={"album": "trip"})    # needs a write key and --enable-jobs
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 collection: str | None = None, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.routes = calls.Routes(collection)
        self.retry = calls.RetryPolicy(retries, backoff_s, max_backoff_s)
        self.sleep = sleep
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=calls.auth_headers(api_key), timeout=timeout_s,
                                 transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def _run(self, call: calls.Call):
        """Send ``call``, retrying 503s (``RetryPolicy``); its result, or the error answer's exception."""
        attempt = 0
        while True:
            response = self.http.request(call.method, call.path, **call.request_kwargs())
            delay = self.retry.delay(attempt, response)
            if delay is None:
                break
            self.sleep(delay)
            attempt += 1
        calls.raise_for_error(response)
        return call.read(response)

    # ------------------------------------------------------------------ search
    def search(self, image: ImageInput, k: int | None = None, *, depth: int | None = None, mode: str | None = None,
               filter: Filter = None, offset: int = 0, score_threshold: float | None = None, explain: bool = False,
               collection: str | None = None) -> schemas.SearchResponse:
        """Search by image: ``POST /v1/search``.

        Args:
            image: a file path, the image's bytes, an open binary file or a PIL image.
            k: results (None: the service's default, 10); depth: candidates per query token; mode: "ann" or
                "exact"; filter: metadata filter, a dict ({"album": "trip", "year": {"gte": 2020}}) or its text
                form ("album:trip"); offset: skip the best ``offset`` (paging); score_threshold: drop results
                scoring below it; explain: add each result's explanation.

        Raises:
            UnprocessableError: e.g. a filter field no image has (``code`` "unknown_filter_field").
            BadRequestError: not a decodable image.

        Example: ``regis.search(Path("cat.jpg"), k=3).results[0].path``
        """
        return self._run(self.routes.search(image, k, depth, mode, filter, offset, score_threshold, explain,
                                            collection))

    def search_batch(self, images: Sequence[ImageInput], k: int | None = None, *, depth: int | None = None,
                     mode: str | None = None, filter: Filter = None, offset: int = 0,
                     score_threshold: float | None = None, explain: bool = False,
                     collection: str | None = None) -> schemas.BatchSearchResponse:
        """Search by several images at once (one encoder pass): ``POST /v1/search/batch``; ``results[i]`` answers
        ``images[i]``. Arguments as ``search``."""
        return self._run(self.routes.search_batch(images, k, depth, mode, filter, offset, score_threshold, explain,
                                                  collection))

    def similar(self, image_id: int, k: int | None = None, *, depth: int | None = None, mode: str | None = None,
                filter: Filter = None, offset: int = 0, score_threshold: float | None = None, explain: bool = False,
                collection: str | None = None) -> schemas.SearchResponse:
        """"More like this": search by an indexed image's id (its stored tokens),
        ``GET /v1/images/{id}/similar``. Arguments as ``search``.

        Raises:
            NotFoundError: no image with that id (``code`` "image_not_found").
        """
        return self._run(self.routes.similar(image_id, k, depth, mode, filter, offset, score_threshold, explain,
                                             collection))

    def explain(self, image: ImageInput, image_id: int, *, collection: str | None = None) -> PairExplanation:
        """Why image ``image_id`` matches the query image, token by token with heatmaps: ``POST /v1/explain``."""
        return self._run(self.routes.explain(image, image_id, collection))

    # ------------------------------------------------------------------ images
    def image(self, image_id: int, *, collection: str | None = None) -> schemas.ImageInfo:
        """An indexed image's row (path, sha256, size, metadata): ``GET /v1/images/{id}``."""
        return self._run(self.routes.image(image_id, collection))

    def image_file(self, image_id: int, *, collection: str | None = None) -> bytes:
        """The image's file, as stored: ``GET /v1/images/{id}/file``."""
        return self._run(self.routes.image_file(image_id, collection))

    def thumbnail(self, image_id: int, size: int | None = None, *, format: str | None = None,
                  collection: str | None = None) -> bytes:
        """A JPEG (or ``format="webp"``) thumbnail ``size`` px on its longer side:
        ``GET /v1/images/{id}/thumbnail``."""
        return self._run(self.routes.thumbnail(image_id, size, format, collection))

    def images(self, filter: Filter = None, limit: int | None = None, offset: int = 0, *,
               collection: str | None = None) -> schemas.ImageList:
        """A page of the indexed images in id order (``total`` counts all that match ``filter``):
        ``GET /v1/images``."""
        return self._run(self.routes.images(filter, limit, offset, collection))

    def iter_images(self, filter: Filter = None, page_size: int = 500, *,
                    collection: str | None = None) -> Iterator[schemas.ImageRow]:
        """Every indexed image matching ``filter``, in id order, fetched ``page_size`` at a time (paged by id, so
        a listing of any length works while images are added).

        Example: ``paths = [row.path for row in regis.iter_images({"album": "trip"})]``
        """
        page = self.images(filter, page_size, collection=collection)
        while page.images:
            yield from page.images
            if len(page.images) < page_size:
                return
            page = self.images(calls.with_id_after(filter, page.images[-1].id), page_size, collection=collection)

    def update_metadata(self, image_id: int, metadata: dict, *, replace: bool = False, wait: bool | None = None,
                        collection: str | None = None) -> schemas.MetadataPatchResponse:
        """Change an image's metadata: a JSON merge patch ({"album": "trip", "old": None} sets one key and removes
        another), or the whole object with ``replace``: ``PATCH /v1/images/{id}`` (a write key)."""
        return self._run(self.routes.update_metadata(image_id, metadata, replace, wait, collection))

    def upload(self, images: Sequence[ImageInput], metadata: dict | list[dict] | None = None, *,
               wait: bool | None = None, collection: str | None = None) -> schemas.UploadResponse:
        """Add images (the same bytes again are the same image): ``POST /v1/images`` (a write key, a service
        with jobs). ``metadata``: one object for every image, or a list with one per image. ``state`` is "done"
        once they answer searches, else the job is still running (``wait_for_job(response.job_id)``)."""
        return self._run(self.routes.upload(images, metadata, wait, collection))

    def delete_image(self, image_id: int, *, wait: bool | None = None,
                     collection: str | None = None) -> schemas.DeleteResponse:
        """Remove an image from the index: ``DELETE /v1/images/{id}`` (a write key)."""
        return self._run(self.routes.delete_image(image_id, wait, collection))

    # ------------------------------------------------------------------ jobs
    def index_folder(self, folder: str = "", *, collection: str | None = None) -> JobInfo:
        """Queue an incremental build of ``folder`` (relative to the service's images root):
        ``POST /v1/jobs/index``; follow it with ``wait_for_job``."""
        return self._run(self.routes.index_folder(folder, collection))

    def job(self, job_id: str, *, collection: str | None = None) -> JobInfo:
        """A job's state, progress, result or error: ``GET /v1/jobs/{id}``."""
        return self._run(self.routes.job(job_id, collection))

    def jobs(self, limit: int | None = None, *, collection: str | None = None) -> schemas.JobList:
        """Recent jobs, newest first: ``GET /v1/jobs``."""
        return self._run(self.routes.jobs(limit, collection))

    def wait_for_job(self, job_id: str, timeout_s: float = 600.0, poll_s: float = 0.5, *,
                     collection: str | None = None) -> JobInfo:
        """Poll a job until it is done or failed; returns its last state.

        Raises:
            TimeoutError: still queued or running after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job(job_id, collection=collection)
            if info.state in FINISHED:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {info.state} after {timeout_s:.0f} s")
            self.sleep(poll_s)

    # ------------------------------------------------------------------ collections and health
    def collections(self) -> schemas.CollectionList:
        """Every collection (name, images, index version, backbone): ``GET /v1/collections``."""
        return self._run(self.routes.collections())

    def collection_info(self, name: str) -> schemas.CollectionInfo:
        """One collection: ``GET /v1/collections/{name}``."""
        return self._run(self.routes.collection_info(name))

    def create_collection(self, name: str, backbone: str | None = None, *, random_init: bool = False,
                          description: str = "", layout: str | None = None, frame: str | None = None,
                          query_layout: str | None = None) -> schemas.CollectionInfo:
        """Create an empty collection embedding with ``backbone`` (default efficientnet-lite0):
        ``POST /v1/collections`` (a write key).

        ``layout`` is how its index is stored, fixed when it is created: "default" (~4 KB per image at 256-d) or
        "compact" (~1.1-1.2 KB per image, lower recall; as ``regis index build --compact``, docs/SCALE.md section
        0); ``CollectionInfo.layout`` reports it. None sends no layout (the server's default, and what servers
        from before layouts accept).

        ``frame`` is how an image becomes the encoder's input: "center-crop" (the central square; the default for
        ViTs), "pad", "squash", "aspect" (CNNs: the whole image, aspect ratio kept; ViTs: pad) or
        "center-crop+aspect" (the default for CNNs: both framings' tokens per image, each image scored by its
        better one; twice the tokens and encoder time). ``query_layout`` is a query's tokens: "tokens" (the
        indexed ones) or "tokens+roi-cues" (CNNs with a ROI pass; the default for new CNN collections). The
        index records both and its queries use them; ``CollectionInfo.config`` reports them ("frame",
        "query_layout"). Each is sent only when not None (None: the backbone's default; servers from before
        them accept only that).

        Raises:
            UnprocessableError: 422, e.g. a layout, frame or query layout not offered (``invalid_request``, its
                message naming the field), an unknown backbone.
            ConflictError: 409, the collection exists already.
        """
        return self._run(self.routes.create_collection(name, backbone, random_init, description, layout,
                                                       frame=frame, query_layout=query_layout))

    def delete_collection(self, name: str) -> None:
        """Delete a collection and its index: ``DELETE /v1/collections/{name}`` (a write key)."""
        return self._run(self.routes.delete_collection(name))

    def health(self) -> schemas.Health:
        """Liveness: ``GET /healthz``."""
        return self._run(self.routes.health())

    def ready(self) -> schemas.Readiness:
        """Readiness, with what is missing: ``GET /readyz`` (503 answers are returned, not raised)."""
        response = self.http.get("/readyz")
        if response.status_code not in (200, 503):
            calls.raise_for_error(response)
        return schemas.Readiness.model_validate(response.json())
