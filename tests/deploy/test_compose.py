"""docker-compose.yml, its GPU override and the Dockerfiles: parsed and checked (no Docker engine needed).

The structural checks always run (PyYAML); ``docker-compose config`` (Debian's docker-compose package, or the
``docker compose`` plugin) validates the files against the Compose schema when installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
GPU = REPO / "docker-compose.gpu.yml"


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, GPU]], ids=["cpu", "gpu-override"])
def test_compose_files_pass_docker_compose_config(files, tmp_path):
    command = _compose_command()
    if command is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed "
                    "(make system-deps installs docker-compose); the structural checks still ran")
    args = [a for f in files for a in ("-f", str(f))]
    out = subprocess.run([*command, *args, "config"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == {"api", "worker", "redis"}
    dockerfile = "docker/Dockerfile.cuda" if GPU in files else "docker/Dockerfile.cpu"
    for name in ("api", "worker"):
        assert resolved["services"][name]["build"]["dockerfile"] == dockerfile
    broken = tmp_path / "broken.yml"
    broken.write_text(COMPOSE.read_text().replace("condition: service_healthy", "condition: whenever"))
    bad = subprocess.run([*command, "-f", str(broken), "config"], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert bad.returncode != 0  # the validator does reject an invalid file


def test_services_healthchecks_dependencies_and_volumes(compose):
    services = compose["services"]
    assert set(services) == {"api", "worker", "redis"}
    for name, svc in services.items():
        test = svc["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    assert services["redis"]["image"].startswith("redis:")
    assert "--appendonly" in services["redis"]["command"]
    declared = set(compose["volumes"])
    assert {"index", "images", "redis"} <= declared
    for name in ("api", "worker"):
        svc = services[name]
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        mounts = dict(v.split(":")[:2] for v in svc["volumes"])
        assert mounts == {"index": "/data/index", "images": "/data/images", "collections": "/data/collections",
                          "keys": "/data/keys"}, name
        env = svc["environment"]
        assert env["REGIS_REDIS_URL"].startswith("redis://redis:6379")
        assert env["REGIS_INDEX_DIR"] == "/data/index" and env["REGIS_IMAGES_ROOT"] == "/data/images"
        assert env["REGIS_UPLOADS_DIR"].startswith("/data/images/")
        assert env["REGIS_ENABLE_JOBS"] == "true" and env["REGIS_BACKBONE"]
        # secure by default: keys required (a file path is configured), CORS off
        assert env["REGIS_API_KEYS_FILE"] == "${REGIS_API_KEYS_FILE-/data/keys/keys.json}"
        assert env["REGIS_CORS_ORIGINS"] == "${REGIS_CORS_ORIGINS:-[]}"
        assert env["REGIS_COLLECTIONS_ROOT"] == "/data/collections"
        assert svc["build"]["dockerfile"] == "docker/Dockerfile.cpu"
        assert (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    assert services["api"]["command"][0] == "serve" and "0.0.0.0" in services["api"]["command"]
    assert any(str(p).endswith(":8000") for p in services["api"]["ports"])
    assert all(str(p).startswith("${REGIS_BIND:-127.0.0.1}:") for p in services["api"]["ports"])  # loopback
    assert services["worker"]["command"] == ["worker"]
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "regis", "worker", "--check"]
    assert "ports" not in services["worker"] and "ports" not in services["redis"]  # Redis stays private


def test_the_gpu_override_uses_the_cuda_image_and_reserves_a_gpu():
    gpu = yaml.safe_load(GPU.read_text())
    for name in ("api", "worker"):
        svc = gpu["services"][name]
        assert svc["build"]["dockerfile"] == "docker/Dockerfile.cuda"
        assert svc["environment"]["REGIS_DEVICE"] == "cuda"
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def _stages(dockerfile: Path) -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


@pytest.mark.parametrize("name, torch_index", [("Dockerfile.cpu", "download.pytorch.org/whl/cpu"),
                                               ("Dockerfile.cuda", "download.pytorch.org/whl/cu")])
def test_dockerfiles_are_multi_stage_non_root_and_install_dependencies_before_the_code(name, torch_index):
    stages = _stages(REPO / "docker" / name)
    assert len(stages) >= 2
    builder, runtime = stages[0], stages[-1]
    assert " AS builder" in builder[0] and " AS runtime" in runtime[0]

    def first(stage, pattern):
        return next(i for i, line in enumerate(stage) if re.search(pattern, line))

    torch_at = first(builder, re.escape(torch_index))
    deps_at = first(builder, r"pip install -r")
    code_at = first(builder, r"^COPY \. ")
    assert torch_at < deps_at < code_at  # the code is copied after every dependency is installed
    assert first(builder, r"^COPY pyproject\.toml") < deps_at
    assert first(builder, r"pip install --no-deps /src") > code_at
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(line.startswith("COPY --from=builder /opt/venv") for line in runtime)
    assert any(line.startswith("HEALTHCHECK ") and "/healthz" in line for line in runtime)
    assert any(line.startswith("ENTRYPOINT") and "regis" in line for line in runtime)
    assert not any("pip install" in line for line in runtime)  # nothing is built in the runtime stage
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", "tests", ".venv"} <= set(ignored)
