"""``regis train ...`` and ``regis eval`` (added to the root CLI by ``register``)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the training commands to the root ``regis`` app."""
