"""The ``--ray`` variants of ``regis serve`` and ``regis index build`` (called by those commands)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import typer

from regis.errors import ConfigError


def _require_ray() -> None:
    """Raises ConfigError when Ray is not installed (without importing it: ``cluster.connect`` may have to set
    Ray's environment first)."""
    spec = importlib.util.find_spec("ray")  # (find_spec("ray.serve") would import ray)
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not any((Path(p) / "serve").is_dir() for p in places):
        raise ConfigError("--ray needs Ray with Serve and Data: pip install 'regis[ray]'")


def _say(line: str) -> None:
    typer.echo(line, err=True)


def serve_ray(service, host: str, port: int, weights: str | None, replicas: int | None = None) -> None:
    """``regis serve --ray``: deploy the collection ``service.index_dir`` on Ray Serve and block.

    Raises:
        ConfigError: Ray is not installed.
        IndexFormatError: not a sharded collection.
    """
    from regis.sharding.layout import read_layout

    read_layout(service.index_dir)  # a clear error before Ray starts
    _require_ray()
    from cluster.connect import RayConnection
    from cluster.settings import RaySettings

    settings = RaySettings(http_host=host, http_port=port,
                           **({"shard_replicas": replicas} if replicas is not None else {}))
    with RayConnection(settings, say=_say) as connection:
        from cluster.serve import serve_forever  # imports ray: after the connection set its environment

        serve_forever(service.index_dir, service, settings, weights, say=_say,
                      delete_app=connection.cluster is None)  # a local cluster stops as a whole


def build_ray_cli(images_dir: Path, collection: Path, shards: int | None, encoder_options: dict,
                  index_options: dict, batch_size: int, as_json: bool) -> None:
    """``regis index build --ray``: build or update a sharded collection with Ray Data and print the report."""
    _require_ray()
    from cluster.connect import RayConnection
    from cluster.settings import RaySettings
    from regis.index_encoder import encoder_for
    from regis.sharding.layout import is_sharded, read_layout

    num_shards = shards or (read_layout(collection)["num_shards"] if is_sharded(collection) else 1)
    existing = collection if is_sharded(collection) else None  # encoder_for: its first shard with a version
    o = encoder_options
    encoder = encoder_for(existing, o["backbone"], o["weights"], o["random_init"], o["roi_size"], o["cue_method"],
                          o["device"], o.get("roi_image_size"), o.get("frame"), o.get("query_layout"),
                          new_cnn_frame="center-crop")  # square inputs: not the two-framing default of new indexes
    from regis.errors import ConfigError
    from regis.models.geometry import is_aspect

    if is_aspect(encoder.config):
        raise ConfigError("--ray builds take square inputs only: the aspect frame is built without --ray")
    settings = RaySettings(build_batch_size=batch_size)
    with RayConnection(settings, say=_say):
        from cluster.build import build_ray

        report = build_ray(images_dir, collection, encoder, num_shards, settings,
                           weights=str(o["weights"]) if o["weights"] else None, **index_options)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    from indexer.embed import embedding_rate

    rate = embedding_rate(report.images_per_s, report.added + report.updated, len(report.skipped))
    typer.echo(f"{report.scanned} files scanned: {report.added} added, {report.updated} updated, "
               f"{report.deleted} deleted, {report.unchanged} unchanged, {len(report.skipped)} skipped; "
               f"{report.num_shards} shards, {report.checkpoints} checkpoints; {report.total_s:.1f} s{rate}")
    for item in report.skipped:
        typer.echo(f"  skipped {item['path']}: {item['reason']}", err=True)
