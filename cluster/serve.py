"""``regis serve --ray``: a Ray Serve application over a sharded collection.

Deployments:

- ``Encoder``: the collection's encoder; ``@serve.batch`` groups concurrent queries into one forward pass (CUDA
  in bf16 when the replica has a GPU). Replicas: ``REGIS_RAY_ENCODER_REPLICAS``.
- ``Shard`` (one deployment per shard, ``shard-000`` ...): the shard's live index version (a new version is
  swapped in when the shard's CURRENT changes); ``@serve.batch`` runs concurrent queries with the same
  parameters as one batched search. Replicas: ``REGIS_RAY_SHARD_REPLICAS``.
- ``Ingress``: the REST API of ``regis serve`` (POST /v1/search with the same parameters and JSON errors,
  /healthz, /readyz): decodes the upload, encodes it once, fans the query tokens out to every shard and merges
  their exact MaxSim top-k (``regis.sharding.search.merge_top_k``). A shard that fails or does not answer
  within ``REGIS_RAY_SHARD_TIMEOUT_S`` makes the query a 503 ``shards_unavailable`` (default), or, with
  ``REGIS_RAY_ON_MISSING_SHARDS=partial``, a 200 with ``partial: true`` and ``missing_shards``: never a
  silently incomplete ranking.
"""

# No ``from __future__ import annotations``: Serve rebuilds the ingress routes from the class and needs the
# parameter annotations evaluated.
import asyncio
import logging
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from fastapi import FastAPI, File, Query, Request, UploadFile
from ray import serve

from cluster.common import collection_manifest
from cluster.schemas import ShardedSearchResponse
from cluster.settings import RaySettings
from regis.indexes.layout import read_current
from regis.retrieve.searcher import SearchResult
from regis.sharding.layout import read_layout, shard_dir
from regis.sharding.search import ShardSearcher, merge_top_k
from service.errors import APIError, install_error_handlers
from service.schemas import ErrorResponse
from service.settings import Settings

log = logging.getLogger("regis.cluster")


@serve.deployment
class Encoder:
    """The collection's encoder behind ``@serve.batch``.

    Args:
        collection: the sharded collection folder.
        settings: Ray settings (batch size and wait, GPUs).
        weights: weights path overriding the manifest's ``file:`` source.
    """

    def __init__(self, collection: str, settings: RaySettings, weights: str | None = None):
        import torch

        from regis.models.encoder import encoder_from_manifest

        m = collection_manifest(collection)
        device = "cuda" if settings.encoder_num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.encoder = encoder_from_manifest(m.encoder, m.weights, weights, device)
        self.encode.set_max_batch_size(settings.max_batch_size)
        self.encode.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        self.batch_sizes: list[int] = []

    def _forward(self, pixels: np.ndarray) -> np.ndarray:
        import torch

        return self.encoder.encode(torch.from_numpy(pixels)).float().cpu().numpy()

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def encode(self, pixels: list[np.ndarray]) -> list[np.ndarray]:
        """(3, H, W) float32 transformed images -> (T, D) float32 unit-norm tokens each; one forward pass."""
        self.batch_sizes.append(len(pixels))
        del self.batch_sizes[:-1000]
        tokens = await asyncio.to_thread(self._forward, np.stack(pixels))
        return list(tokens)

    def stats(self) -> dict:
        """{"batch_sizes": the sizes of the last (up to 1,000) forward passes}."""
        return {"batch_sizes": list(self.batch_sizes)}


@serve.deployment
class Shard:
    """One shard of the collection, answering in global ids with the table rows of its hits.

    Args:
        collection: the sharded collection folder.
        shard: the shard number.
        settings: Ray settings (batch size and wait).
    """

    def __init__(self, collection: str, shard: int, settings: RaySettings):
        self.collection = collection
        self.shard = shard
        self.searcher = ShardSearcher.open(collection, shard)
        self._lock = threading.Lock()
        self.search.set_max_batch_size(settings.max_batch_size)
        self.search.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)

    def _refresh(self) -> ShardSearcher:
        """The searcher over the shard's live version, swapped when CURRENT names a newer one."""
        path = shard_dir(self.collection, self.shard)
        current = read_current(path) if path.is_dir() else None
        searcher = self.searcher
        if current is not None and (searcher.searcher is None or searcher.searcher.snapshot.name != current):
            with self._lock:
                if self.searcher is searcher:
                    self.searcher = ShardSearcher.open(self.collection, self.shard)  # the old one is freed by GC
            searcher = self.searcher
        return searcher

    def _search_batch(self, requests: list[tuple[np.ndarray, tuple]]) -> list[dict]:
        searcher = self._refresh()
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (_, params) in enumerate(requests):
            groups[params].append(i)
        out: list = [None] * len(requests)
        for (k, depth, mode, nprobe), members in groups.items():
            try:
                results = searcher.search_batch(np.stack([requests[i][0] for i in members]), k=k, depth=depth,
                                                mode=mode, nprobe=nprobe)
            except Exception as exc:  # bad parameters: each request of the group gets the error
                for i in members:
                    out[i] = exc
                continue
            for i, r in zip(members, results, strict=True):
                records = searcher.records(r.ids)
                out[i] = {
                    "shard": self.shard, "version": searcher.version, "ids": r.ids.tolist(),
                    "scores": r.scores.tolist(), "num_candidates": r.num_candidates, "depth": r.depth,
                    "timings_ms": r.timings_ms,
                    "records": {int(g): {"path": rec.path, "width": rec.width, "height": rec.height,
                                         "metadata": rec.metadata} for g, rec in records.items()},
                }
        return out

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def search(self, requests: list[tuple[np.ndarray, tuple]]) -> list[dict]:
        """(tokens (m, D) float32, (k, depth, mode, nprobe)) -> {"shard", "version", "ids", "scores",
        "num_candidates", "depth", "timings_ms", "records"} (global ids)."""
        results = await asyncio.to_thread(self._search_batch, requests)
        return [r if not isinstance(r, Exception) else {"error": f"{type(r).__name__}: {r}"} for r in results]

    def version(self) -> int | None:
        """The shard's live version (health checks)."""
        return self._refresh().version


api = FastAPI(
    title="regis (Ray Serve)",
    description="Multi-vector image retrieval over a sharded collection: query by image, ranked by MaxSim.",
)
install_error_handlers(api)


@serve.deployment
@serve.ingress(api)
class Ingress:
    """The REST API: decode, encode once, fan out to every shard, merge.

    Args:
        service: the service settings (upload limits, k / depth limits; ``index_dir`` = the collection).
        settings: Ray settings (timeouts, missing-shard policy).
        encoder: handle of the ``Encoder`` deployment.
        *shards: handles of the shard deployments, in shard order.
    """

    def __init__(self, service: Settings, settings: RaySettings, encoder, *shards):
        from regis.models.transforms import eval_transform

        self.service = service
        self.settings = settings
        self.encoder = encoder
        self.shards = list(shards)
        self.config = collection_manifest(service.index_dir).encoder
        self.transform = eval_transform(self.config)
        self.num_shards = read_layout(service.index_dir)["num_shards"]
        if self.num_shards != len(self.shards):
            raise ValueError(f"{len(self.shards)} shard deployments for {self.num_shards} shards")

    def _decode(self, data: bytes) -> tuple[np.ndarray, float]:
        from regis.images.decode import decode_image

        t0 = time.perf_counter()
        decoded = decode_image(data, max_pixels=self.service.max_pixels, draft_size=self.config.resize_size)
        return self.transform(decoded.image).numpy(), (time.perf_counter() - t0) * 1e3

    async def _shard_call(self, s: int, tokens: np.ndarray, params: tuple) -> dict | None:
        try:
            out = await asyncio.wait_for(self._await(self.shards[s].search.remote((tokens, params))),
                                         self.settings.shard_timeout_s)
        except asyncio.TimeoutError:
            log.warning("shard %d did not answer within %.1f s", s, self.settings.shard_timeout_s)
            return None
        except Exception as exc:  # a replica died, the deployment is gone, ...
            log.warning("shard %d failed: %s", s, type(exc).__name__)
            return None
        if "error" in out:
            raise APIError(422, "invalid_parameter", out["error"].split(": ", 1)[-1])
        return out

    @staticmethod
    async def _await(response):
        return await response

    @api.post(
        "/v1/search",
        response_model=ShardedSearchResponse,
        responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
                   503: {"model": ErrorResponse}},
    )
    async def search(
        self,
        request: Request,
        file: Annotated[UploadFile, File(description="the query image (JPEG, PNG, WebP, BMP, TIFF, GIF)")],
        k: Annotated[int | None, Query(ge=1, le=1000, description="results to return")] = None,
        depth: Annotated[
            int | None, Query(ge=1, le=4096, description="candidates: FAISS neighbours per query token (k')")
        ] = None,
        mode: Annotated[Literal["ann", "exact"], Query(description="ann: candidates + rerank; exact: score all")
                        ] = "ann",
    ) -> dict:
        """Rank the collection's images by MaxSim similarity to the uploaded image (every shard)."""
        from service.routes.search import read_upload

        service = self.service
        k = k or service.default_k
        depth = depth or service.default_depth
        if k > service.max_k:
            raise APIError(422, "invalid_parameter", f"k must be <= {service.max_k}")
        if depth is not None and depth > service.max_depth:
            raise APIError(422, "invalid_parameter", f"depth must be <= {service.max_depth}")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > service.max_upload_bytes + 64 * 1024:
            raise APIError(413, "payload_too_large",
                           f"upload is larger than the limit of {service.max_upload_bytes:,} bytes")
        data = await read_upload(file, service.max_upload_bytes)
        t0 = time.perf_counter()
        pixels, decode_ms = await asyncio.to_thread(self._decode, data)
        t1 = time.perf_counter()
        try:
            tokens = await asyncio.wait_for(self._await(self.encoder.encode.remote(pixels)),
                                            self.settings.encoder_timeout_s)
        except Exception as exc:
            log.warning("encoder failed: %s", type(exc).__name__)
            raise APIError(503, "encoder_unavailable", "the encoder did not answer; retry later") from None
        t2 = time.perf_counter()
        params = (k, depth, mode, None)
        answers = await asyncio.gather(*(self._shard_call(s, tokens, params) for s in range(self.num_shards)))
        missing = [s for s, a in enumerate(answers) if a is None]
        if missing and (self.settings.on_missing_shards == "error" or len(missing) == self.num_shards):
            raise APIError(503, "shards_unavailable",
                           f"shards {missing} of {self.num_shards} did not answer within "
                           f"{self.settings.shard_timeout_s:g} s; retry later")
        got = [a for a in answers if a is not None]
        merged = merge_top_k([SearchResult(np.asarray(a["ids"], np.int64), np.asarray(a["scores"], np.float32),
                                           a["num_candidates"], a["timings_ms"], a["depth"]) for a in got], k)
        records = {int(g): r for a in got for g, r in a["records"].items()}
        hits = []
        for rank, (g, score) in enumerate(zip(merged.ids.tolist(), merged.scores.tolist(), strict=True), 1):
            rec = records.get(int(g), {})
            hits.append({"rank": rank, "id": int(g), "score": float(score), "path": rec.get("path"),
                         "width": rec.get("width"), "height": rec.get("height"),
                         "metadata": rec.get("metadata") or {}})
        versions = [a["version"] if a is not None else None for a in answers]
        return {
            "index_version": max(v for v in versions if v is not None) if any(v is not None for v in versions) else 0,
            "mode": mode, "k": k, "depth": merged.depth or depth or 0, "num_candidates": merged.num_candidates,
            "results": hits,
            "timings_ms": {"decode": decode_ms, "encode": (t2 - t1) * 1e3, **merged.timings_ms,
                           "total": (time.perf_counter() - t0) * 1e3},
            "partial": bool(missing), "missing_shards": missing, "shard_versions": versions,
        }

    @api.get("/healthz")
    async def healthz(self) -> dict:
        """Liveness: the ingress answers."""
        return {"status": "ok", "shards": self.num_shards}

    @api.get("/readyz")
    async def readyz(self):
        """Readiness: every shard answers with its version (503 ``not_ready`` otherwise)."""
        from fastapi.responses import JSONResponse

        from service.errors import error_body

        async def version(s):
            try:
                return await asyncio.wait_for(self._await(self.shards[s].version.remote()),
                                              self.settings.shard_timeout_s)
            except Exception:
                return "unavailable"

        versions = await asyncio.gather(*(version(s) for s in range(self.num_shards)))
        down = [s for s, v in enumerate(versions) if v == "unavailable"]
        body = {"ready": not down, "shard_versions": versions}
        if not down:
            return body
        return JSONResponse({**body, **error_body("not_ready", f"shards {down} unavailable")}, status_code=503)


def build_app(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None):
    """The Serve application: ``Ingress`` bound to the encoder and one deployment per shard.

    Raises:
        IndexFormatError: ``collection`` is not a sharded collection.
    """
    collection = str(Path(collection).resolve())
    layout = read_layout(collection)
    gpus = {"num_gpus": settings.encoder_num_gpus} if settings.encoder_num_gpus else {}
    encoder = Encoder.options(num_replicas=settings.encoder_replicas,
                              ray_actor_options={"num_cpus": settings.encoder_num_cpus, **gpus}
                              ).bind(collection, settings, weights)
    shards = [Shard.options(name=f"shard-{s:03d}", num_replicas=settings.shard_replicas,
                            ray_actor_options={"num_cpus": settings.shard_num_cpus}).bind(collection, s, settings)
              for s in range(layout["num_shards"])]
    service = service.model_copy(update={"index_dir": Path(collection)})
    return Ingress.options(num_replicas=settings.ingress_replicas,
                           ray_actor_options={"num_cpus": settings.ingress_num_cpus}
                           ).bind(service, settings, encoder, *shards)


def start(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None) -> str:
    """Connect to Ray (``settings.address``), start Serve's HTTP proxy and deploy the application.

    Returns:
        The base URL of the REST API.
    """
    import ray

    ray.init(address=settings.address, namespace=settings.namespace, ignore_reinit_error=True,
             log_to_driver=False)
    serve.start(proxy_location=settings.proxy_location,
                http_options={"host": settings.http_host, "port": settings.http_port})
    serve.run(build_app(collection, service, settings, weights), name=settings.app_name, route_prefix="/")
    return f"http://{settings.http_host}:{settings.http_port}"


def serve_forever(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None
                  ) -> None:
    """``start``, then block until interrupted; the application is deleted on the way out."""
    url = start(collection, service, settings, weights)
    log.warning("regis on Ray Serve: %s (Ctrl-C to stop)", url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(settings.app_name)


def app_from_args(args: dict):
    """Serve application builder for Serve config files and KubeRay (``import_path: cluster.serve:app_from_args``).

    Args:
        args: {"collection": the collection folder, "weights": optional weights path}; other service and Ray
            settings come from the REGIS_* and REGIS_RAY_* environment variables.
    """
    collection = Path(args["collection"])
    return build_app(collection, Settings(index_dir=collection), RaySettings(), args.get("weights"))
