"""``python -m regis`` runs the CLI."""

from regis.cli import main

main()
