"""``regis serve --ray``: a Ray Serve application over a sharded collection.

Deployments:

- ``Encoder``: the collection's encoder; ``@serve.batch`` groups concurrent queries into one forward pass (CUDA
  in bf16 when the replica has a GPU). Replicas: ``REGIS_RAY_ENCODER_REPLICAS``. The decorators' batch size and
  wait below are replaced at start-up by ``REGIS_RAY_MAX_BATCH_SIZE`` / ``REGIS_RAY_BATCH_WAIT_TIMEOUT_S``.
- ``Shard`` (one deployment per shard at start, ``shard-000`` ...): the shards' index versions
  (``regis.sharding.engine.LiveShards``): every call names the shard, its folder and the version the ingress
  serves (the collection record's, ``regis.sharding.layout``; the ingress's index watcher reads the record and
  moves every shard at once), so a query never mixes two writes; ``@serve.batch`` runs concurrent queries with the
  same version and parameters as one batched search. Shard ``s`` goes to deployment ``s % D``: a collection
  re-sharded while served (``regis.sharding.reshard``) is served by the deployments there are. Replicas:
  ``--replicas`` / ``REGIS_RAY_SHARD_REPLICAS``; a call whose replica dies is resent (``_RayCall``).
- Or no shard deployment at all (``REGIS_RAY_SHARD_PLACEMENT=ingress``, and "auto", the default, on a one-node
  cluster with no shard setting given and one ingress replica; ``RaySettings.shards_in_ingress``): each ingress
  replica opens every shard itself (``LocalShards``) and searches them in its own process, as ``regis serve``
  does a sharded collection: no Ray Serve call per shard, no tokens or results serialised, no shard replica
  process, the batch's queries in one batched search per shard (BENCHMARKS.md section 6).
- Requests in flight per replica: ``REGIS_RAY_{INGRESS,ENCODER,SHARD}_MAX_ONGOING_REQUESTS`` (Ray Serve's
  ``max_ongoing_requests``; docs/SCALE.md).
- ``Ingress``: the FastAPI app of ``regis serve`` itself (``service.app.create_app``: the same routes,
  parameters, errors, /docs, /metrics), started with a ``ShardedQueryEngine`` whose encoder is the ``Encoder``
  deployment (``RemoteEncoder``) and whose shards are the shard deployments (``RayShard``). The upload is decoded
  in the ingress, encoded once, fanned out to every shard; the exact top-k are merged
  (``regis.sharding.search.merge_top_k``). A shard that fails or does not answer within
  ``REGIS_RAY_SHARD_TIMEOUT_S`` makes the query a 503 ``shards_unavailable`` (default), or, with
  ``REGIS_RAY_ON_MISSING_SHARDS=partial``, a 200 with ``partial: true`` and ``missing_shards``: never a
  silently incomplete ranking. Explanations (``explain=true``, POST /v1/explain): the query is encoded with its
  buddy patches by ``Encoder.explain_encode`` (one image per call, outside the batch), each result is explained
  by its own shard deployment (``Shard.call("explain")``, from the shard's stored tokens and buddy patches).
- ``Writer`` (with ``REGIS_ENABLE_JOBS`` / ``--enable-jobs``, without Redis; ``cluster.writes``): the
  collection's one writer, running the job queue of ``regis serve`` (uploads, deletes, metadata changes, folder
  jobs), each job one collection version; the ingress reaches it through ``RayJobQueue``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from ray import serve

from cluster.local import replica_on_loopback
from cluster.resources import full_shares
from cluster.settings import RaySettings
from regis.errors import ConfigError, EncoderUnavailableError, ShardsUnavailableError
from regis.sharding.engine import LiveShards, ShardedQueryEngine, collection_encoder, shard_ref
from regis.sharding.layout import collection_manifest, read_layout, read_state
from service.settings import Settings

log = logging.getLogger("regis.cluster")
# what ``Shard.call`` runs besides search
SHARD_METHODS = frozenset({"records", "search_batch", "select", "tokens", "info", "explain", "stored_image",
                           "missing_fields", "field_names"})


def _wrapped(fn, *args):
    """("ok", value), or ("error", "ConfigError", message) for a bad request, or ("error", type, "") otherwise
    (exceptions do not travel: their text would reach clients, and Ray wraps them in its own types)."""
    try:
        return ("ok", fn(*args))
    except ConfigError as exc:
        return ("error", "ConfigError", str(exc))
    except Exception as exc:
        log.exception("shard call failed")
        return ("error", type(exc).__name__, "")


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

        from regis.models.inference import inference_copy

        replica_on_loopback()
        device = "cuda" if settings.encoder_num_gpus > 0 and torch.cuda.is_available() else "cpu"
        # the encoder itself encodes explained queries (buddy patches, patch tokens: as `regis serve`);
        # searches use the CPU inference copy `regis serve` encodes queries with (same tokens, less CPU)
        self.model = collection_encoder(collection, weights, device)
        self.encoder = inference_copy(self.model)
        self.encode.set_max_batch_size(settings.max_batch_size)
        self.encode.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        self.batch_sizes: list[int] = []

    def _forward(self, pixels: np.ndarray) -> np.ndarray:
        import torch

        return self.encoder.encode_query(torch.from_numpy(pixels)).float().cpu().numpy()

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def encode(self, pixels: list[np.ndarray]) -> list[np.ndarray]:
        """(3, H, W) float32 transformed query images -> (m, D) float32 unit-norm query tokens each
        (``RegisEncoder.encode_query``); one forward pass."""
        self.batch_sizes.append(len(pixels))
        del self.batch_sizes[:-1000]
        tokens = await asyncio.to_thread(self._forward, np.stack(pixels))
        return list(tokens)

    async def explain_encode(self, pixels: np.ndarray, with_patches: bool) -> tuple:
        """``regis.retrieve.explain.explain_encode`` of one (1, 3, H, W) float32 transformed image: tokens,
        buddy patches, grid and (with ``with_patches``) patch tokens, for explanations (not batched; in a
        thread, so the batched ``encode`` keeps running)."""
        import torch

        from regis.retrieve.explain import explain_encode

        return await asyncio.to_thread(explain_encode, self.model, torch.from_numpy(pixels), with_patches)

    def stats(self) -> dict:
        """{"batch_sizes": the sizes of the last (up to 1,000) forward passes}."""
        return {"batch_sizes": list(self.batch_sizes)}


@serve.deployment
class Shard:
    """The shards of the collection this deployment serves: ``ShardSearcher``'s methods on the shard and version
    each call names (``regis.sharding.engine.ShardRef``), in global ids. Deployment ``shard-NNN`` serves shard
    ``s`` of the state asked for when ``s % D == NNN`` (D deployments: one per shard at start; after an online
    re-sharding, some serve two shards), each shard folder opened once (``LiveShards``).

    Args:
        collection: the sharded collection folder.
        slot: the deployment's number NNN (its shard at start, opened now).
        settings: Ray settings (batch size and wait).
    """

    def __init__(self, collection: str, slot: int, settings: RaySettings):
        replica_on_loopback()
        self.live = LiveShards(collection)
        state = read_state(collection)
        if slot < state.num_shards:
            self.live.at(shard_ref(state, slot))
        self.search.set_max_batch_size(settings.max_batch_size)
        self.search.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)

    def _search_batch(self, requests: list[tuple]) -> list[tuple]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (ref, _, *params) in enumerate(requests):
            groups[json.dumps([dataclasses.astuple(ref), *params], sort_keys=True)].append(i)
        out: list = [None] * len(requests)
        for members in groups.values():
            ref, _, *params = requests[members[0]]
            queries = np.stack([requests[i][1] for i in members])
            answer = _wrapped(self.live.at, ref)
            if answer[0] == "ok":
                searcher = answer[1]
                answer = _wrapped(searcher.search_batch, queries, *params)
            if answer[0] == "ok":
                for r in answer[1]:  # the rows of its hits travel with the answer (no second call for them)
                    r.records = searcher.records(r.ids)
            for row, i in enumerate(members):
                out[i] = ("ok", answer[1][row]) if answer[0] == "ok" else answer
        return out

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def search(self, requests: list[tuple]) -> list[tuple]:
        """Requests (``ShardRef``, query (m, D) float32, k, depth, mode, nprobe, candidates, where) -> ``_wrapped``
        ``SearchResult`` each (global ids); requests for the same shard version with equal parameters run as one
        batched search."""
        return await asyncio.to_thread(self._search_batch, requests)

    def call(self, ref, method: str, *args) -> tuple:
        """``ShardSearcher.<method>(*args)`` on the shard and version ``ref`` names, for ``method`` in
        ``SHARD_METHODS`` (``_wrapped``)."""
        if method not in SHARD_METHODS:
            return ("error", "ConfigError", f"unknown shard method {method!r}")
        opened = _wrapped(self.live.at, ref)
        if opened[0] != "ok":
            return opened
        out = _wrapped(getattr(opened[1], method), *args)
        if method == "search_batch" and out[0] == "ok":
            for r in out[1]:  # the rows of its hits travel with the answer (no second call for them)
                r.records = opened[1].records(r.ids)
        return out


class _RayCall:
    """A shard call in flight; ``result()`` waits until the call's deadline. A call whose replica fails (it died,
    or Ray could not reach it) is sent again, to whichever replica Ray Serve's router picks then (another one,
    once it knows the failed one is gone), while the deadline allows: with 2 or more replicas a killed replica
    costs the requests it held a resend, not an error. Shard calls only read, so sending one twice is harmless.

    Args:
        send: starts the call, returns Ray Serve's response.
        shard: the shard number (messages).
        deadline: ``time.monotonic()`` past which the call counts as unanswered.
    """

    RESEND_PAUSES_S = (0.05, 0.2, 0.5, 1.0)

    def __init__(self, send, shard: int, deadline: float):
        self.send, self.shard, self.deadline = send, shard, deadline
        self.response = send()
        self.resent = 0

    def _wait(self):
        for pause in (*self.RESEND_PAUSES_S, None):
            try:
                return self.response.result(timeout_s=max(self.deadline - time.monotonic(), 0.001))
            except Exception as exc:  # a dead replica, a timeout, a deployment gone, ...
                if pause is None or _final(exc) or time.monotonic() + pause >= self.deadline:
                    log.warning("shard %d did not answer: %s", self.shard, type(exc).__name__)
                    raise ShardsUnavailableError(f"shard {self.shard} did not answer", [self.shard]) from None
                log.info("shard %d call failed (%s): sending it again", self.shard, type(exc).__name__)
                time.sleep(pause)
                self.resent += 1
                self.response = self.send()
        raise AssertionError("unreachable")

    def result(self):
        """The answer.

        Raises:
            ConfigError: the shard refused the parameters.
            ShardsUnavailableError: no replica answered before the deadline, or the shard failed otherwise.
        """
        out = self._wait()
        if out[0] == "ok":
            return out[1]
        if out[1] == "ConfigError":
            raise ConfigError(out[2])
        raise ShardsUnavailableError(f"shard {self.shard} failed ({out[1]})", [self.shard])


def _final(exc: Exception) -> bool:
    """Whether a failed Ray Serve ``result(timeout_s=...)`` is not worth resending: its time was up, or it was
    called on an event loop (a bug: Ray refuses that)."""
    return (isinstance(exc, TimeoutError) or type(exc).__name__ in ("GetTimeoutError", "TimeoutError")
            or (isinstance(exc, RuntimeError) and "event loop" in str(exc)))


class RayShard:
    """Shard client (``regis.sharding.engine``) over a shard deployment's handle; calls wait at most
    ``timeout_s`` seconds each, counted from when they are started (the fan-out waits once, not S times), and are
    resent when their replica fails (``_RayCall``)."""

    def __init__(self, handle, timeout_s: float):
        self.handle, self.timeout_s = handle, timeout_s

    def call(self, method: str, *args, ref) -> _RayCall:
        """Start ``method`` on the shard and version ``ref`` names (search through its ``@serve.batch``)."""
        deadline = time.monotonic() + self.timeout_s
        if method == "search":
            def send():
                return self.handle.search.remote((ref, *args))
        else:
            def send():
                return self.handle.call.remote(ref, method, *args)
        return _RayCall(send, ref.shard, deadline)


class RemoteEncoder:
    """The ``Encoder`` deployment with the interface ``QueryEngine`` uses of a ``RegisEncoder`` (``config``,
    ``encode_query``); each image goes to ``@serve.batch`` on its own, so concurrent requests share forward passes.

    Args:
        handle: the encoder deployment's handle.
        config: the collection's ``EncoderConfig``.
        timeout_s: how long an encode may take, seconds.
    """

    def __init__(self, handle, config, timeout_s: float):
        self.handle, self.config, self.timeout_s = handle, config, timeout_s

    def encode_query(self, pixels):
        """(B, 3, H, W) float32 tensor -> (B, m, D) float32 tensor of unit-norm query tokens
        (``RegisEncoder.encode_query``).

        Raises:
            EncoderUnavailableError: the deployment failed or did not answer in time.
        """
        import torch

        deadline = time.monotonic() + self.timeout_s
        responses = [self.handle.encode.remote(np.ascontiguousarray(p.numpy())) for p in pixels]
        try:
            out = [r.result(timeout_s=max(deadline - time.monotonic(), 0.001)) for r in responses]
        except Exception as exc:
            log.warning("encoder did not answer: %s", type(exc).__name__)
            raise EncoderUnavailableError("the encoder did not answer; retry later") from None
        return torch.from_numpy(np.stack(out))

    def explain_encode(self, pixels, with_patches: bool = False) -> tuple:
        """``regis.retrieve.explain.explain_encode`` on the deployment: (1, 3, H, W) float32 tensor -> tokens
        (T, D) float32, buddies (R + 1,) int64, grid (h, w), patches (h * w, D) float32 or None.

        Raises:
            EncoderUnavailableError: the deployment failed or did not answer in time.
        """
        response = self.handle.explain_encode.remote(np.ascontiguousarray(pixels.numpy()), with_patches)
        try:
            return response.result(timeout_s=self.timeout_s)
        except Exception as exc:
            log.warning("encoder did not answer: %s", type(exc).__name__)
            raise EncoderUnavailableError("the encoder did not answer; retry later") from None


def _ray_live(service: Settings, engine: ShardedQueryEngine):
    """The ingress's ``LiveIndex``: the Ray engine, refreshed by the index watcher (shard versions), and a
    readiness check that every shard answers."""
    from service.live import LiveIndex

    class RayLive(LiveIndex):
        def load(self) -> None:
            self.engine, self.encoder = engine, engine.encoder

        def readiness(self) -> dict:
            """{"shards": "ok"} when every shard answers its info call now, else which do not (the engine's
            shard states and image counts are refreshed on the way: /readyz reports them)."""
            self.engine.refresh()
            missing = [i["shard"] for i in self.engine.infos if i["state"] != "ok"]
            if missing:
                return {"shards": f"shards {missing} of {self.engine.num_shards} did not answer"}
            return {"shards": "ok"}

        def close(self) -> None:
            self.engine.close()  # local shards (shard_placement "ingress"): their open snapshots; else nothing

    live = RayLive(service)
    live.load()
    return live


def _ingress_start(service: Settings, settings: RaySettings, encoder, shards: list, writer=None,
                   weights: str | None = None):
    """The ``create_app`` start-up of the ingress: the Ray engine, a registry of the one collection, the index
    watcher, and the job queue: the ``Writer`` deployment's (``cluster.writes``), the Redis queue with
    ``REGIS_REDIS_URL``, none for a read-only service (writes answer 403 ``jobs_disabled``, as ``regis serve``).
    ``encoder`` None: queries are encoded here (``RaySettings.encoder_placement``), through ``regis serve``'s
    dynamic batching (``service.batched``; the batch's searches go to each shard as one call)."""

    def start(app) -> None:
        from service.app import clean_staging
        from service.collections import CollectionRegistry
        from service.live import IndexWatcher

        manifest = collection_manifest(service.index_dir)
        if not settings.shards_in_ingress():
            clients = [RayShard(h, settings.shard_timeout_s) for h in shards]
        else:  # every shard searched here (shard_placement "ingress")
            from regis.sharding.engine import LocalShards

            clients = [LocalShards(service.index_dir, service.device)]
        common = dict(max_pixels=service.max_pixels, on_missing=settings.on_missing_shards,
                      refresh=False)  # no blocking call on the event loop: the watcher's first poll fills versions
        if encoder is None:
            from regis.retrieve.query import set_torch_threads

            set_torch_threads(service.resolved_torch_threads())
            engine = ShardedQueryEngine(collection_encoder(service.index_dir, weights, service.device), clients,
                                        service.index_dir, manifest, device=service.device,
                                        **service.query_encoding(), **common)
            if service.batch_max_size > 1:
                from service.batched import BatchedSearch

                app.state.batched = BatchedSearch(service.batch_max_size, service.batch_max_wait_ms,
                                                  service.batch_encode_workers, service.resolved_torch_threads())
                app.state.batched.warm_up(engine)
        else:
            engine = ShardedQueryEngine(RemoteEncoder(encoder, manifest.encoder, settings.encoder_timeout_s),
                                        clients, service.index_dir, manifest, **common)
        live = _ray_live(service, engine)
        app.state.live = live
        if service.enable_jobs and service.redis_url:
            from service.jobs import make_job_queue

            app.state.jobs = make_job_queue(service, live)
        elif service.enable_jobs and writer is not None:
            from cluster.writes import RayJobQueue

            app.state.jobs = RayJobQueue(writer)
        app.state.collections = CollectionRegistry(service, live, app.state.jobs)
        if app.state.jobs is not None:
            clean_staging(app.state.collections, app.state.jobs)
        app.state.watcher = IndexWatcher(live, service.index_poll_s).start()

    return start


@serve.deployment
@serve.ingress()
class Ingress:
    """The REST API of ``regis serve`` (``service.app.create_app``) over the encoder and shard deployments.

    Args:
        service: the service settings (upload limits, k / depth limits; ``index_dir`` = the collection).
        settings: Ray settings (timeouts, missing-shard policy).
        weights: weights path overriding the manifest's ``file:`` source (an encoder in the ingress).
        encoder: handle of the ``Encoder`` deployment, or None: queries are encoded in the ingress.
        writer: handle of the ``Writer`` deployment (``cluster.writes``), or None (read-only, or Redis jobs).
        *shards: handles of the shard deployments, in order (shard ``s`` goes to ``shards[s % len(shards)]``);
            none when the shards are searched in the ingress (``settings.shard_placement`` "ingress").

    Raises:
        ValueError: no shard deployment, and the shards are not searched in the ingress.
    """

    def __init__(self, service: Settings, settings: RaySettings, weights: str | None, encoder, writer, *shards):
        replica_on_loopback()
        if not shards and not settings.shards_in_ingress():
            raise ValueError("the ingress needs at least one shard deployment (or REGIS_RAY_SHARD_PLACEMENT=ingress)")
        self.service, self.settings, self.weights = service, settings, weights
        self.encoder, self.writer, self.shards = encoder, writer, list(shards)

    def __serve_build_asgi_app__(self):
        from service.app import create_app

        return create_app(self.service, start=_ingress_start(self.service, self.settings, self.encoder,
                                                            self.shards, self.writer, self.weights))


def build_app(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None):
    """The Serve application: ``Ingress`` bound to the encoder and one deployment per shard (none when
    ``settings.shard_placement`` is "ingress"; "auto" here means deployments: ``start`` resolves it from the
    cluster first), each with its replicas, CPUs (GPUs) and ``max_ongoing_requests`` from ``settings`` (never Ray's
    default of 5 in flight; a CPU request left unset: its full share, ``cluster.resources.FULL_SHARE``; ``start``
    sizes them first).

    Raises:
        IndexFormatError: ``collection`` is not a sharded collection.
    """
    collection = str(Path(collection).resolve())
    layout = read_layout(collection)
    gpus = {"num_gpus": settings.encoder_num_gpus} if settings.encoder_num_gpus else {}
    cpus = {"encoder": settings.encoder_num_cpus, "shard": settings.shard_num_cpus,
            "ingress": settings.ingress_num_cpus, "writer": settings.writer_num_cpus}
    shares = full_shares(settings)
    cpus = {role: (value if value is not None else shares[role]) for role, value in cpus.items()}
    quiet = {"enable_access_log": False}  # internal calls: no access log line each (settings.access_log)
    encoder = None
    if not settings.encoder_in_ingress():
        encoder = Encoder.options(num_replicas=settings.encoder_replicas,
                                  max_ongoing_requests=settings.encoder_max_ongoing_requests,
                                  ray_actor_options={"num_cpus": cpus["encoder"], **gpus}, logging_config=quiet
                                  ).bind(collection, settings, weights)
    shards = [Shard.options(name=f"shard-{s:03d}", num_replicas=settings.shard_replicas,
                            max_ongoing_requests=settings.shard_max_ongoing_requests,
                            ray_actor_options={"num_cpus": cpus["shard"]}, logging_config=quiet
                            ).bind(collection, s, settings)
              for s in range(settings.shard_deployments(layout["num_shards"]))]
    service = service.model_copy(update={"index_dir": Path(collection)})
    writer = None
    if needs_writer(service):
        from cluster.writes import Writer

        writer = Writer.options(ray_actor_options={"num_cpus": cpus["writer"]}).bind(service, weights)
    return Ingress.options(num_replicas=settings.ingress_replicas,
                           max_ongoing_requests=settings.ingress_max_ongoing_requests,
                           ray_actor_options={"num_cpus": cpus["ingress"]},
                           logging_config={"enable_access_log": settings.access_log}
                           ).bind(service, settings, weights, encoder, writer, *shards)


def needs_writer(service: Settings) -> bool:
    """Whether the application has a ``Writer`` deployment: it takes writes, and not through Redis."""
    return bool(service.enable_jobs and not service.redis_url)


def http_options(service: Settings, settings: RaySettings) -> dict:
    """Ray Serve's HTTP proxy options: where it listens, and its idle keep-alive (``REGIS_KEEP_ALIVE_S``, whole
    seconds rounded up, as for ``regis serve``: it must outlast every client's and proxy's idle timeout; older Ray
    releases default to uvicorn's 5 s, the same as httpx's keep-alive expiry: docs/DEPLOY.md, fault 11)."""
    return {"host": settings.http_host, "port": settings.http_port,
            "keep_alive_timeout_s": math.ceil(service.keep_alive_s)}


class _ServeStartedHere(logging.Filter):
    """Drops Ray Serve's "Connecting to existing Serve app in namespace "serve". New
    http_options/controller_options will not be applied." while ``serve.run_many`` deploys right after ``start``'s
    own ``serve.start``: ``run_many`` always calls Ray's internal ``serve_start`` again, without options
    (ray/serve/api.py ``_run_many``, Ray 2.60), which logs this line whenever a controller exists, and it does,
    since ``serve.start`` has just created it with the options. Nothing is ignored then. Ray Serve has no public way
    to give ``run_many`` the HTTP options, and calling it first would start Serve with its defaults (port 8000,
    proxies on every node) and make ``serve.start`` the call whose options are ignored. A Serve instance that was
    already running before ``start`` is still reported: by ``serve.start``, outside this filter."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will not be applied" not in record.getMessage()


def start(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None,
          say=None) -> str:
    """Deploy the application on the Ray cluster this process is connected to (else ``ray.init`` with
    ``settings.address``, as Ray does: ``cluster.connect`` starts a local cluster when there is none), with the
    CPU requests left unset sized from the cluster (``cluster.resources``) and the shards' placement resolved from
    its nodes (``RaySettings.shards_in_ingress``: in the ingress on a one-node cluster by default), and wait until
    it runs.

    Args:
        say: prints a line for the user (default: the log).

    Returns:
        The base URL of the REST API.

    Raises:
        ConfigError: a deployment could not be scheduled within ``settings.start_timeout_s`` or failed to start
            (one line naming the setting to change; ``wait_until_running``).
    """
    import ray

    from cluster.resources import cluster_cpus, size_requests, sized_settings

    say = say or log.warning
    if not ray.is_initialized():
        ray.init(address=settings.address, namespace=settings.namespace, log_to_driver=False)
    num_shards = read_layout(collection)["num_shards"]
    nodes, free = cluster_cpus()
    settings = settings.with_shard_placement(len(nodes))
    local = settings.shards_in_ingress()
    sizing = size_requests(settings, settings.shard_deployments(num_shards), nodes, free, writer=needs_writer(service))
    settings = sized_settings(settings, sizing)
    encoders = "encoder in the ingress" if settings.encoder_in_ingress() else f"{settings.encoder_replicas} encoder(s)"
    shards = (f"{num_shards} shard(s) searched in the ingress" if local
              else f"{num_shards} shard(s) x {settings.shard_replicas} replica(s)")
    say(f"regis: deploying {shards}, {encoders}, "
        f"{settings.ingress_replicas} ingress: {sizing.describe()}"
        + ("" if sizing.fits else " (more than the cluster has free: waiting for resources)"))
    serve.start(proxy_location=settings.proxy_location, http_options=http_options(service, settings),
                logging_config={"enable_access_log": settings.access_log})
    serve_log, quiet = logging.getLogger("ray.serve"), _ServeStartedHere()  # Ray Serve's SERVE_LOGGER_NAME
    serve_log.addFilter(quiet)
    try:
        serve.run_many([serve.RunTarget(build_app(collection, service, settings, weights), name=settings.app_name,
                                        route_prefix="/")],
                       wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    finally:
        serve_log.removeFilter(quiet)
    wait_until_running(settings.app_name, sizing.cpus, settings.start_timeout_s, say=say)
    return f"http://{settings.http_host}:{settings.http_port}"


_ROLE_OF = {"Encoder": "encoder", "Ingress": "ingress", "Writer": "writer"}  # shard-NNN: "shard"


def _role(deployment: str) -> str:
    return _ROLE_OF.get(deployment, "shard")


def pending_cpu_demands() -> list[float]:
    """The CPU requests of the actors and tasks Ray cannot place now (the autoscaler's pending demand, what
    ``ray status`` lists under "Pending"), one entry per waiting bundle."""
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    return [float(r.bundle.get("CPU", 0.0)) for d in status.resource_demands.ray_task_actor_demand
            for r in d.bundles_by_count for _ in range(r.count)]


def unschedulable(deployment: str, cpus: float, free: float, waited_s: float) -> str:
    """The one line of a deployment whose replicas Ray cannot place."""
    from cluster.resources import SETTING

    return (f"Ray could not schedule deployment {deployment} within {waited_s:.0f} s (each replica asks for "
            f"{cpus:g} CPU, the cluster has {free:g} free): lower {SETTING[_role(deployment)]} (or leave it unset: "
            "regis sizes it from the cluster), run fewer replicas, or add nodes")


def _failed(deployment: str, message: str) -> str:
    """The one line of a deployment that failed to start: its last line of error (not the traceback)."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    return f"Ray Serve could not start deployment {deployment}: {(lines[-1] if lines else 'no message')[:300]}"


def wait_until_running(app_name: str, cpus: dict[str, float], timeout_s: float, poll_s: float = 1.0, say=None,
                       status=None, pending=None, free=None, clock=time.monotonic, sleep=time.sleep) -> None:
    """Wait until the Serve application ``app_name`` runs.

    Args:
        cpus: the CPU request of each role's replicas ("encoder", "shard", "ingress").
        timeout_s: after this many seconds, a deployment that is not running and whose CPU request is among
            the demands Ray cannot place (``pending_cpu_demands``) fails the wait. (Ray Serve's own status says
            "taken more than 30s to be scheduled" also while a replica's worker process is still starting, which
            on 2 busy cores can take that long: not a resource problem.)
        say: prints progress lines (every 30 s of waiting).
        status, pending, free, clock, sleep: ``serve.status``, ``pending_cpu_demands``, the CPUs free
            (``ray.available_resources``), ``time.monotonic``, ``time.sleep`` (tests replace them).

    Raises:
        ConfigError: a deployment could not be scheduled in time (``unschedulable``) or failed to start.
    """
    import ray

    status = status or serve.status
    pending = pending or pending_cpu_demands
    free = free or (lambda: float(ray.available_resources().get("CPU", 0.0)))
    t0 = said = clock()
    while True:
        app = status().applications.get(app_name)
        waited = clock() - t0
        if app is not None:
            if str(app.status).endswith("RUNNING"):
                return
            for name, d in app.deployments.items():
                if str(d.status).endswith("DEPLOY_FAILED"):
                    raise ConfigError(_failed(name, d.message))
            if str(app.status).endswith("DEPLOY_FAILED"):
                raise ConfigError(_failed(app_name, app.message))
            waiting = sorted(n for n, d in app.deployments.items() if not str(d.status).endswith("HEALTHY"))
            if waited >= timeout_s and waiting:
                demands = pending()
                for name in waiting:
                    need = cpus[_role(name)]
                    if any(abs(need - d) < 1e-6 for d in demands):
                        raise ConfigError(unschedulable(name, need, round(free(), 4), waited))
            if say is not None and clock() - said >= 30:
                said = clock()
                say(f"regis: still starting after {waited:.0f} s: {', '.join(waiting) or app_name}")
        sleep(poll_s)


def serve_forever(collection: Path | str, service: Settings, settings: RaySettings, weights: str | None = None,
                  say=None, delete_app: bool = True) -> None:
    """``start``, print where it serves, then block until SIGINT (Ctrl-C) or SIGTERM.

    Args:
        delete_app: delete the application on the way out (a cluster that was joined keeps running); False when
            the whole cluster stops with the command (``cluster.connect``'s local cluster), which ends it anyway.
    """
    import signal

    say = say or log.warning

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        url = start(collection, service, settings, weights, say=say)
        say(f"regis on Ray Serve: {url} (Ctrl-C to stop)")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        say("regis: stopping")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up is not interrupted by a second SIGTERM
        try:
            if delete_app:
                serve.delete(settings.app_name)
        except Exception:  # the cluster may be gone already
            log.warning("could not delete the Serve application %s", settings.app_name)
        finally:
            signal.signal(signal.SIGTERM, previous)


def app_from_args(args: dict):
    """Serve application builder for Serve config files and KubeRay (``import_path: cluster.serve:app_from_args``).

    Args:
        args: {"collection": the collection folder, "weights": optional weights path}; other service and Ray
            settings come from the REGIS_* and REGIS_RAY_* environment variables.
    """
    collection = Path(args["collection"])
    return build_app(collection, Settings(index_dir=collection), RaySettings(), args.get("weights"))
