"""Zero-configuration Ray: the README's ``--ray`` commands with no cluster running and no REGIS_RAY_* / RAY_*
variable set. ``regis index build --ray`` and ``regis serve --ray`` start a local cluster (every server on
127.0.0.1), size the deployments' CPU requests from its CPUs so that everything is scheduled, say where they
serve, report the true image count and each shard's state in /readyz, and leave no process behind when stopped
(SIGTERM) or when a deployment cannot be scheduled (one line naming the setting). Subprocesses: the command must
import Ray itself (``cluster.connect``).

Also, without starting Ray: the CPU sizing (``cluster.resources``), the choice between joining and starting a
cluster (``cluster.connect.cluster_to_join``) and the start-up wait's verdicts (``cluster.serve.wait_until_running``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.resources import fits, size_requests
from cluster.settings import RaySettings
from regis.errors import ConfigError

RAY_INSTALLED = (Path(sys.executable).with_name("ray")).exists()
needs_ray = pytest.mark.skipif(not RAY_INSTALLED or os.environ.get("REGIS_SKIP_RAY") == "1",
                               reason="needs Ray (pip install 'regis[ray]'); REGIS_SKIP_RAY=1 turns it off")
TINY = ["--backbone", "vit-tiny-reg4-test", "--random-init"]


# ----------------------------------------------------------------------------------------------- sizing (no Ray)
def test_the_default_requests_are_scaled_down_until_every_replica_fits_two_cpus():
    """Today's full shares (1 + 2 x 0.5 + 0.25 = 2.25 CPUs) do not fit 2 CPUs: the ingress waited forever."""
    sizing = size_requests(RaySettings(encoder_placement="deployment"), num_shards=2, nodes=[2.0])
    assert sizing.fits and all(sizing.sized.values())
    c = sizing.cpus
    assert c["encoder"] + 2 * c["shard"] + c["ingress"] <= 2.0
    assert c["encoder"] == pytest.approx(2 * c["shard"], rel=0.01) == pytest.approx(4 * c["ingress"], rel=0.02)
    assert c["encoder"] > 0.7  # scaled by 0.9 steps: no more than needed
    roomy = size_requests(RaySettings(encoder_placement="deployment"), num_shards=2, nodes=[8.0])
    assert roomy.cpus == {"encoder": 1.0, "shard": 0.5, "ingress": 0.25}
    # the CPU default: queries encoded in the ingress, which gets the encoder's share (1 + 2 x 0.5 fits 2 CPUs)
    default = size_requests(RaySettings(), num_shards=2, nodes=[2.0])
    assert default.fits and default.cpus == {"shard": 0.5, "ingress": 1.0}
    assert size_requests(RaySettings(), num_shards=4, nodes=[2.0]).cpus["ingress"] < 1.0


def test_sizing_packs_the_replicas_onto_nodes_and_keeps_explicit_requests():
    # two 1-CPU nodes: the total fits at 0.9 (2.025 > 2: no), but the nodes must hold the replicas too
    sizing = size_requests(RaySettings(shard_replicas=2, encoder_placement="deployment"), num_shards=2,
                           nodes=[1.0, 1.0])
    c = sizing.cpus
    assert sizing.fits and fits([c["encoder"]] + [c["shard"]] * 4 + [c["ingress"]], [1.0, 1.0])
    explicit = size_requests(RaySettings(encoder_num_cpus=1.5, encoder_placement="deployment"), num_shards=2,
                             nodes=[2.0])
    assert explicit.cpus["encoder"] == 1.5 and not explicit.sized["encoder"] and explicit.fits
    assert explicit.cpus["shard"] * 2 + explicit.cpus["ingress"] <= 0.5
    stuck = size_requests(RaySettings(encoder_num_cpus=1, shard_num_cpus=0.5, ingress_num_cpus=0.25,
                                      encoder_placement="deployment"), 2, [2.0])
    assert not stuck.fits and stuck.cpus == {"encoder": 1, "shard": 0.5, "ingress": 0.25}
    busy = size_requests(RaySettings(encoder_placement="deployment"), num_shards=2, nodes=[2.0],
                         free=1.0)  # a joined cluster, half in use
    assert busy.fits and sum(busy.cpus[r] * n for r, n in (("encoder", 1), ("shard", 2), ("ingress", 1))) <= 1.0
    assert fits([0.6, 0.6], [1.0, 1.0]) and not fits([0.6, 0.6], [1.1])


def test_an_empty_cpu_variable_means_sized(monkeypatch):
    monkeypatch.setenv("REGIS_RAY_SHARD_NUM_CPUS", "")
    monkeypatch.setenv("REGIS_RAY_ENCODER_NUM_CPUS", "0.75")
    settings = RaySettings()
    assert settings.shard_num_cpus is None and settings.encoder_num_cpus == 0.75


# ---------------------------------------------------------------------------------------- join or start (no Ray)
def test_auto_joins_ray_address_or_a_recorded_cluster_that_answers_else_starts_a_local_one(tmp_path, monkeypatch):
    import socket

    from cluster.connect import cluster_to_join

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert cluster_to_join("auto") is None  # nothing recorded: a local cluster
    assert cluster_to_join(None) is None and cluster_to_join("") is None
    assert cluster_to_join("10.0.0.5:6379") == "10.0.0.5:6379"
    (tmp_path / "ray").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{s.getsockname()[1]}\n")
        assert cluster_to_join("auto") == f"127.0.0.1:{s.getsockname()[1]}"
    assert cluster_to_join("auto") is None  # recorded, but nothing answers there any more: a local cluster
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert cluster_to_join("auto") == "ray://head:10001"


# ------------------------------------------------------------------------------------------- start-up verdicts
def _status(app_status: str, **deployments):
    deps = {name: SimpleNamespace(status=f"DeploymentStatus.{st}", message=msg)
            for name, (st, msg) in deployments.items()}
    return lambda: SimpleNamespace(applications={"regis": SimpleNamespace(status=f"ApplicationStatus.{app_status}",
                                                                          message="", deployments=deps)})


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


pytest.importorskip("ray.serve", reason="cluster.serve needs Ray Serve: pip install 'regis[ray]'")


def test_a_deployment_ray_cannot_place_fails_the_start_with_one_line_naming_its_setting():
    from cluster.serve import wait_until_running

    cpus = {"encoder": 1.0, "shard": 0.5, "ingress": 0.25}
    status = _status("DEPLOYING", Encoder=("HEALTHY", ""), **{"shard-000": ("HEALTHY", ""),
                                                               "shard-001": ("UPDATING", "taken more than 30s")})
    clock = _Clock()
    with pytest.raises(ConfigError) as err:
        wait_until_running("regis", cpus, 60, status=status, pending=lambda: [0.5], free=lambda: 0.0, clock=clock,
                           sleep=clock.sleep)
    message = str(err.value)
    assert "\n" not in message and "shard-001" in message and "REGIS_RAY_SHARD_NUM_CPUS" in message
    assert "within 60 s" in message and clock.t == 60
    # a replica whose worker is still starting (its request is not among Ray's pending demands) is waited for
    clock, said = _Clock(), []
    calls = iter([status] * 100 + [_status("RUNNING")])
    wait_until_running("regis", cpus, 60, status=lambda: next(calls)(), pending=lambda: [], free=lambda: 0.0,
                       clock=clock, sleep=clock.sleep, say=said.append)
    assert clock.t == 100 and said[0].startswith("regis: still starting after 30 s: shard-001")


def test_a_deployment_that_fails_to_start_is_one_line():
    from cluster.serve import wait_until_running

    status = _status("DEPLOY_FAILED", Ingress=("DEPLOY_FAILED", "Traceback (most recent call last):\n  File x\n"
                                                                "IndexFormatError: no shard has a version\n"))
    with pytest.raises(ConfigError, match="^Ray Serve could not start deployment Ingress: IndexFormatError: no shard"):
        wait_until_running("regis", {}, 60, status=status, pending=lambda: [], clock=_Clock(), sleep=lambda s: None)


# -------------------------------------------------------------------------------- the README commands, for real
def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "REGIS_"))}
    env["RAY_TMPDIR"] = str(tmp_path / "no-ray-here")  # no `ray start` cluster recorded for this test
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    return env


def _regis(*args: str, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "regis", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


def _assert_nothing_left(pids: set[int], within_s: float = 20) -> None:
    from scale.procs import alive

    deadline = time.monotonic() + within_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pids), f"processes left running: {sorted(alive(pids))}"


@pytest.fixture(scope="module")
def local_collection(tmp_path_factory, photos_dir):
    """`regis index build PHOTOS --index COLLECTION --ray --shards 2` with no cluster running: it starts one,
    builds, and stops it."""
    if not RAY_INSTALLED or os.environ.get("REGIS_SKIP_RAY") == "1":
        pytest.skip("needs Ray (pip install 'regis[ray]'); REGIS_SKIP_RAY=1 turns it off")
    tmp = tmp_path_factory.mktemp("ray-local")
    proc = _regis("index", "build", str(photos_dir), "--index", str(tmp / "collection"), "--ray", "--shards", "2",
                  *TINY, env=_env(tmp), cwd=tmp)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "started a local Ray cluster at 127.0.0.1:" in out and "added, 0 updated" in out, out[-3000:]
    record = json.loads((tmp / "collection" / "shards.json").read_text())
    assert record["num_shards"] == 2 and record["version"] == 1 and all(record["shards"])
    return tmp / "collection"


@needs_ray
@pytest.mark.heavy
def test_serve_ray_comes_up_from_nothing_on_loopback_and_leaves_no_process(local_collection, photos_dir, tmp_path):
    import httpx
    from fastapi.testclient import TestClient

    from cluster.local import _free_port
    from scale.procs import descendants, listening
    from service.app import create_app
    from service.settings import Settings

    port = _free_port()
    proc = _regis("serve", "--ray", "--index", str(local_collection), "--port", str(port), env=_env(tmp_path),
                  cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 420
        while not any("regis on Ray Serve: http://127.0.0.1:" in ln for ln in list(lines)):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=60).json()
        n = len(list(photos_dir.iterdir()))
        assert ready["ready"] and ready["images"] == n and ready["checks"]["shards"] == "ok", ready
        assert [(s["shard"], s["state"]) for s in ready["shards"]] == [(0, "ok"), (1, "ok")]
        assert sum(s["images"] for s in ready["shards"]) == n
        photo = sorted(photos_dir.iterdir())[0]
        params = {"k": 5, "mode": "exact"}
        got = httpx.post(f"http://127.0.0.1:{port}/v1/search", params=params, timeout=60,
                         files={"file": (photo.name, photo.read_bytes(), "image/jpeg")})
        assert got.status_code == 200, got.text
        with TestClient(create_app(Settings(index_dir=local_collection))) as embedded:
            want = embedded.post("/v1/search", params=params, files={"file": (photo.name, photo.read_bytes())})
        assert [h["id"] for h in got.json()["results"]] == [h["id"] for h in want.json()["results"]]
        started = descendants(proc.pid)
        assert len(started) >= 5  # the node, its GCS and raylet, the Serve replicas ...
        sockets = listening(started | {proc.pid})
        assert sockets and {ip for _, ip in sockets} == {"127.0.0.1"}, sockets
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        reader.join(timeout=10)
    assert proc.returncode == 0, "".join(lines)[-2000:]
    assert "regis: stopping" in "".join(lines)
    _assert_nothing_left(started)


@needs_ray
@pytest.mark.heavy
def test_a_deployment_that_cannot_be_scheduled_is_one_line_and_leaves_no_process(local_collection, tmp_path):
    from cluster.local import _free_port
    from scale.procs import descendants

    env = {**_env(tmp_path), "REGIS_RAY_SHARD_NUM_CPUS": "64", "REGIS_RAY_START_TIMEOUT_S": "5"}
    proc = _regis("serve", "--ray", "--index", str(local_collection), "--port", str(_free_port()), env=env,
                  cwd=tmp_path)
    started: set[int] = set()
    while proc.poll() is None:  # what it runs, sampled until it ends
        started |= descendants(proc.pid)
        time.sleep(0.5)
    out = proc.stdout.read()
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, out[-3000:]
    assert "Ray could not schedule deployment shard-00" in errors[0] and "REGIS_RAY_SHARD_NUM_CPUS" in errors[0]
    assert "Traceback" not in out
    assert started
    _assert_nothing_left(started)


