"""``regis index build`` and ``regis index info``."""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.options import (
    Backbone,
    CollectionsRootOpt,
    CueMethod,
    Device,
    Frame,
    QueryLayout,
    RandomInit,
    RoiImageSize,
    RoiSize,
    Weights,
)

if TYPE_CHECKING:
    from indexer.build import BuildReport

app = typer.Typer(help="Build and inspect indexes.", no_args_is_help=True)


@app.command("build")
def build(
    images_dir: Annotated[Path, typer.Argument(help="Folder of images (walked recursively).")],
    index: Annotated[
        Path | None, typer.Option("--index", "-i", help="Index directory (created or updated).")
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", "-c", help="Collection to build into (created if missing), "
                                                            "under --root / REGIS_COLLECTIONS_ROOT.")
    ] = None,
    root: CollectionsRootOpt = None,
    replace: Annotated[
        bool, typer.Option("--replace", "--prune", help="The folder replaces every folder indexed before (their "
                                                       "images are deleted; uploads stay). Default: only images "
                                                       "below this folder are added, updated or deleted.")
    ] = False,
    backbone: Backbone = None,
    weights: Weights = None,
    random_init: RandomInit = False,
    roi_size: RoiSize = None,
    cue_method: CueMethod = None,
    roi_image_size: RoiImageSize = None,
    frame: Frame = None,
    query_layout: QueryLayout = None,
    device: Device = "cpu",
    faiss_index: Annotated[
        str | None, typer.Option("--faiss-index", help="FAISS factory spec (e.g. Flat, IVF1024,SQ8); default by size.")
    ] = None,
    nprobe: Annotated[int | None, typer.Option("--nprobe", help="Default IVF lists probed per query token.")] = None,
    depth: Annotated[
        int | None, typer.Option("--depth", help="Default candidates per query token (k'); default: tuned by spec.")
    ] = None,
    candidates: Annotated[
        str | None,
        typer.Option("--candidates", help="Candidate method recorded in the index: bounded (default) or depth."),
    ] = None,
    token_store: Annotated[
        str | None,
        typer.Option("--token-store", help="Rerank store: SQ4 codes re-scored on float16 (default for new "
                                           "indexes), float16, pq, or a FAISS codec spec."),
    ] = None,
    compact: Annotated[
        bool,
        typer.Option("--compact", help="The compact layout: ~1.2 KB resident per image at 256-d instead of ~4 KB, "
                                       "lower recall (docs/SCALE.md section 0); same as --faiss-codec compact "
                                       "--token-store compact."),
    ] = False,
    faiss_codec: Annotated[
        str | None,
        typer.Option("--faiss-codec", help="IVF vector codec with the lists still sized by regis as the collection "
                                           "grows, e.g. PQ32x4fsr at 256-d: the compact layout (docs/SCALE.md)."),
    ] = None,
    k_factor: Annotated[
        int | None,
        typer.Option("--k-factor", min=1, help="FAISS neighbours per query token as a multiple of the depth, "
                                               "re-ranked on the token store's codes (for FAISS codes coarser "
                                               "than the store's: the compact layout); default 4 for FAISS "
                                               "codes of at most 1 bit per dimension, else 1."),
    ] = None,
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="CSV (with a 'path' column) or JSONL (objects with 'path') of "
                                                     "per-image metadata; paths relative to the folder.")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 32,
    workers: Annotated[int | None, typer.Option("--workers", help="Decoding processes (default min(4, CPUs)).")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")] = False,
    ray: Annotated[
        bool, typer.Option("--ray", help="Build a sharded collection with Ray Data (pip install 'regis\\[ray]'; "
                                         "settings from REGIS_RAY_* variables, see cluster/settings.py).")
    ] = False,
    shards: Annotated[int | None, typer.Option("--shards", help="--ray: number of shards S (default: the "
                                                                "collection's, else 1).")] = None,
) -> None:
    """Index a folder, or update an index incrementally: new and changed files are embedded, files gone from
    the folder removed; ids stay stable. Images of other folders in the same index or collection stay (use
    --replace for a build that replaces them). Unreadable files are skipped and listed."""
    from cli.options import index_dir_for
    from indexer.metadata import load_metadata_file
    from regis.errors import ConfigError
    from regis.index_encoder import encoder_for

    if ray and (replace or candidates is not None):
        raise ConfigError("--ray builds the whole folder into the sharded collection: --replace and --candidates "
                          "are single-machine options")
    index = index_dir_for(index, collection, root)
    if collection is not None:
        backbone, weights, random_init, frame, query_layout = _collection_encoder(
            collection, root, backbone, weights, random_init, frame, query_layout)
    rows = load_metadata_file(metadata) if metadata else None
    if compact:
        faiss_codec, token_store = faiss_codec or "compact", token_store or "compact"
    if ray:
        from cluster.cli import build_ray_cli

        build_ray_cli(images_dir, index, shards, dict(backbone=backbone, weights=weights, random_init=random_init,
                                                      roi_size=roi_size, cue_method=cue_method, device=device,
                                                      roi_image_size=roi_image_size, frame=frame,
                                                      query_layout=query_layout),
                      dict(faiss_spec=faiss_index, nprobe=nprobe, depth=depth, token_store=token_store,
                           k_factor=k_factor, faiss_codec=faiss_codec, metadata=rows),
                      batch_size, as_json)
        return
    from indexer.build import BuildOptions, build_index

    encoder = encoder_for(index, backbone, weights, random_init, roi_size, cue_method, device, roi_image_size,
                          frame, query_layout)
    options = BuildOptions(batch_size=batch_size, num_workers=workers, faiss_spec=faiss_index, nprobe=nprobe,
                           progress=progress, depth=depth, token_store=token_store, replace=replace,
                           candidates=candidates, k_factor=k_factor, faiss_codec=faiss_codec,
                           metadata=rows)
    with _sigterm_as_interrupt():
        report = build_index(images_dir, index, encoder, options)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    typer.echo(build_summary(report))
    for item in report.skipped:
        typer.echo(f"  skipped {item['path']}: {item['reason']}", err=True)
    hint = _framing_hint_for(index)
    if hint:
        typer.echo(hint, err=True)


def build_summary(report: BuildReport) -> str:
    """The one-line summary ``regis index build`` prints for an ``indexer.BuildReport``.

    A build that found nothing to add, update or delete (and no file it could not read) says so in words:
    ``index up to date: 21 images, nothing new to embed (0 added, 0 updated, 0 deleted); ...``. The embedding
    rate is printed only when this run embedded images over a measured time (never 0 images/s); a build that
    only deleted or refreshed rows says ``(nothing to embed)`` instead.
    """
    version = f"version {report.version}" if report.version else "no change, index kept as it was"
    in_index = report.unchanged + report.touched
    changed = report.added + report.updated + report.deleted
    if not changed and not report.skipped:
        took = f"{report.total_s:.1f} s" if report.total_s >= 0.05 else "under 0.1 s"
        kept = f"version {report.version}; " if report.version else ""  # a new version: rows refreshed, no tokens
        return (f"index up to date: {in_index} images, nothing new to embed ({report.added} added, "
                f"{report.updated} updated, {report.deleted} deleted); {kept}checked in {took}")
    from indexer.embed import embedding_rate

    rate = embedding_rate(report.images_per_s, report.added + report.updated, len(report.skipped))
    resumed = f" ({report.resumed} embedded by the interrupted run)" if report.resumed else ""
    return (f"{report.scanned} files scanned: {report.added} added, {report.updated} updated{resumed}, "
            f"{report.deleted} deleted, {in_index} unchanged, {len(report.skipped)} skipped; {version}; "
            f"{report.total_s:.1f} s{rate}")


LARGE_TWO_FRAMING = 250_000  # images from which a build of a two-framing index says what one framing would save


def framing_hint(num_images: int, framings: int, spec: str = "", dim: int = 256) -> str | None:
    """The note a build prints for a large index of two framings per image whose FAISS codes are SQ8 (new two-framing
    indexes get ``PQ{D/4}x4fsr`` since 2026-11-29, run U: one made before, or asked for), None otherwise.

    With the shipped encoder at 1M images (BENCHMARKS.md section 9, runs T and U), two framings hold 8.0 KB resident
    per image with SQ8 FAISS codes (recall@10 0.998, 30 ms p50 on one thread); with 4-bit FAISS codes of the
    residuals (``--faiss-codec PQ{D/4}x4fsr``) 3.7 KB (0.997, 24-27 ms); one framing (``--frame center-crop``)
    4.0 KB and 17 ms.

    Args:
        num_images: live images in the index after the build.
        framings: framings per image (``EncoderConfig.framings``).
        spec: the index's FAISS spec (``FaissInfo.spec``); a fast-scan codec gets no note.
        dim: token width D.
    """
    from regis.indexes import faiss_index

    if framings < 2 or num_images < LARGE_TWO_FRAMING or faiss_index.fast_scan_pq(faiss_index.spec_codec(spec)):
        return None
    codec = f"PQ{dim // 4}x4fsr" if dim % 4 == 0 else None
    smaller = (f"an index built with --faiss-codec {codec} (4-bit FAISS codes) holds the two framings in about "
               "3.7 KB per image at the same speed, or " if codec else "")
    return (f"note: {num_images:,} images of two framings each: about 8 KB of memory per image and about twice the "
            f"search time of one framing; {smaller}one built with --frame center-crop halves both "
            "(BENCHMARKS.md section 9)")


def _framing_hint_for(index: Path) -> str | None:
    """``framing_hint`` of the index's live version (None when it has none)."""
    from regis.indexes.layout import VERSIONS_DIR, read_current
    from regis.indexes.manifest import read_manifest

    current = read_current(Path(index))
    if current is None:
        return None
    manifest = read_manifest(Path(index) / VERSIONS_DIR / current)
    return framing_hint(manifest.num_images, manifest.encoder.framings, manifest.faiss.spec, manifest.dim)


@contextmanager
def _sigterm_as_interrupt():
    """While a build runs, SIGTERM (``kill``, a stopping container) stops it as Ctrl-C does: the finished batches
    stay staged and the command says how far it got (``indexer.resume``)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _collection_encoder(collection: str, root: Path | None, backbone, weights, random_init, frame=None,
                        query_layout=None) -> tuple:
    """(backbone, weights, random_init, frame, query_layout) of a build into collection ``collection``: the
    collection is created with the given encoder if missing; an existing one's own encoder unless another is
    given."""
    from cli.options import collections_root
    from regis.indexes.collections import CollectionConfig

    collections = collections_root(root)
    if not collections.exists(collection):
        collections.create(collection, CollectionConfig(backbone=backbone, random_init=random_init,
                                                        weights=str(weights) if weights else None, frame=frame,
                                                        query_layout=query_layout))
    else:
        config = collections.config(collection)
        if backbone is None and weights is None and not random_init:  # the collection's own encoder
            backbone, random_init = config.backbone, config.random_init
            weights = Path(config.weights) if config.weights else None
        frame, query_layout = frame or config.frame, query_layout or config.query_layout
    return backbone, weights, random_init, frame, query_layout


@app.command("info")
def info(index: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print the manifest of an index's live version."""
    from regis.indexes.snapshot import IndexSnapshot

    snap = IndexSnapshot.open(index)
    try:
        typer.echo(json.dumps(snap.manifest.to_json(), indent=2))
    finally:
        snap.close()


def worker(
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis holding the job queue (env REGIS_REDIS_URL).")
    ] = None,
    index: Annotated[Path | None, typer.Option("--index", "-i", help="Index directory (env REGIS_INDEX_DIR).")] = None,
    images_root: Annotated[
        Path | None, typer.Option("--images-root", help="The folder index jobs may read (env REGIS_IMAGES_ROOT).")
    ] = None,
    uploads_dir: Annotated[
        Path | None, typer.Option("--uploads-dir", help="Where uploads are stored (env REGIS_UPLOADS_DIR).")
    ] = None,
    backbone: Backbone = None,
    weights: Weights = None,
    random_init: RandomInit = False,
    device: Annotated[str | None, typer.Option("--device", help="torch device: cpu, cuda, cuda:1 ...")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Images per forward pass.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Decoding processes per job.")] = None,
    job_monitoring_interval: Annotated[
        int | None, typer.Option("--job-monitoring-interval", help="Heartbeat period while a job runs, s.")
    ] = None,
    heartbeat_grace: Annotated[
        int | None, typer.Option("--heartbeat-grace", help="A job this late on its heartbeat is abandoned, s.")
    ] = None,
    maintenance_interval: Annotated[
        int | None, typer.Option("--maintenance-interval", help="How often abandoned jobs are looked for, s.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Worker name (default HOSTNAME.PID).")] = None,
    burst: Annotated[bool, typer.Option("--burst", help="Stop when the queue is empty.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Healthcheck: exit 0 if a worker of this host is registered, else 1.")
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "info",
) -> None:
    """Run indexing jobs from Redis (POST /v1/jobs/index, uploads, deletes) and announce new index versions.
    Other settings come from REGIS_* environment variables (docs/DEPLOY.md)."""
    from indexer.worker import WorkerSettings, check_worker, run_worker

    given = {
        "redis_url": redis_url, "index_dir": index, "images_root": images_root, "uploads_dir": uploads_dir,
        "backbone": backbone, "weights": weights, "random_init": random_init or None, "device": device,
        "build_batch_size": batch_size, "build_workers": workers,
        "job_monitoring_interval_s": job_monitoring_interval, "heartbeat_grace_s": heartbeat_grace,
        "maintenance_interval_s": maintenance_interval,
    }
    settings = WorkerSettings(**{k: v for k, v in given.items() if v is not None})
    if check:
        raise typer.Exit(0 if check_worker(settings) else 1)
    run_worker(settings, burst=burst, name=name, log_level=log_level)
