"""The routes of the regis HTTP API as requests (``Call``: method, path, parameters, body, and how to read the
answer), shared by ``regis.client.Client`` and ``AsyncClient``, which only send them."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx

from regis.api.explain import PairExplanation
from regis.api.schemas import (
    BatchSearchResponse,
    CollectionInfo,
    CollectionList,
    DeleteResponse,
    Health,
    ImageInfo,
    ImageList,
    JobList,
    MetadataPatchResponse,
    SearchResponse,
    UploadResponse,
)
from regis.client.errors import error_for
from regis.jobs.model import JobInfo

# An image to send: a file path, its bytes, an open binary file, or a PIL image (sent as PNG).
ImageInput = str | os.PathLike | bytes | bytearray | BinaryIO | Any
# A metadata filter: the JSON object (regis.indexes.filters) or its text form ("album:trip").
Filter = dict | str | None


@dataclass
class Call:
    """One request and how to read its answer.

    Attributes:
        method, path: e.g. "POST", "/v1/search".
        params: query parameters (None values left out).
        json: a JSON body; files: multipart files [(field, (filename, bytes))]; data: multipart form fields.
        read: the successful response -> the result (a model, bytes or None).
    """

    method: str
    path: str
    params: dict = field(default_factory=dict)
    json: Any = None
    files: list | None = None
    data: dict | None = None
    read: Callable[[httpx.Response], Any] = lambda r: r.json()

    def request_kwargs(self) -> dict:
        """Keyword arguments of ``httpx.Client.request`` (after ``method`` and ``url``)."""
        out: dict = {"params": {k: _param(v) for k, v in self.params.items() if v is not None}}
        if self.json is not None:
            out["json"] = self.json
        if self.files is not None:
            out["files"] = self.files
        if self.data is not None:
            out["data"] = self.data
        return out


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def model(cls) -> Callable[[httpx.Response], Any]:
    """Read a JSON answer as pydantic model ``cls``."""
    return lambda r: cls.model_validate(r.json())


def content(r: httpx.Response) -> bytes:
    """Read an answer's bytes (image files, thumbnails)."""
    return r.content


def nothing(r: httpx.Response) -> None:
    """An answer without a body (204)."""
    return None


def raise_for_error(r: httpx.Response) -> None:
    """Raise the ``regis.client.errors`` exception of an error answer (status >= 400)."""
    if r.status_code < 400:
        return
    try:
        body = r.json()
    except ValueError:
        body = None
    raise error_for(r.status_code, body, r.text)


def image_part(image: ImageInput, name: str = "image") -> tuple[str, bytes]:
    """(filename, bytes) of an image to upload: read now, so that a retried request sends it again.

    Raises:
        TypeError: not a path, bytes, binary file or PIL image.
        OSError: the file cannot be read.
    """
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        return path.name, path.read_bytes()
    if isinstance(image, (bytes, bytearray)):
        return name, bytes(image)
    if hasattr(image, "read"):
        data = image.read()
        if not isinstance(data, bytes):
            raise TypeError("open image files in binary mode ('rb')")
        return Path(getattr(image, "name", name)).name or name, data
    if hasattr(image, "save") and hasattr(image, "size"):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return f"{name}.png", buf.getvalue()
    raise TypeError(f"an image is a path, bytes, a binary file or a PIL image, not {type(image).__name__}")


class Routes:
    """Builds the ``Call`` of every route; ``collection`` (None: the service's default collection) picks the
    routes under ``/v1/collections/{name}``."""

    def __init__(self, collection: str | None = None):
        self.collection = collection

    def prefix(self, collection: str | None = None) -> str:
        name = collection if collection is not None else self.collection
        return "/v1" if name is None else f"/v1/collections/{quote(name, safe='')}"

    @staticmethod
    def _search_params(k, depth, mode, filter, offset, score_threshold, explain) -> dict:
        return {"k": k, "depth": depth, "mode": mode, "filter": filter, "offset": offset or None,
                "score_threshold": score_threshold, "explain": explain or None}

    def search(self, image: ImageInput, k=None, depth=None, mode=None, filter: Filter = None, offset=None,
               score_threshold=None, explain=False, collection=None) -> Call:
        return Call("POST", f"{self.prefix(collection)}/search",
                    self._search_params(k, depth, mode, filter, offset, score_threshold, explain),
                    files=[("file", image_part(image, "query"))], read=model(SearchResponse))

    def search_batch(self, images: Sequence[ImageInput], k=None, depth=None, mode=None, filter: Filter = None,
                     offset=None, score_threshold=None, explain=False, collection=None) -> Call:
        files = [("files", image_part(im, f"query-{i}")) for i, im in enumerate(images)]
        return Call("POST", f"{self.prefix(collection)}/search/batch",
                    self._search_params(k, depth, mode, filter, offset, score_threshold, explain), files=files,
                    read=model(BatchSearchResponse))

    def similar(self, image_id: int, k=None, depth=None, mode=None, filter: Filter = None, offset=None,
                score_threshold=None, explain=False, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/images/{int(image_id)}/similar",
                    self._search_params(k, depth, mode, filter, offset, score_threshold, explain),
                    read=model(SearchResponse))

    def explain(self, image: ImageInput, image_id: int, collection=None) -> Call:
        return Call("POST", f"{self.prefix(collection)}/explain", files=[("file", image_part(image, "query"))],
                    data={"id": str(int(image_id))}, read=model(PairExplanation))

    def image(self, image_id: int, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/images/{int(image_id)}", read=model(ImageInfo))

    def image_file(self, image_id: int, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/images/{int(image_id)}/file", read=content)

    def thumbnail(self, image_id: int, size=None, format=None, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/images/{int(image_id)}/thumbnail",
                    {"size": size, "format": format}, read=content)

    def images(self, filter: Filter = None, limit=None, offset=None, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/images", {"filter": filter, "limit": limit,
                                                                  "offset": offset or None}, read=model(ImageList))

    def update_metadata(self, image_id: int, metadata: dict, replace=False, wait=None, collection=None) -> Call:
        return Call("PATCH", f"{self.prefix(collection)}/images/{int(image_id)}",
                    {"replace": replace or None, "wait": wait}, json={"metadata": metadata},
                    read=model(MetadataPatchResponse))

    def upload(self, images: Iterable[ImageInput], metadata=None, wait=None, collection=None) -> Call:
        files = [("files", image_part(im, f"image-{i}")) for i, im in enumerate(images)]
        data = {"metadata": json.dumps(metadata)} if metadata is not None else None
        return Call("POST", f"{self.prefix(collection)}/images", {"wait": wait}, files=files, data=data,
                    read=model(UploadResponse))

    def delete_image(self, image_id: int, wait=None, collection=None) -> Call:
        return Call("DELETE", f"{self.prefix(collection)}/images/{int(image_id)}", {"wait": wait},
                    read=model(DeleteResponse))

    def index_folder(self, folder: str = "", collection=None) -> Call:
        return Call("POST", f"{self.prefix(collection)}/jobs/index", json={"folder": folder}, read=model(JobInfo))

    def job(self, job_id: str, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/jobs/{quote(job_id, safe='')}", read=model(JobInfo))

    def jobs(self, limit=None, collection=None) -> Call:
        return Call("GET", f"{self.prefix(collection)}/jobs", {"limit": limit}, read=model(JobList))

    def collections(self) -> Call:
        return Call("GET", "/v1/collections", read=model(CollectionList))

    def collection_info(self, name: str) -> Call:
        return Call("GET", f"/v1/collections/{quote(name, safe='')}", read=model(CollectionInfo))

    def create_collection(self, name: str, backbone=None, random_init=False, description="", layout=None, *,
                          frame=None, query_layout=None) -> Call:
        body = {"name": name, "backbone": backbone, "random_init": random_init, "description": description}
        # each sent only when asked for: servers from before these fields refuse unknown ones
        for key, value in (("layout", layout), ("frame", frame), ("query_layout", query_layout)):
            if value is not None:
                body[key] = value
        return Call("POST", "/v1/collections", json=body, read=model(CollectionInfo))

    def delete_collection(self, name: str) -> Call:
        return Call("DELETE", f"/v1/collections/{quote(name, safe='')}", read=nothing)

    def health(self) -> Call:
        return Call("GET", "/healthz", read=model(Health))


def with_id_after(filter: Filter, last_id: int) -> dict:
    """``filter`` (dict or its text form) and ``id > last_id``: the next page of a keyset-paged listing."""
    from regis.indexes.filters import parse_filter

    where = parse_filter(filter) if isinstance(filter, str) else filter
    after = {"id": {"gt": int(last_id)}}
    if not where:
        return after
    options = {k: v for k, v in where.items() if k == "strict"}
    rest = {k: v for k, v in where.items() if k != "strict"}
    return {"and": [rest, after], **options} if rest else {**after, **options}


@dataclass(frozen=True)
class RetryPolicy:
    """When a 503 is retried: up to ``retries`` times, waiting the answer's ``Retry-After`` seconds or else
    ``backoff_s * 2**attempt``, at most ``max_backoff_s`` each time (seconds)."""

    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def delay(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying after ``response`` (attempt 0 = the first request), or None: no
        retry (not a 503, or the retries are spent)."""
        if response.status_code != 503 or attempt >= self.retries:
            return None
        try:
            after = float(response.headers.get("retry-after", ""))
        except ValueError:
            after = self.backoff_s * 2**attempt
        return max(0.0, min(after, self.max_backoff_s))


def auth_headers(api_key: str | None) -> dict:
    """The header that carries an API key (``Authorization: Bearer <key>``)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
