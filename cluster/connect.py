"""Joining a Ray cluster, or starting one on this machine when there is none to join: what ``regis serve --ray``
and ``regis index build --ray`` do first.

``REGIS_RAY_ADDRESS`` (``RaySettings.address``):

- ``auto`` (default): the cluster named by ``RAY_ADDRESS``, else the one ``ray start --head`` recorded on this
  machine (``/tmp/ray/ray_current_cluster``) if its GCS answers; else a new local cluster (below). Unlike Ray's
  own "auto", a Ray process that happens to run on the machine (another user's, a test's) is never joined.
- empty: always a new local cluster.
- ``HOST:PORT`` / ``ray://...``: that cluster (an error if it cannot be reached).

The local cluster is one ``ray start --head`` node (``cluster.local.LocalRayCluster``) with every server on
127.0.0.1, as many logical CPUs as this process may use, its own temporary folder and free ports; it lives as
long as the ``RayConnection`` (``close`` stops it; it also dies with this process's thread, see
``cluster.local``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

from cluster.local import LOOPBACK_ENV, LocalRayCluster, machine_cpus
from cluster.settings import RaySettings
from regis.errors import ConfigError

log = logging.getLogger("regis.cluster")
ADDRESS_ENV = "RAY_ADDRESS"


def _recorded_address() -> str | None:
    """The address ``ray start --head`` recorded on this machine (Ray's default temporary folder), or None."""
    root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        return root.read_text().strip() or None
    except OSError:
        return None


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``HOST:PORT`` (127.0.0.1 is tried as well: a loopback GCS)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return False
    for h in dict.fromkeys([host, "127.0.0.1"]):
        try:
            with socket.create_connection((h, int(port)), timeout=timeout_s):
                return True
        except OSError:
            continue
    return False


def cluster_to_join(address: str | None) -> str | None:
    """The cluster address ``address`` ("auto", None/"" or an address; module docstring) leads to; None: start
    a local one."""
    if address is None or address == "":
        return None
    if address != "auto":
        return address
    env = os.environ.get(ADDRESS_ENV)
    if env and env != "auto":
        return env
    recorded = _recorded_address()
    if recorded and _answers(recorded):
        return recorded
    if recorded:
        log.warning("the Ray cluster recorded in %s (%s) does not answer: starting a local one", "/tmp/ray",
                    recorded)
    return None


class RayConnection:
    """This process's connection to Ray, and the local cluster it started (if any).

    Args:
        settings: ``address`` (module docstring) and ``namespace``.
        say: prints one line to the user (where Ray runs); default: the log.

    Attributes:
        address: the cluster's address (after ``open``).
        cluster: the local cluster this connection started, or None (it joined one).
    """

    def __init__(self, settings: RaySettings, say=None):
        self.settings = settings
        self.say = say or log.warning
        self.address: str | None = None
        self.cluster: LocalRayCluster | None = None

    def open(self) -> RayConnection:
        """Join or start the cluster and ``ray.init`` this process as its driver.

        Raises:
            ConfigError: Ray is not installed; or the local cluster cannot be started in this process (``ray``
                imported earlier without ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: run the command in a fresh
                process); or the cluster did not start (the message has the tail of its log).
        """
        address = cluster_to_join(self.settings.address)
        try:
            if address is None:
                self._start_local()
            else:
                self.address = address
                self.say(f"regis: joining the Ray cluster at {address}")
            import ray

            ray.init(address=self.address, namespace=self.settings.namespace, ignore_reinit_error=True,
                     log_to_driver=False, logging_level=logging.WARNING)
        except BaseException:
            self.close()
            raise
        return self

    def _start_local(self) -> None:
        if "ray" in sys.modules and os.environ.get(LOOPBACK_ENV) != "0":
            raise ConfigError("a local Ray cluster must be started by a process that has not imported ray yet "
                              f"(or set {LOOPBACK_ENV}=0 before it does); or set REGIS_RAY_ADDRESS to join one")
        os.environ[LOOPBACK_ENV] = "0"  # this driver's node IP is 127.0.0.1 too (read when ray is imported)
        cpus = machine_cpus()
        self.cluster = LocalRayCluster(head_cpus=cpus, workers=0, loopback=True, timeout_s=120)
        try:
            self.cluster.start()
        except RuntimeError as exc:
            raise ConfigError(f"the local Ray cluster did not start: {exc}") from None
        self.address = self.cluster.address
        self.say(f"regis: started a local Ray cluster at {self.address} ({cpus} CPUs, listening on 127.0.0.1 "
                 "only; it stops with this command; set REGIS_RAY_ADDRESS to join another)")

    def close(self) -> None:
        """Disconnect, and stop the local cluster this connection started (every process of it)."""
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        finally:
            if self.cluster is not None:
                self.cluster.stop()
                self.cluster = None

    def __enter__(self) -> RayConnection:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
