"""Helpers of the deployment tests: redis-server processes on free loopback ports, polling, HTTP servers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from cluster.local import die_with_parent as parent_death  # imported here: preexec_fn runs in the forked child

REDIS_SERVER = shutil.which("redis-server")
TINY = {"backbone": "vit-tiny-reg4-test", "random_init": True}


def noise_png(seed: int, side: int = 512) -> bytes:
    """A ``side`` x ``side`` RGB PNG of uniform noise from ``seed`` (distinct bytes per seed: an upload's identity)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    """A redis-server of our own on a free loopback port (no persistence), stoppable and restartable."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        import redis

        conn = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                conn.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        conn.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None




def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class ServerThread:
    """uvicorn serving ``app`` from a thread of the test process, on a free loopback port (lifespan on)."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 60, what="uvicorn to start")
        if not self.server.started:
            raise RuntimeError("the server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def die_with_parent() -> None:
    """``preexec_fn`` of a test's child process: the kernel SIGKILLs it when the test process dies, even of SIGKILL
    (``cluster.local.die_with_parent``). Only the child itself: ``kill`` ends its process group."""
    parent_death(signal.SIGKILL)


def regis_process(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``python -m regis ARGS`` as a child process (its own session, killed if the test process dies: see
    ``die_with_parent``), output to ``log``."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "regis", *args], env=full_env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL a child's whole process group (as a container stop past its grace period would)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM a child, SIGKILL it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc)
