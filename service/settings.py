"""Service settings: environment variables prefixed ``REGIS_`` (or constructor arguments); bad values are refused."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from regis.settings_types import FrameName, QueryLayoutName, QueryRuntime, RedisPrefix, RedisURL, TorchDevice


class Settings(BaseSettings):
    """Configuration of the regis service.

    Attributes:
        index_dir: the index to serve (REGIS_INDEX_DIR): the default collection (default:
            ``collections_root/default_collection``).
        collections_root: the folder holding the named collections (REGIS_COLLECTIONS_ROOT; None: one index,
            no ``/v1/collections`` besides the default one). ``regis.indexes.collections``.
        default_collection: the name the routes without ``/collections/{name}`` answer for.
        api_keys_file: the API keys (REGIS_API_KEYS_FILE, ``regis keys create``); when set, every route but the
            health probes and the docs needs a key, and writes a write key (``service.auth``). A missing file
            means no valid key yet: every request is refused.
        cors_origins: origins allowed to call the API from a browser (REGIS_CORS_ORIGINS, a JSON list; empty:
            no CORS headers, the default).
        weights: weights path overriding the index manifest's file source (same checksum required).
        device: torch device for encoding and rerank.
        images_root: folder the index's relative paths resolve against (default: the manifest's).
        max_upload_bytes: largest accepted upload, bytes.
        max_pixels: largest accepted image, pixels (decompression-bomb guard).
        default_k, max_k: results per query by default and at most.
        default_depth, max_depth: candidate depth k' (FAISS neighbours per query token) by default (None: the index
            manifest's tuned default) and at most.
        torch_threads: torch intra-op threads (REGIS_TORCH_THREADS; None: ``resolved_torch_threads``' default:
            on a CPU with the ONNX Runtime query encoder, the cores ONNX Runtime's threads leave, at least 1, as
            torch then only runs the readout, the resize and the rerank; otherwise torch's default).
        query_threads: intra-op threads of each ONNX Runtime query session (REGIS_QUERY_THREADS; None: half the
            cores shared out between the encoder threads, at least 1: ``regis.models.inference.default_onnx_threads``;
            on the 2-core CPU 1 thread answered more requests/s than 2: docs/benchmarks/history.md, "Memory and
            sessions of the query copy").
        query_runtime: how CNN queries are encoded on CPU (REGIS_QUERY_RUNTIME, ``regis.models.inference``):
            "auto" (default: ONNX Runtime when ``onnxruntime`` is installed; BENCHMARKS.md section 6), "onnx"
            or "torch" (the folded torch copy). Either copy is checked against the encoder's tokens at start-up
            and falls back (onnx -> torch -> the encoder) with a warning when it differs or cannot be made.
        max_concurrent_decodes: image decodes running at once (uploads and searches); the others wait, so the
            memory of decoding images at the pixel limit stays bounded.
        thumbnail_cache_bytes: disk budget of each index's thumbnail cache, bytes (REGIS_THUMBNAIL_CACHE_BYTES;
            least recently used thumbnails are removed past it; 0: nothing cached). ``regis.indexes.thumbnails``.
        keep_alive_s: how long ``regis serve`` keeps an idle HTTP/1.1 connection open, seconds (REGIS_KEEP_ALIVE_S;
            uvicorn's ``timeout_keep_alive``). It must outlast the idle timeout of every client and proxy in front
            (httpx 5 s, nginx upstream and load balancers 60 s): then the client always closes an idle connection
            first and never sends a request into one the server is closing (issue 14, fault 11).

    Jobs, uploads and live updates (docs/DEPLOY.md):
        enable_jobs: accept index jobs, uploads and deletes, and start without an index (REGIS_ENABLE_JOBS).
        redis_url: Redis for the job queue, index-update notices and the query cache (None: jobs run in a
            thread of the API, no cache).
        redis_prefix: prefix of every Redis key, queue and channel of this deployment.
        uploads_dir: where uploaded images are stored (default: ``images_root/.uploads``, else
            ``index_dir/uploads``). ``images_root`` is also the only folder index jobs may read.
        backbone, random_init: the encoder when there is no index yet (with ``weights``; default: the
            offline efficientnet-lite0). An existing index must have been built with the same encoder.
        frame, query_layout: that encoder's frame and query layout (``EncoderConfig``; None: its defaults; a
            collection's config sets them). An existing index's manifest records its own, which queries use.
        job_retries: re-runs of a job whose worker died or failed unexpectedly (Redis queue).
        job_timeout_s: a job running longer is stopped, seconds.
        write_wait_s: how long POST /v1/images and DELETE /v1/images/{id} wait for their job before
            answering 202 with the job id, seconds.
        max_upload_files: images per POST /v1/images.
        cache_ttl_s: lifetime of cached search results in Redis, seconds (0: no cache).
        index_poll_s: how often the service also checks the index directory for a new version, seconds
            (besides the worker's pub/sub notice).
        build_batch_size, build_workers: embedded jobs: images per forward pass, decoding processes.
        lock_timeout_s: how long a job waits for another writer of the index, seconds.
        staging_grace_s: at start-up, staged uploads whose job the queue does not know are removed once this
            old, seconds (those of finished jobs at once).
        snapshots_dir: where POST /v1/collections/{name}/snapshots writes snapshot files, one folder per
            collection (REGIS_SNAPSHOTS_DIR; default ``collections_root/.snapshots``, else
            ``<index_dir>-snapshots`` beside the index).

    Dynamic batching (``service.batched``):
        batch_max_size: concurrent requests encoded in one forward pass and searched in one batched search at
            most (1: no batching, each request alone). 4 by default: on a CPU a bigger batch encodes slower per
            image (the activations leave the cache; docs/benchmarks/history.md, "Encoder throughput against
            batch size"); on a GPU raise it (32-256).
        batch_max_wait_ms: how long a batch waits for more requests after its first one, ms.
        batch_encode_workers: batched forward passes running at once, each in its own thread with
            ``resolved_torch_threads()`` torch threads (None there: the cores shared out between the workers).
    """

    model_config = SettingsConfigDict(env_prefix="REGIS_", extra="ignore")

    index_dir: Path | None = None  # filled in from collections_root when not given (never None after validation)
    collections_root: Path | None = None
    default_collection: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    api_keys_file: Path | None = None
    cors_origins: list[str] = Field(default_factory=list)
    weights: Path | None = None
    device: TorchDevice = "cpu"
    images_root: Path | None = None
    snapshots_dir: Path | None = None
    max_upload_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, le=1024**3)
    max_pixels: int = Field(default=64_000_000, ge=10_000)
    default_k: int = Field(default=10, ge=1, le=1000)
    max_k: int = Field(default=100, ge=1, le=1000)
    default_depth: int | None = Field(default=None, ge=1, le=4096)
    max_depth: int = Field(default=1024, ge=1, le=4096)
    torch_threads: int | None = Field(default=None, ge=1)
    query_runtime: QueryRuntime = "auto"
    query_threads: int | None = Field(default=None, ge=1)
    max_concurrent_decodes: int = Field(default=2, ge=1, le=64)
    keep_alive_s: float = Field(default=75.0, ge=1, le=3600)
    thumbnail_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    # jobs, uploads and live updates
    enable_jobs: bool = False
    redis_url: RedisURL | None = None
    redis_prefix: RedisPrefix = "regis"
    uploads_dir: Path | None = None
    backbone: str | None = None
    random_init: bool = False
    frame: FrameName | None = None
    query_layout: QueryLayoutName | None = None
    job_retries: int = Field(default=2, ge=0, le=20)
    job_timeout_s: int = Field(default=24 * 3600, ge=10)
    write_wait_s: float = Field(default=30.0, ge=0, le=600)
    max_upload_files: int = Field(default=32, ge=1, le=1000)
    cache_ttl_s: int = Field(default=300, ge=0, le=7 * 24 * 3600)
    index_poll_s: float = Field(default=2.0, ge=0.05, le=3600)
    build_batch_size: int = Field(default=32, ge=1, le=4096)
    build_workers: int | None = Field(default=0, ge=0, le=64)
    lock_timeout_s: float = Field(default=300.0, ge=0)
    staging_grace_s: float = Field(default=600.0, ge=0)
    # dynamic batching
    batch_max_size: int = Field(default=4, ge=1, le=1024)
    batch_max_wait_ms: float = Field(default=5.0, ge=0, le=10_000)
    batch_encode_workers: int = Field(default=1, ge=1, le=64)

    @field_validator("max_k")
    @classmethod
    def _max_k(cls, v: int, info) -> int:
        default = info.data.get("default_k", 10)
        if v < default:
            raise ValueError(f"max_k ({v}) must be >= default_k ({default})")
        return v

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _empty_keys_file(cls, v: object) -> object:
        return v or None  # REGIS_API_KEYS_FILE= (empty) turns keys off

    @field_validator("redis_url", mode="before")
    @classmethod
    def _empty_redis_url(cls, v: object) -> object:
        return v or None  # REGIS_REDIS_URL= (empty) means no Redis

    @model_validator(mode="after")
    def _default_index(self) -> Settings:
        if self.index_dir is None:
            if self.collections_root is None:
                raise ValueError("set index_dir (REGIS_INDEX_DIR) or collections_root (REGIS_COLLECTIONS_ROOT)")
            self.index_dir = self.collections_root / self.default_collection
        return self

    @model_validator(mode="after")
    def _encoder_choice(self) -> Settings:
        if self.random_init and self.weights is not None:
            raise ValueError("give either weights or random_init, not both")
        return self

    def resolved_query_threads(self) -> int:
        """Intra-op threads of each ONNX Runtime query session: ``query_threads``, else
        ``regis.models.inference.default_onnx_threads`` (half the cores shared out between the encoder threads)."""
        from regis.models.inference import default_onnx_threads

        return self.query_threads or default_onnx_threads(self.batch_encode_workers)

    def query_encoding(self) -> dict:
        """The query engine's ``query_runtime`` and ``query_threads`` (``QueryEngine``'s keyword arguments):
        each engine the service opens gets them, nothing is set for the process."""
        return {"query_runtime": self.query_runtime, "query_threads": self.resolved_query_threads()}

    def resolved_torch_threads(self) -> int | None:
        """Torch intra-op threads: ``torch_threads``, else, when queries are encoded by ONNX Runtime on a CPU
        (``device`` "cpu" and ``query_runtime`` "onnx", or "auto" with ``onnxruntime`` installed), the cores
        left by the ONNX Runtime threads of the encoder threads, at least 1 (2 cores: 1); else None (torch's
        default). On the 2-core AMD EPYC VM 1 torch thread beside 1 ONNX Runtime thread used less server CPU
        per request than torch's default of 2 (BENCHMARKS.md section 6). The ONNX Runtime copy is made for CNN
        encoders only: a ViT index served on a CPU with ``onnxruntime`` installed should set REGIS_TORCH_THREADS.
        """
        if self.torch_threads:
            return self.torch_threads
        from regis.models.inference import onnxruntime_available

        onnx = self.query_runtime == "onnx" or (self.query_runtime == "auto" and onnxruntime_available())
        if self.device != "cpu" or not onnx:
            return None
        cores = os.cpu_count() or 1
        return max(1, cores - self.resolved_query_threads() * self.batch_encode_workers)

    def resolved_uploads_dir(self) -> Path:
        """The uploads folder, default applied."""
        from regis.indexes.uploads import default_uploads_dir

        return self.uploads_dir or default_uploads_dir(self.index_dir, self.images_root)

    def resolved_snapshots_dir(self) -> Path:
        """The snapshots folder, default applied (see ``snapshots_dir``)."""
        if self.snapshots_dir is not None:
            return self.snapshots_dir
        if self.collections_root is not None:
            return self.collections_root / ".snapshots"
        return self.index_dir.with_name(f"{self.index_dir.name}-snapshots")
