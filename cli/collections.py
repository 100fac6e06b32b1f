"""``regis collections create|list|info|delete|snapshot|restore|reshard``: the collections under a root folder
(``regis.indexes.collections``; snapshots: ``regis.backups``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.options import Backbone, CollectionsRootOpt, Frame, IndexLayout, Layout, QueryLayout, RandomInit, Weights

app = typer.Typer(help="Create, list, describe, delete, snapshot and restore collections (named indexes under one "
                       "root).",
                  no_args_is_help=True)
Name = Annotated[str, typer.Argument(help="Collection name (a-z, 0-9, '_', '-').")]


@app.command("create")
def create(
    name: Name,
    root: CollectionsRootOpt = None,
    backbone: Backbone = None,
    weights: Weights = None,
    random_init: RandomInit = False,
    frame: Frame = None,
    query_layout: QueryLayout = None,
    description: Annotated[str, typer.Option("--description", help="Free text.")] = "",
    layout: Layout = IndexLayout.default,
) -> None:
    """Create an empty collection that will embed with the given backbone (default efficientnet-lite0-regis) and
    store its index in the given layout (fixed by its first build)."""
    from cli.options import collections_root
    from regis.indexes.collections import CollectionConfig

    config = CollectionConfig(backbone=backbone, weights=str(weights) if weights else None,
                              random_init=random_init, frame=frame, query_layout=query_layout,
                              description=description, layout=layout.value)
    path = collections_root(root).create(name, config)
    typer.echo(f"collection {name} created in {path}")


@app.command("list")
def list_(
    root: CollectionsRootOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the collections: name, images, index version, backbone, layout."""
    from cli.options import collections_root

    collections = collections_root(root)
    rows = [collections.describe(name) for name in collections.names()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        version = row["index_version"] if row["index_version"] is not None else "-"
        typer.echo(f"{row['name']:24s} {row['images']:8d} images  version {version!s:6s} {row['backbone']}  "
                   f"{row['config']['layout']}")


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


@app.command("snapshot")
def snapshot(
    name: Name,
    file: Annotated[Path, typer.Argument(help="The snapshot file to write (.tar, or .tar.gz to compress).")],
    root: CollectionsRootOpt = None,
    uploads: Annotated[bool, typer.Option("--uploads/--no-uploads", help="Include the uploaded images' files "
                                                                         "(the collection's uploads folder).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Write the state the collection serves now (one published version; every shard's, for a sharded one) to a
    tar file, while writes go on. Restore it here or on another machine with `regis collections restore`."""
    from cli.options import collections_root
    from regis.backups.snapshot import snapshot as take
    from regis.indexes.collections import CollectionNotFoundError

    collections = collections_root(root)
    if not collections.exists(name):
        raise CollectionNotFoundError(f"no collection named {name!r} in {collections.root}")
    path = collections.path(name)
    report = take(path, file, uploads_dir=collections.overrides(name)["uploads_dir"] if uploads else None)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    typer.echo(f"collection {name} version {report.version} ({report.kind}, {report.images} images, "
               f"{report.uploads} uploaded files) -> {report.path}: {report.files} files, "
               f"{report.bytes / 2**20:.1f} MiB, {report.seconds:.1f} s")


@app.command("restore")
def restore(
    file: Annotated[Path, typer.Argument(help="A snapshot file (regis collections snapshot).")],
    name: Name,
    root: CollectionsRootOpt = None,
) -> None:
    """Create collection NAME from a snapshot file (checked file by file; NAME must not exist). It answers every
    search as the snapshot's collection did; set REGIS_IMAGES_ROOT to serve the images' files on a new machine."""
    from cli.options import collections_root
    from regis.backups.restore import restore as put_back
    from regis.indexes.collections import CollectionExistsError, check_name

    collections = collections_root(root)
    if collections.exists(check_name(name)):
        raise CollectionExistsError(f"collection {name!r} exists already in {collections.root}")
    report = put_back(file, collections.path(name))
    typer.echo(f"collection {name} restored in {report.path}: version {report.version} ({report.kind}), "
               f"{report.images} images, {report.uploads} uploaded files")


@app.command("reshard")
def reshard(
    name: Name,
    shards: Annotated[int, typer.Option("--shards", help="The new number of shards S (1-4096).")],
    root: CollectionsRootOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Re-shard a sharded collection while it is served: the new layout is written beside the old one and
    published in one step (searches keep answering, with the same results; writes wait for it)."""
    from cli.options import collections_root
    from regis.indexes.collections import CollectionNotFoundError
    from regis.sharding.reshard import reshard as move

    collections = collections_root(root)
    if not collections.exists(name):
        raise CollectionNotFoundError(f"no collection named {name!r} in {collections.root}")
    report = move(collections.path(name), shards)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    elif report.version is None:
        typer.echo(f"collection {name} has {shards} shards already")
    else:
        typer.echo(f"collection {name}: {report.shards_before} -> {report.shards_after} shards, {report.images} "
                   f"images, version {report.version}, {report.seconds:.1f} s")
