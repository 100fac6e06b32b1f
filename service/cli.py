"""``regis serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from regis.cli.options import Device, Weights


def serve(
    index: Annotated[Path, typer.Option("--index", "-i", help="Index directory to serve.")],
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8000,
    weights: Weights = None,
    device: Device = "cpu",
    images_root: Annotated[
        Path | None, typer.Option("--images-root", help="Folder the index's paths resolve against.")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
) -> None:
    """Serve an index over HTTP: POST /v1/search, GET /v1/images/{id}, /healthz, OpenAPI at /docs."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(index_dir=index, weights=weights, device=device, images_root=images_root)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)
