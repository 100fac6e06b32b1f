"""A local Ray cluster (``ray start --head`` plus worker nodes on this machine) with bounded resources, for tests,
benchmarks and trying ``--ray`` on a laptop. Always stopped with ``ray stop --force``.

Usage::

    with LocalRayCluster(head_cpus=1, worker_cpus=1) as cluster:
        ray.init(address=cluster.address)
        ...
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from regis.errors import ConfigError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    found = str(exe) if exe.exists() else shutil.which("ray")
    if not found:
        raise ConfigError("the `ray` command is missing: pip install 'regis[ray]'")
    return found


class LocalRayCluster:
    """A head node and ``workers`` worker nodes on 127.0.0.1.

    Args:
        head_cpus, worker_cpus: logical CPUs each node offers to Ray (bounds what runs at once).
        workers: worker nodes besides the head.
        object_store_bytes: object store per node, bytes.
        env: environment of the nodes (default: this process's; workers inherit it, e.g. PYTHONPATH).
        timeout_s: how long each ``ray start`` may take, seconds.
    """

    def __init__(self, head_cpus: float = 1, worker_cpus: float = 1, workers: int = 1,
                 object_store_bytes: int = 200 * 1024 * 1024, env: dict | None = None, timeout_s: float = 180):
        self.head_cpus, self.worker_cpus, self.workers = head_cpus, worker_cpus, workers
        self.object_store_bytes = object_store_bytes
        self.env = dict(env if env is not None else os.environ)
        self.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.timeout_s = timeout_s
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"

    def _run(self, *args: str) -> None:
        done = subprocess.run([_ray_cli(), *args], env=self.env, timeout=self.timeout_s, capture_output=True,
                              text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
            raise RuntimeError(f"`ray {' '.join(args[:2])}` failed (exit {done.returncode}): " + " | ".join(tail))

    def start(self) -> LocalRayCluster:
        """Start the head, then the workers.

        Raises:
            RuntimeError / subprocess.TimeoutExpired: a node did not start (the cluster is stopped).
        """
        common = ["--object-store-memory", str(self.object_store_bytes), "--disable-usage-stats"]
        try:
            self._run("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                      "--num-cpus", str(self.head_cpus), "--num-gpus", "0", "--include-dashboard", "false",
                      *common)
            for _ in range(self.workers):
                self._run("start", "--address", self.address, "--node-ip-address", "127.0.0.1",
                          "--num-cpus", str(self.worker_cpus), "--num-gpus", "0", *common)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """``ray stop --force``: every Ray process of this machine's nodes."""
        subprocess.run([_ray_cli(), "stop", "--force"], env=self.env, timeout=self.timeout_s,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
