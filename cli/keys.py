"""``regis keys create|list|revoke``: the service's API keys (``service.keys``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Create, list and revoke API keys (stored hashed in REGIS_API_KEYS_FILE).",
                  no_args_is_help=True)
KeysFile = Annotated[
    Path | None, typer.Option("--file", envvar="REGIS_API_KEYS_FILE", help="The keys file (env REGIS_API_KEYS_FILE).")
]


def _file(path: Path | None) -> Path:
    from regis.errors import ConfigError

    if path is None:
        raise ConfigError("no keys file: pass --file PATH or set REGIS_API_KEYS_FILE")
    return path


@app.command("create")
def create(
    scope: Annotated[str, typer.Option("--scope", help="read (search, list, read images) or write (also uploads, "
                                                       "deletes, metadata, jobs, collections).")] = "read",
    name: Annotated[str, typer.Option("--name", help="What the key is for (shown by `regis keys list`).")] = "",
    collection: Annotated[list[str] | None, typer.Option(
        "--collection", help="Limit the key to this collection (repeat for several; default: every collection). "
                             "Give the default collection's name for the routes without /collections/{name}.")] = None,
    file: KeysFile = None,
) -> None:
    """Make a key and print it (once: only its hash is stored)."""
    from service.keys import create_key

    key, record = create_key(_file(file), scope, name, collection or None)
    typer.echo(key)
    where = f", collections {', '.join(record.collections)}" if record.collections else ""
    typer.echo(f"key {record.id} ({record.scope}{where}) stored in {file}; send it as 'Authorization: Bearer <key>'",
               err=True)


@app.command("list")
def list_(file: KeysFile = None) -> None:
    """List the keys: id, scope, created, revoked, name."""
    from service.keys import read_keys

    for k in read_keys(_file(file)).keys:
        state = f"revoked {k.revoked_at}" if k.revoked_at else "active"
        where = f"  collections {','.join(k.collections)}" if k.collections else ""
        typer.echo(f"{k.id}  {k.scope:5s}  created {k.created_at}  {state}{where}  {k.name}")


@app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id (regis keys list).")],
           file: KeysFile = None) -> None:
    """Revoke a key: a running service refuses it from its next request on."""
    from service.keys import revoke_key

    record = revoke_key(_file(file), key_id)
    typer.echo(f"key {record.id} revoked at {record.revoked_at}")
