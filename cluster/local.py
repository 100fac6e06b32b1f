"""A local Ray cluster (``ray start --head`` plus worker nodes on this machine) with bounded resources: what
``--ray`` starts when there is no cluster to join (``cluster.connect``), and the cluster of tests and benchmarks.

Each node is a ``ray start --block`` process in a session of its own, with the cluster's own temporary folder
(so it never becomes the machine's "auto" cluster) and its own free ports (two clusters on one machine never
collide on Ray's fixed defaults: client server 10001, dashboard agent 52365, ...); ``stop`` ends exactly those
process groups (SIGTERM, which ``ray start --block`` answers by stopping its raylet, GCS and workers; then
SIGKILL for what is left), never other Ray processes of the machine (no ``ray stop``). Each node also gets
SIGTERM from the kernel when the thread that started it dies (Linux ``PR_SET_PDEATHSIG``), so a process killed
without clean-up (SIGKILL) leaves no Ray node behind either.

``loopback=True`` (one node): every server of the node listens on 127.0.0.1 only. Ray binds its GCS, raylet
and agents to 127.0.0.1 when the node's IP is the loopback address, which Ray uses when multi-node clusters are
off for the node (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's switch for laptops); with multi-node clusters
on, Ray replaces 127.0.0.1 by the machine's address and listens on every interface (the worker nodes of a
multi-node cluster need that).

Usage::

    with LocalRayCluster(head_cpus=1, worker_cpus=1) as cluster:
        ray.init(address=cluster.address)
        ...
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from regis.errors import ConfigError

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (read when ray is imported)
# Ray Serve's switch for calls between deployments over each replica's gRPC server instead of Ray actor tasks and
# the object store (part of Ray's RAY_SERVE_THROUGHPUT_OPTIMIZED; its other parts are not used: with user code and
# router on the replica's main event loop /readyz answered 500, and its direct ingress moves the HTTP port). The
# nodes of a local cluster get it unless the environment sets it: less CPU per request (BENCHMARKS.md section 6).
SERVE_ENV = {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"}
_PR_SET_PDEATHSIG = 1


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """``preexec_fn`` of a child process (a node: SIGTERM, the default; the tests' servers: SIGKILL): the kernel
    sends it ``signum`` when the thread that started it dies (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def replica_on_loopback() -> None:
    """In a replica of a loopback cluster (``cluster.local``: every Ray server on 127.0.0.1), bind Ray Serve's
    inter-deployment gRPC server to 127.0.0.1 as well: Ray Serve 2.60 binds it to "[::]:0" (every interface) in
    ``Replica._on_initialized``, with no setting, although a one-node cluster reaches it on 127.0.0.1. Called
    first in each deployment's constructor (before ``_on_initialized``); elsewhere, or on a Ray without that
    function, it does nothing."""
    if os.environ.get(LOOPBACK_ENV) != "0":
        return
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "regis_loopback", False):
        return

    def on_loopback(server, address: str):
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    on_loopback.regis_loopback = True
    replica.add_port_to_grpc_server = on_loopback


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


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalRayCluster:
    """A head node and ``workers`` worker nodes on this machine.

    Args:
        head_cpus, worker_cpus: logical CPUs each node offers to Ray (bounds what runs at once).
        workers: worker nodes besides the head.
        object_store_bytes: object store per node, bytes.
        env: environment of the nodes (default: this process's; workers inherit it, e.g. PYTHONPATH).
        timeout_s: how long each node may take to start, seconds.
        loopback: every server listens on 127.0.0.1 only (one node; see the module docstring). A driver joins
            it from a process whose ``ray`` was imported with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
            (``cluster.connect`` sees to it).

    Raises:
        ConfigError: ``loopback`` with worker nodes.
    """

    def __init__(self, head_cpus: float = 1, worker_cpus: float = 1, workers: int = 1,
                 object_store_bytes: int = 200 * 1024 * 1024, env: dict | None = None, timeout_s: float = 180,
                 loopback: bool = False):
        if loopback and workers:
            raise ConfigError("a loopback Ray cluster has one node: Ray listens on every interface once nodes join")
        self.head_cpus, self.worker_cpus, self.workers, self.loopback = head_cpus, worker_cpus, workers, loopback
        self.object_store_bytes = object_store_bytes
        self.env = dict(env if env is not None else os.environ)
        self.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        for name, value in SERVE_ENV.items():
            self.env.setdefault(name, value)
        # Ray >= 2.5x turns token authentication on for a node that finds ~/.ray/auth_token (written by any local
        # ray.init() on this machine), and the worker nodes then fail to join ("InvalidAuthToken"). This cluster
        # listens on 127.0.0.1 only: its nodes run with authentication off unless RAY_AUTH_MODE says otherwise (a
        # driver holding a token still connects).
        self.env.setdefault("RAY_AUTH_MODE", "disabled")
        self.env.pop("RAY_ADDRESS", None)
        self.timeout_s = timeout_s
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir: str | None = None
        self.nodes: list[subprocess.Popen] = []

    def _node(self, *args: str) -> subprocess.Popen:
        log = open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "wb")  # noqa: SIM115 (kept by the process)
        ports = [f"--{name}={_free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                          "metrics-export-port", "runtime-env-agent-port")]
        env = {**self.env, LOOPBACK_ENV: "0"} if self.loopback else self.env
        ip = [] if self.loopback else ["--node-ip-address", "127.0.0.1"]  # (Ray resolves it to the machine's IP)
        proc = subprocess.Popen([_ray_cli(), "start", "--block", *ip, "--num-gpus", "0",
                                 "--object-store-memory", str(self.object_store_bytes), "--disable-usage-stats",
                                 *ports, *args],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)
        log.close()
        self.nodes.append(proc)
        return proc

    def _wait(self, proc: subprocess.Popen, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = Path(self.temp_dir) / f"node-{self.nodes.index(proc)}.log"
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
                raise RuntimeError(f"{what} did not start (exit {proc.poll()}): {tail}")
            time.sleep(0.5)

    def start(self) -> LocalRayCluster:
        """Start the head, then the workers; returns once every node has joined (checked from the head's GCS
        with ``ray status``).

        Raises:
            RuntimeError: a node did not start in ``timeout_s`` (the cluster is stopped; the message has the tail
                of its log).
        """
        self.temp_dir = tempfile.mkdtemp(prefix="regis-ray-")  # short: Ray's socket paths must stay < 108 bytes
        try:
            head = self._node("--head", "--port", str(self.port), "--num-cpus", str(self.head_cpus),
                              "--include-dashboard", "false", "--temp-dir", self.temp_dir,
                              f"--ray-client-server-port={_free_port()}")
            self._wait(head, lambda: _port_open(self.port), "the Ray head node")
            for i in range(self.workers):
                worker = self._node("--address", self.address, "--num-cpus", str(self.worker_cpus))
                self._wait(worker, lambda n=i + 2: self._joined(n), f"Ray worker node {i + 1}")
        except BaseException:
            self.stop()
            raise
        return self

    def _joined(self, n: int) -> bool:
        """Whether ``n`` nodes are alive (``ray status`` against this cluster)."""
        done = subprocess.run([_ray_cli(), "status", "--address", self.address], env=self.env,
                              capture_output=True, text=True, timeout=60)
        return done.returncode == 0 and done.stdout.count("node_") >= n

    def stop(self) -> None:
        """End this cluster's node process groups (SIGTERM, 3 s, then SIGKILL) and remove its temporary folder."""
        for proc in reversed(self.nodes):
            self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for proc in self.nodes:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.nodes:
            self._signal(proc, signal.SIGKILL)  # the node's children (raylet, GCS, workers) share its group
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.nodes = []
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group this cluster started (start_new_session), by its id
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
