"""The Ray deployment files: docker-compose.ray.yml (a head and a worker node under the ``ray`` profile) and the
KubeRay RayService manifest, parsed and checked against the code they name (no Docker or Kubernetes needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_compose_profile_runs_a_ray_head_and_a_worker_node():
    compose = yaml.safe_load((REPO / "docker-compose.ray.yml").read_text())
    head, worker = compose["services"]["ray-head"], compose["services"]["ray-worker"]
    for svc in (head, worker):
        assert svc["profiles"] == ["ray"] and svc["image"].endswith("regis:ray}")
        assert {v.split(":")[1] for v in svc["volumes"]} == {"/data/collection", "/data/images"}
        assert svc["healthcheck"]["test"][:3] == ["CMD", "ray", "status"]
    assert head["command"][:3] == ["ray", "start", "--head"] and "--block" in head["command"]
    assert "--address=ray-head:6379" in worker["command"] and "--port=6379" in head["command"]
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert any(str(p).endswith(":8000") for p in head["ports"]) and "ports" not in worker
    dockerfile = (REPO / "docker" / "Dockerfile.ray").read_text()
    assert "ray[serve,data]" in dockerfile and "USER regis" in dockerfile


def test_rayservice_manifest_names_the_application_builder():
    service = yaml.safe_load((REPO / "docker" / "ray" / "rayservice.yaml").read_text())
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    app = config["applications"][0]
    assert app["args"]["collection"].startswith("/data/")
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"].startswith("regis:ray")
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert "nvidia.com/gpu" in groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    from cluster.settings import RaySettings

    for name in app["runtime_env"]["env_vars"]:  # every variable is a real setting
        assert name.removeprefix("REGIS_RAY_").lower() in RaySettings.model_fields, name
    module, _, attr = app["import_path"].partition(":")  # the builder exists (read, not imported: Ray is slow)
    source = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    builder = [f for f in source.body if isinstance(f, ast.FunctionDef) and f.name == attr]
    assert builder and [a.arg for a in builder[0].args.args] == ["args"]
