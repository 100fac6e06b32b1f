"""The ``regis`` command line (typer). Subsystems contribute their own sub-apps; heavy imports happen
inside commands, so ``regis --help`` is instant."""

from cli.main import app, main

__all__ = ["app", "main"]
