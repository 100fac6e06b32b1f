"""``python -m regis`` runs the ``regis`` command line.

The command line sits at the top of the house (the ``cli`` package imports indexer, service and training), so
the core package does not import it: this shim looks up the installed ``regis`` console script and runs it.
"""

from importlib.metadata import entry_points

(script,) = entry_points(group="console_scripts", name="regis")
script.load()()
