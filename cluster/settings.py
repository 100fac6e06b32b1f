"""Settings of the Ray application: environment variables prefixed ``REGIS_RAY_`` (or constructor arguments);
bad values are refused."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RaySettings(BaseSettings):
    """Configuration of ``regis serve --ray`` and ``regis index build --ray``.

    Attributes:
        address: the Ray cluster to join ("auto": ``RAY_ADDRESS``, else the one ``ray start --head`` runs on this
            machine, else a new local cluster on 127.0.0.1 that stops with the command; empty or None: always a
            new local cluster; ``cluster.connect``).
        namespace: Ray namespace of the application.
        http_host, http_port: where Ray Serve's HTTP proxy listens.
        proxy_location: "EveryNode" (a proxy on every node: put a load balancer in front), "HeadOnly" (one
            proxy; several nodes on one machine), or "Disabled".
        app_name: the Serve application name (one per collection).
        encoder_placement: where queries are encoded: "deployment" (the ``Encoder`` deployment, its own replicas
            and GPUs: ``@serve.batch`` over the queries of every ingress replica), "ingress" (in each ingress
            replica, with ``regis serve``'s dynamic batching, ``REGIS_BATCH_*``: no hop for the query's pixels;
            the faster choice on CPUs, BENCHMARKS.md section 6), or "auto" (default: "deployment" when
            ``encoder_num_gpus`` > 0, else "ingress").
        shard_placement: where the shards are searched: "deployment" (one ``shard-NNN`` deployment per shard, its
            own replicas: calls from the ingress over Ray Serve), "ingress" (every shard opened in each ingress
            replica, searched in its process as ``regis serve`` searches a sharded collection: no call, no
            serialised tokens or results, no shard replicas; each ingress replica holds every shard in memory),
            or "auto" (default: "ingress" when the Ray cluster has one node, no shard setting asks for
            deployments (``shard_replicas`` 1, ``shard_num_cpus`` unset) and there is one ingress replica
            (``ingress_replicas`` 1: each ingress replica would hold every shard in memory again), else
            "deployment"; resolved by ``cluster.serve.start`` from the nodes alive then: BENCHMARKS.md section 6).
            The rule: ``shards_in_ingress``.
        encoder_replicas: encoder deployment replicas.
        encoder_num_cpus, encoder_num_gpus: resources per encoder replica (GPU > 0 encodes on CUDA in bf16).
            ``encoder_num_cpus``, ``shard_num_cpus``, ``ingress_num_cpus`` unset (None): sized from the cluster's
            CPUs so that every replica is scheduled (``cluster.resources``: 1, 0.5 and 0.25 where they fit, less
            on a small machine); ``regis index build --ray``: 1 CPU per encoder actor where it fits.
        max_batch_size: ``@serve.batch``: images per encoder forward pass (and queries per shard batch) at most.
        batch_wait_timeout_s: ``@serve.batch``: how long a batch waits for more requests, seconds.
        shard_replicas: replicas of each shard deployment.
        shard_num_cpus: CPUs per shard replica (None: sized, see above).
        ingress_replicas, ingress_num_cpus: the REST ingress (None: sized, see above).
        writer_num_cpus: the ``Writer`` deployment of ``regis serve --ray --enable-jobs`` (``cluster.writes``: one
            replica; None: sized, 0.1 CPU where everything fits).
        ingress_max_ongoing_requests, encoder_max_ongoing_requests, shard_max_ongoing_requests: Ray Serve's
            ``max_ongoing_requests`` of each replica of the ingress, the encoder and each shard deployment: requests
            a replica runs at once; more wait in front of it in Ray's proxy / request router, which then retries
            with a backoff of up to 1 s (``RequestRouter.backoff_sequence_s``) and leaves the replica idle between
            tries: Ray's own default, 5, let 8 clients saturate the one ingress, and with 64 the throughput at 128
            clients halved (14.5 against 29.0 req/s with 256; BENCHMARKS.md section 6). So set them at least to the
            concurrent requests expected per replica; an admitted request waiting costs the ingress little (its
            upload and a coroutine). Each is at least ``max_batch_size`` (else a ``@serve.batch`` could never
            fill); every query admitted by the ingress makes one encoder call and one search call per shard, so the
            defaults (256 each) admit downstream what the ingress admits.
        access_log: Ray Serve's access log of each HTTP request (one line at the proxy and one at the ingress,
            like ``regis serve``'s uvicorn at ``--log-level info``). The shard and encoder deployments never log
            their calls (one line per shard per batch, which Ray's log monitor then reads: CPU for nothing).
        shard_timeout_s: a shard that has not answered after this many seconds counts as missing.
        encoder_timeout_s: an encode that takes longer fails the request with 503, seconds.
        on_missing_shards: "error": answer 503 ``shards_unavailable`` when a shard is missing (never a silently
            incomplete ranking); "partial": answer 200 with the shards that answered, ``partial: true`` and
            ``missing_shards``.
        build_batch_size: ``index build --ray``: images per encoder batch (Ray Data ``map_batches``).
        build_encoder_actors: encoder actors of a build.
        build_decode_cpus: CPUs per decode task of a build (None: 1, or half the cluster's CPUs when it has fewer
            than 2).
        start_timeout_s: ``regis serve --ray``: a deployment whose replicas cannot be scheduled for this long fails
            the command with one line naming the setting to change, seconds.
        build_checkpoint_images: a build commits every shard after this many images (a killed build resumes
            from its last commit).
    """

    model_config = SettingsConfigDict(env_prefix="REGIS_RAY_", extra="ignore")

    address: str | None = "auto"
    namespace: str = "regis"
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8000, ge=1, le=65535)
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = "EveryNode"
    app_name: str = Field(default="regis", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    encoder_placement: Literal["auto", "ingress", "deployment"] = "auto"
    shard_placement: Literal["auto", "ingress", "deployment"] = "auto"
    encoder_replicas: int = Field(default=1, ge=1, le=1024)
    encoder_num_cpus: float | None = Field(default=None, ge=0, le=256)
    encoder_num_gpus: float = Field(default=0.0, ge=0, le=16)
    max_batch_size: int = Field(default=16, ge=1, le=1024)
    batch_wait_timeout_s: float = Field(default=0.005, ge=0, le=10)
    shard_replicas: int = Field(default=1, ge=1, le=1024)
    shard_num_cpus: float | None = Field(default=None, ge=0, le=256)
    ingress_replicas: int = Field(default=1, ge=1, le=1024)
    ingress_num_cpus: float | None = Field(default=None, ge=0, le=256)
    writer_num_cpus: float | None = Field(default=None, ge=0, le=256)
    ingress_max_ongoing_requests: int = Field(default=256, ge=1, le=100_000)
    encoder_max_ongoing_requests: int = Field(default=256, ge=1, le=100_000)
    shard_max_ongoing_requests: int = Field(default=256, ge=1, le=100_000)
    access_log: bool = True
    shard_timeout_s: float = Field(default=5.0, gt=0, le=600)
    encoder_timeout_s: float = Field(default=30.0, gt=0, le=600)
    on_missing_shards: Literal["error", "partial"] = "error"
    build_batch_size: int = Field(default=32, ge=1, le=4096)
    build_encoder_actors: int = Field(default=1, ge=1, le=1024)
    build_decode_cpus: float | None = Field(default=None, gt=0, le=64)
    build_checkpoint_images: int = Field(default=10_000, ge=1)
    start_timeout_s: float = Field(default=60.0, gt=0, le=3600)

    @field_validator("address", mode="before")
    @classmethod
    def _empty_address(cls, v: object) -> object:
        return v or None  # REGIS_RAY_ADDRESS= (empty): always a new local cluster (cluster.connect)

    @field_validator("encoder_num_cpus", "shard_num_cpus", "ingress_num_cpus", "writer_num_cpus", "build_decode_cpus",
                     mode="before")
    @classmethod
    def _empty_is_sized(cls, v: object) -> object:
        return None if v == "" else v  # REGIS_RAY_SHARD_NUM_CPUS= (empty): sized from the cluster

    @model_validator(mode="after")
    def _batches_can_fill(self) -> RaySettings:
        for name in ("ingress_max_ongoing_requests", "encoder_max_ongoing_requests", "shard_max_ongoing_requests"):
            if getattr(self, name) < self.max_batch_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least max_batch_size "
                                 f"({self.max_batch_size}), else a @serve.batch never fills; raise "
                                 f"REGIS_RAY_{name.upper()} or lower REGIS_RAY_MAX_BATCH_SIZE")
        return self

    def shards_in_ingress(self, nodes: int | None = None) -> bool:
        """Whether the shards are searched in the ingress, no shard deployment (``shard_placement``): the one
        rule every part of ``cluster.serve`` asks. "auto": only on one node, with one replica of each shard, no
        shard CPU request and one ingress replica (more ingress replicas, like ``--replicas`` 2 or more, keep one
        deployment per shard: every ingress replica would hold every shard in memory); it needs the number of alive
        nodes, ``nodes``: without it, "auto" means deployments, as for an application built for a cluster (KubeRay).

        Args:
            nodes: the Ray cluster's alive nodes (None: unknown)."""
        if self.shard_placement != "auto":
            return self.shard_placement == "ingress"
        return (nodes == 1 and self.shard_replicas == 1 and self.shard_num_cpus is None
                and self.ingress_replicas == 1)

    def with_shard_placement(self, nodes: int | None) -> RaySettings:
        """These settings with ``shard_placement`` resolved ("ingress" or "deployment", never "auto") for a
        cluster of ``nodes`` alive nodes (``shards_in_ingress``)."""
        return self.model_copy(update={"shard_placement": "ingress" if self.shards_in_ingress(nodes) else "deployment"})

    def shard_deployments(self, num_shards: int) -> int:
        """Shard deployments of a collection of ``num_shards`` shards: one per shard, or none when they are
        searched in the ingress (``shards_in_ingress`` with the placement as set: "auto" unresolved means
        deployments)."""
        return 0 if self.shards_in_ingress() else num_shards

    def encoder_in_ingress(self) -> bool:
        """Whether queries are encoded in the ingress (``encoder_placement``)."""
        return self.encoder_placement == "ingress" or (self.encoder_placement == "auto" and not self.encoder_num_gpus)
