"""``regis collections create|list|info|delete``: the collections under a root folder
(``regis.indexes.collections``)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.options import Backbone, CollectionsRootOpt, RandomInit, Weights

app = typer.Typer(help="Create, list, describe and delete collections (named indexes under one root).",
                  no_args_is_help=True)
Name = Annotated[str, typer.Argument(help="Collection name (a-z, 0-9, '_', '-').")]


@app.command("create")
def create(
    name: Name,
    root: CollectionsRootOpt = None,
    backbone: Backbone = None,
    weights: Weights = None,
    random_init: RandomInit = False,
    description: Annotated[str, typer.Option("--description", help="Free text.")] = "",
) -> None:
    """Create an empty collection that will embed with the given backbone (default efficientnet-lite0)."""
    from cli.options import collections_root
    from regis.indexes.collections import CollectionConfig

    config = CollectionConfig(backbone=backbone, weights=str(weights) if weights else None,
                              random_init=random_init, description=description)
    path = collections_root(root).create(name, config)
    typer.echo(f"collection {name} created in {path}")


@app.command("list")
def list_(
    root: CollectionsRootOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the collections: name, images, index version, backbone."""
    from cli.options import collections_root

    collections = collections_root(root)
    rows = [collections.describe(name) for name in collections.names()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        version = row["index_version"] if row["index_version"] is not None else "-"
        typer.echo(f"{row['name']:24s} {row['images']:8d} images  version {version!s:6s} {row['backbone']}")


@app.command("info")
def info(name: Name, root: CollectionsRootOpt = None) -> None:
    """Describe one collection (JSON)."""
    from cli.options import collections_root

    typer.echo(json.dumps(collections_root(root).describe(name), indent=2))


@app.command("delete")
def delete(
    name: Name,
    root: CollectionsRootOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a collection: its index, versions and tokens (uploaded files stored elsewhere stay)."""
    from cli.options import collections_root
    from regis.indexes.collections import CollectionNotFoundError

    collections = collections_root(root)
    if not collections.exists(name):
        raise CollectionNotFoundError(f"no collection named {name!r} in {collections.root}",
                                      hint="regis collections list")
    if not yes:
        typer.confirm(f"delete collection {name} and its index?", abort=True)
    collections.delete(name)
    typer.echo(f"collection {name} deleted")
