"""``regis serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.options import Backbone, RandomInit, Weights


def serve(
    index: Annotated[
        Path | None, typer.Option("--index", "-i", help="Index directory to serve (env REGIS_INDEX_DIR).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8000,
    weights: Weights = None,
    device: Annotated[str | None, typer.Option("--device", help="torch device: cpu, cuda, cuda:1 ...")] = None,
    images_root: Annotated[
        Path | None, typer.Option("--images-root", help="Folder the index's paths resolve against; index jobs "
                                                        "may read only below it.")
    ] = None,
    enable_jobs: Annotated[
        bool | None, typer.Option("--enable-jobs/--read-only", help="Accept index jobs, uploads and deletes "
                                                                   "(env REGIS_ENABLE_JOBS; default read-only).")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis for jobs, index-update notices and the query cache "
                                                     "(env REGIS_REDIS_URL; default: embedded jobs, no cache).")
    ] = None,
    uploads_dir: Annotated[
        Path | None, typer.Option("--uploads-dir", help="Where uploaded images are stored.")
    ] = None,
    collections_root: Annotated[
        Path | None, typer.Option("--collections-root", help="Folder of named collections, served under "
                                                             "/v1/collections/{name} (env REGIS_COLLECTIONS_ROOT).")
    ] = None,
    api_keys_file: Annotated[
        Path | None, typer.Option("--api-keys-file", help="Require API keys from this file on every route "
                                                          "(regis keys create; env REGIS_API_KEYS_FILE).")
    ] = None,
    backbone: Backbone = None,
    random_init: RandomInit = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
    ray: Annotated[
        bool, typer.Option("--ray", help="Serve a sharded collection on Ray Serve (pip install 'regis\\[ray]'; "
                                         "other settings from REGIS_RAY_* variables, see cluster/settings.py).")
    ] = False,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=1, max=1024,
                                 help="--ray: replicas of each shard (env REGIS_RAY_SHARD_REPLICAS; default 1). "
                                      "With 2 or more, a replica that dies loses no request.")
    ] = None,
) -> None:
    """Serve an index over HTTP: POST /v1/search, GET /v1/images/{id}, jobs and uploads (with --enable-jobs),
    /healthz, /readyz, /metrics, OpenAPI at /docs. Other settings come from REGIS_* environment variables."""
    import os

    import uvicorn

    from regis.errors import ConfigError
    from service.app import create_app, open_live_index
    from service.settings import Settings

    if index is None and collections_root is None and not any(
            os.environ.get(v) for v in ("REGIS_INDEX_DIR", "REGIS_COLLECTIONS_ROOT")):
        raise ConfigError("no index to serve: pass --index DIR (an index built by regis index build) or "
                          "--collections-root DIR (a folder of collections)",
                          hint="regis index build PHOTOS --index DIR, then regis serve --index DIR")
    given = {
        "index_dir": index, "weights": weights, "device": device, "images_root": images_root,
        "enable_jobs": enable_jobs, "redis_url": redis_url, "uploads_dir": uploads_dir, "backbone": backbone,
        "random_init": random_init or None, "collections_root": collections_root, "api_keys_file": api_keys_file,
    }
    settings = Settings(**{k: v for k, v in given.items() if v is not None})
    if ray:
        from cluster.cli import serve_ray

        serve_ray(settings, host, port, str(weights) if weights else None, replicas)
        return
    if replicas is not None:
        from regis.errors import ConfigError

        raise ConfigError("--replicas is an option of --ray (Ray Serve replicas of each shard)")
    live = open_live_index(settings)  # a missing index or a mismatching encoder: one line, before the server starts
    uvicorn.run(create_app(settings, live=live), host=host, port=port, log_level=log_level,
                timeout_keep_alive=settings.keep_alive_s)
