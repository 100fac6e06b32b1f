"""``regis index build --ray``: a Ray Data pipeline from a folder to a sharded collection.

1. Plan (driver): scan the folder, compare it with what the shards hold (``ShardedWriter.records_by_path``), and
   hand out global ids to new files in scan order with the single-machine build's own planning
   (``indexer.build.plan_build``), so a fresh build gives every image the id a single-machine build gives it.
   Changed files keep their id; deleted ones are removed at the end (``indexer.build.finish_plan``).
2. Embed (Ray Data, in chunks of ``build_checkpoint_images``): ``from_items`` -> ``map_batches(decode)`` as CPU
   tasks (read, SHA-256, decode, transform: ``indexer.dataset.ImageFileDataset``) -> ``map_batches(Encode)`` in
   an actor pool (``build_encoder_actors`` actors, GPU when ``encoder_num_gpus`` > 0, ``build_batch_size``
   images per batch); the output order is preserved.
3. Write (driver): the token batches (and buddy patches) go to the shard writers as they stream in, with the
   single-machine build's table rows (``indexer.build.image_record``: user metadata, path facts, EXIF); at the
   end of each chunk every shard commits (a checkpoint). A killed build leaves each shard on a complete
   version; the next run plans from what the shards hold, so it embeds only what is missing, under the same
   ids: no duplicates, no losses.

Usage stats: the build runs with Ray's documented opt-out ``RAY_USAGE_STATS_ENABLED=0`` unless the environment
sets it (``=1`` opts in), as the nodes ``cluster.local`` starts (``--disable-usage-stats``) and a local
``ray.init()`` do. Otherwise a driver connected to a cluster starts Ray Data's usage collection, whose
``data-usage-metrics-poller`` thread queries Prometheus (``RAY_PROMETHEUS_HOST``, default localhost:9090) every
10 s for the rest of the process's life, with no way to stop it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cluster.settings import RaySettings
from indexer.build import finish_plan
from regis.errors import ConfigError
from regis.images.decode import DEFAULT_MAX_PIXELS
from regis.models.encoder import RegisEncoder
from regis.sharding.layout import read_layout
from regis.sharding.write import ShardedWriter

USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"


@dataclass
class RayBuildReport:
    """What a Ray build did (times in seconds; ``images_per_s``: embedded images over the embedding time)."""

    images_root: str
    collection: str
    num_shards: int
    scanned: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: list[dict] = field(default_factory=list)
    checkpoints: int = 0
    scan_s: float = 0.0
    embed_s: float = 0.0
    total_s: float = 0.0
    images_per_s: float = 0.0

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def decode_batch(batch: dict, config_json: str, max_pixels: int, draft: bool) -> dict:
    """Ray Data CPU task: read, hash, decode and transform a batch of files.

    Args:
        batch: {"abspath": (n,) str, ...} (other columns are passed through).

    Returns:
        The batch plus "ok" (n,) bool, "error" (n,) str, "sha256", "width", "height", "bytes", "exif" (JSON),
        and "pixels" (n, 3, H, W) float32 (zeros where decoding failed).
    """
    from indexer.dataset import ImageFileDataset
    from regis.models.encoder import EncoderConfig
    from regis.models.transforms import eval_transform

    config = EncoderConfig.model_validate_json(config_json)
    ds = ImageFileDataset([Path(p) for p in batch["abspath"]], eval_transform(config), max_pixels,
                          draft_size=config.resize_size if draft else None)
    items = [ds[i] for i in range(len(ds))]
    pixels = np.zeros((len(items), 3, config.image_size, config.image_size), dtype=np.float32)
    for i, it in enumerate(items):
        if it["tensor"] is not None:
            pixels[i] = it["tensor"].numpy()
    out = dict(batch)
    out.update({
        "ok": np.array([it["tensor"] is not None for it in items], dtype=bool),
        "error": np.array([it["error"] or "" for it in items], dtype=object),
        "sha256": np.array([it["sha256"] for it in items], dtype=object),
        "width": np.array([it["width"] for it in items], dtype=np.int64),
        "height": np.array([it["height"] for it in items], dtype=np.int64),
        "bytes": np.array([it["bytes"] for it in items], dtype=np.int64),
        "exif": np.array([json.dumps(it.get("exif") or {}) for it in items], dtype=object),
        "pixels": pixels,
    })
    return out


class Encode:
    """Ray Data actor: the encoder, rebuilt from the collection's encoder record and checked against it.

    Args:
        config_json, weights_json: the encoder's ``EncoderConfig`` and ``WeightsInfo`` as JSON.
        weights: weights path overriding a ``file:`` source.
        device: "cuda" when the actor has a GPU, else "cpu".
    """

    def __init__(self, config_json: str, weights_json: str, weights: str | None, device: str):
        from regis.models.encoder import EncoderConfig, WeightsInfo, encoder_from_manifest

        self.encoder = encoder_from_manifest(EncoderConfig.model_validate_json(config_json),
                                             WeightsInfo.model_validate_json(weights_json), weights, device)
        self.T, self.D = self.encoder.config.tokens_per_image, self.encoder.config.dim

    def __call__(self, batch: dict) -> dict:
        """Adds "tokens" (n, T, D) float32, "buddies" (n, R + 1) int64 and "grid" (n, 2) int64 (zeros where
        decoding failed: ``RegisEncoder.encode_with_buddies``, as the single-machine build) and drops "pixels"."""
        import torch

        ok = np.asarray(batch["ok"], dtype=bool)
        tokens = np.zeros((len(ok), self.T, self.D), dtype=np.float32)
        buddies = np.zeros((len(ok), self.encoder.config.buddies_per_image), dtype=np.int64)
        grid = np.zeros((len(ok), 2), dtype=np.int64)
        if ok.any():
            t, b, g = self.encoder.encode_with_buddies(torch.from_numpy(np.ascontiguousarray(batch["pixels"][ok])))
            tokens[ok], buddies[ok], grid[ok] = t.float().cpu().numpy(), b.cpu().numpy(), (int(g[0]), int(g[1]))
        out = {k: v for k, v in batch.items() if k != "pixels"}
        out.update(tokens=tokens, buddies=buddies, grid=grid)
        return out


def _plan(writer: ShardedWriter, root: Path, collection: Path, report: RayBuildReport,
          metadata: dict[str, dict] | None = None):
    """``indexer.build.plan_build`` over the shards' rows (the single-machine build's id planning): the plan,
    the rows it compared with, and the jobs as Ray Data items (gid, path, abspath, bytes, mtime, metadata JSON,
    new)."""
    from indexer.build import plan_build
    from indexer.scan import scan_folder
    from regis.indexes.uploads import is_upload_path

    entries = scan_folder(root, exclude=(collection,))
    managed = {p: r for p, r in writer.records_by_path().items() if not is_upload_path(p)}
    bp = plan_build(writer, entries, managed, metadata=metadata)
    jobs = [{"gid": int(i), "path": e.path, "abspath": str(e.abspath), "size": int(e.bytes), "mtime": float(e.mtime),
             "metadata": json.dumps(meta), "new": n < bp.num_new} for n, (e, i, meta) in enumerate(bp.jobs)]
    report.scanned = len(entries)
    report.unchanged = len(bp.plan.unchanged) + len(bp.touched)
    report.deleted = len(bp.plan.deleted)
    return bp, managed, jobs


def _embed_chunk(jobs: list[dict], encoder: RegisEncoder, settings: RaySettings, weights: str | None,
                 max_pixels: int, draft: bool):
    """The Ray Data pipeline of one chunk; yields numpy batches with "tokens"."""
    import ray

    from cluster.resources import build_cpus, cluster_cpus

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    gpu = settings.encoder_num_gpus > 0
    encoder_cpus, decode_cpus = build_cpus(settings, cluster_cpus()[0])
    config_json = encoder.config.model_dump_json()
    ds = ray.data.from_items(jobs, override_num_blocks=max(1, len(jobs) // settings.build_batch_size))
    ds = ds.map_batches(decode_batch, batch_size=settings.build_batch_size, batch_format="numpy",
                        num_cpus=decode_cpus,
                        fn_kwargs={"config_json": config_json, "max_pixels": max_pixels, "draft": draft})
    ds = ds.map_batches(Encode, batch_size=settings.build_batch_size, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=settings.build_encoder_actors),
                        num_cpus=0 if gpu else encoder_cpus,
                        num_gpus=settings.encoder_num_gpus if gpu else None,
                        fn_constructor_kwargs={"config_json": config_json,
                                               "weights_json": encoder.weights_info.model_dump_json(),
                                               "weights": weights, "device": "cuda" if gpu else "cpu"})
    yield from ds.iter_batches(batch_size=settings.build_batch_size, batch_format="numpy")


def build_ray(
    images_dir: Path | str,
    collection: Path | str,
    encoder: RegisEncoder,
    num_shards: int,
    settings: RaySettings | None = None,
    weights: str | None = None,
    faiss_spec: str | None = None,
    nprobe: int | None = None,
    token_store: str | None = None,
    depth: int | None = None,
    k_factor: int | None = None,
    faiss_codec: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    metadata: dict[str, dict] | None = None,
    on_event: Callable[[dict], None] | None = None,
) -> RayBuildReport:
    """Create or incrementally update the sharded collection ``collection`` from the images below ``images_dir``
    with Ray Data, on the Ray cluster this process is connected to (``cluster.connect.RayConnection``; a process
    that is not connected joins ``settings.address`` as ``ray.init`` does, without starting a local cluster).

    Args:
        images_dir: the folder to index (walked recursively).
        collection: the collection folder (created with ``num_shards`` shards if missing).
        encoder: the encoder (its config and weights record travel to the actors, which rebuild it).
        num_shards: S; must equal an existing collection's.
        settings: Ray settings (batch size, actors, checkpoint size, GPUs).
        weights: weights path for the actors when the encoder's source is a file that moved.
        faiss_spec, nprobe, token_store, depth, k_factor, faiss_codec: each shard's index options (as ``regis index
            build``).
        max_pixels: decompression-bomb limit per image, pixels.
        draft: JPEG draft decoding (as the single-machine build).
        metadata: user metadata rows by path relative to ``images_dir`` (``regis index build --metadata``; they
            win over sidecar files, as in the single-machine build).
        on_event: called with {"event": "batch", "done": n} after each written batch and {"event": "checkpoint",
            "n": i} after each checkpoint (progress; tests kill the build here).

    Returns:
        The build report.

    Raises:
        ConfigError: ``images_dir`` is not a folder, or a bad shard count.
        IndexMismatchError / IndexLockedError: as ``IndexWriter``, for any shard.
    """
    import ray

    settings = settings or RaySettings()
    root = Path(images_dir).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"image folder {root} does not exist or is not a directory")
    collection = Path(collection).expanduser().resolve()
    os.environ.setdefault(USAGE_STATS_ENV, "0")  # read by Ray Data when an execution starts (module docstring)
    if not ray.is_initialized():
        ray.init(address=settings.address, namespace=settings.namespace, log_to_driver=False)
    kwargs = dict(faiss_spec=faiss_spec, nprobe=nprobe, images_root=str(root), token_store=token_store, depth=depth,
                  k_factor=k_factor, faiss_codec=faiss_codec)
    t_total = time.perf_counter()
    report = RayBuildReport(images_root=str(root), collection=str(collection), num_shards=num_shards)
    writer = ShardedWriter(collection, num_shards, encoder.config, encoder.weights_info, **kwargs)
    try:
        bp, managed, jobs = _plan(writer, root, collection, report, metadata)
        report.scan_s = time.perf_counter() - t_total
        failed: set[int] = set()
        done = 0
        t_embed = time.perf_counter()
        step = settings.build_checkpoint_images
        planned_next = writer.next_id
        committed_next = read_layout(collection)["next_id"]
        for start in range(0, max(len(jobs), 1), step):
            chunk = jobs[start : start + step]
            for batch in _embed_chunk(chunk, encoder, settings, weights, max_pixels, draft) if chunk else ():
                _write_batch(writer, batch, report, failed)
                done += len(batch["gid"])
                if on_event:
                    on_event({"event": "batch", "done": done})
            if start + step >= len(jobs):  # the last chunk: deletions, touched rows, metadata changes
                finish_plan(writer, bp, managed, failed)
            new_gids = [j["gid"] for j in jobs[: start + step] if j["new"]]
            committed_next = max([committed_next, *(g + 1 for g in new_gids)])
            writer.commit(report.to_json(), next_id=committed_next)
            report.checkpoints += 1
            if on_event:
                on_event({"event": "checkpoint", "n": report.checkpoints})
            writer = ShardedWriter(collection, num_shards, encoder.config, encoder.weights_info, **kwargs)
            writer.reserve_until(planned_next)
        writer.abort()  # nothing left: release the locks
        report.embed_s = time.perf_counter() - t_embed
        embedded = [j for j in jobs if j["gid"] not in failed]
        report.added = sum(1 for j in embedded if j["new"])
        report.updated = len(embedded) - report.added
        report.images_per_s = len(embedded) / report.embed_s if report.embed_s > 0 and jobs else 0.0
        report.total_s = time.perf_counter() - t_total
        return report
    except BaseException:
        writer.abort()
        raise


def _write_batch(writer: ShardedWriter, batch: dict, report: RayBuildReport, failed: set[int]) -> None:
    """Put a batch's embedded files in the shards, with the single-machine build's rows
    (``indexer.build.image_record``); files that did not decode are reported and their ids kept in ``failed``."""
    from indexer.embed import image_record
    from indexer.scan import FileEntry

    ok = np.asarray(batch["ok"], dtype=bool)
    for i in np.flatnonzero(~ok):
        report.skipped.append({"path": str(batch["path"][i]), "reason": str(batch["error"][i])})
        failed.add(int(batch["gid"][i]))
    rows = np.flatnonzero(ok)
    records = [image_record(FileEntry(str(batch["path"][i]), Path(str(batch["abspath"][i])), int(batch["size"][i]),
                                      float(batch["mtime"][i])),
                            int(batch["gid"][i]), json.loads(str(batch["metadata"][i])),
                            {"sha256": str(batch["sha256"][i]), "width": int(batch["width"][i]),
                             "height": int(batch["height"][i]), "bytes": int(batch["bytes"][i]),
                             "exif": json.loads(str(batch["exif"][i]))})
               for i in rows]
    grid = tuple(int(v) for v in batch["grid"][rows[0]]) if len(rows) else None
    writer.put(records, np.asarray(batch["tokens"], dtype=np.float32)[rows],
               buddies=np.asarray(batch["buddies"])[rows] if len(rows) else None, grid=grid)
