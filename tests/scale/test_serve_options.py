"""``regis serve --ray`` hands Ray Serve's HTTP proxy the keep-alive of ``regis serve`` (REGIS_KEEP_ALIVE_S), so
the proxy never closes an idle connection just as a client (httpx: 5 s) reuses it (fault 11 on Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="the Ray tests need Ray Serve: pip install 'regis[ray]'")

from ray.serve.config import HTTPOptions  # noqa: E402

import cluster.serve  # noqa: E402
from cluster.settings import RaySettings  # noqa: E402
from service.settings import Settings  # noqa: E402


def test_serve_start_gets_the_keep_alive_of_regis_serve(tmp_path, monkeypatch):
    import ray

    monkeypatch.setenv("REGIS_KEEP_ALIVE_S", "61.5")
    calls = {}
    import cluster.resources

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(cluster.serve, "read_layout", lambda collection: {"num_shards": 2})
    monkeypatch.setattr(cluster.resources, "cluster_cpus", lambda: ([2.0], 2.0))
    monkeypatch.setattr(cluster.serve.serve, "start", lambda **kwargs: calls.update(start=kwargs))
    monkeypatch.setattr(cluster.serve.serve, "run_many", lambda targets, **kwargs: calls.update(run=targets))
    monkeypatch.setattr(cluster.serve, "build_app", lambda *args: calls.update(app=args) or "app")
    monkeypatch.setattr(cluster.serve, "wait_until_running", lambda *args, **kwargs: calls.update(wait=args))
    settings = RaySettings(http_port=8123)
    cluster.serve.start(tmp_path, Settings(index_dir=tmp_path), settings)
    sized = calls["app"][2]  # the settings the deployments get: one node, so the shards are searched in the ingress
    assert sized.encoder_in_ingress() and sized.shard_placement == "ingress" and sized.ingress_num_cpus == 1.0
    assert calls["wait"][0] == settings.app_name and calls["wait"][2] == settings.start_timeout_s
    # two nodes: one deployment per shard, CPU requests sized to fit
    monkeypatch.setattr(cluster.resources, "cluster_cpus", lambda: ([1.0, 1.0], 2.0))
    cluster.serve.start(tmp_path, Settings(index_dir=tmp_path), settings)
    sized = calls["app"][2]
    assert sized.shard_placement == "deployment" and 2 * sized.shard_num_cpus + sized.ingress_num_cpus <= 2.0
    # one node, two ingress replicas: one deployment per shard too, sized with both ingress replicas
    monkeypatch.setattr(cluster.resources, "cluster_cpus", lambda: ([2.0], 2.0))
    cluster.serve.start(tmp_path, Settings(index_dir=tmp_path), settings.model_copy(update={"ingress_replicas": 2}))
    sized = calls["app"][2]
    assert sized.shard_placement == "deployment" and 2 * sized.shard_num_cpus + 2 * sized.ingress_num_cpus <= 2.0

    options = calls["start"]["http_options"]
    assert options == {"host": settings.http_host, "port": 8123, "keep_alive_timeout_s": 62}
    assert HTTPOptions(**options).keep_alive_timeout_s == 62  # an option this Ray's proxy takes
    assert calls["start"]["logging_config"] == {"enable_access_log": True}  # the proxy's line per request


@pytest.mark.parametrize("access_log", [True, False])
def test_only_the_ingress_logs_each_request(tmp_path, monkeypatch, access_log):
    """The shard and encoder deployments never write an access line per call (one per shard per batch, read
    again by Ray's log monitor: CPU for nothing); the ingress writes one per request unless REGIS_RAY_ACCESS_LOG=0
    (as regis serve's uvicorn, BENCHMARKS.md section 6 measures Ray Serve without)."""
    from ray.serve._private.build_app import build_app as ray_build_app
    from ray.serve.schema import LoggingConfig

    monkeypatch.setattr(cluster.serve, "read_layout", lambda collection: {"num_shards": 2})
    monkeypatch.setenv("REGIS_RAY_ACCESS_LOG", "1" if access_log else "0")
    app = cluster.serve.build_app(tmp_path, Settings(index_dir=tmp_path), RaySettings(encoder_placement="deployment"))
    built = ray_build_app(app, name="regis-test")
    got = {d.name: LoggingConfig(**d.logging_config).enable_access_log for d in built.deployments}
    assert got == {"Ingress": access_log, "Encoder": False, "shard-000": False, "shard-001": False}


def test_the_rayservice_proxy_keeps_idle_connections_as_long_as_regis_serve():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    service = yaml.safe_load((Path(__file__).parents[2] / "docker/ray/rayservice.yaml").read_text())
    config = ServeDeploySchema(**yaml.safe_load(service["spec"]["serveConfigV2"]))  # Ray's own validation
    assert config.http_options.keep_alive_timeout_s == Settings.model_fields["keep_alive_s"].default == 75


def test_every_deployment_gets_its_max_ongoing_requests_from_the_settings(tmp_path, monkeypatch):
    """Ray's own default (5 in flight per replica) queued requests in front of the one ingress from 8 clients on
    (BENCHMARKS.md section 6); the settings' values must reach the deployments Ray Serve builds."""
    from ray.serve._private.build_app import build_app as ray_build_app  # what serve.run builds the app with
    from ray.serve._private.constants import DEFAULT_MAX_ONGOING_REQUESTS

    monkeypatch.setattr(cluster.serve, "read_layout", lambda collection: {"num_shards": 2})
    settings = RaySettings(ingress_max_ongoing_requests=96, encoder_max_ongoing_requests=48,
                           shard_max_ongoing_requests=80, encoder_placement="deployment")
    app = cluster.serve.build_app(tmp_path, Settings(index_dir=tmp_path), settings)
    built = ray_build_app(app, name="regis-test")

    got = {d.name: d.max_ongoing_requests for d in built.deployments}
    assert got == {"Ingress": 96, "Encoder": 48, "shard-000": 80, "shard-001": 80}
    # on CPUs (no encoder GPU) queries are encoded in the ingress by default: no Encoder deployment, and the
    # ingress gets the encoder's CPU share
    built = ray_build_app(cluster.serve.build_app(tmp_path, Settings(index_dir=tmp_path), RaySettings()),
                          name="regis-test")
    assert {d.name: d.ray_actor_options["num_cpus"] for d in built.deployments} == {
        "Ingress": 1.0, "shard-000": 0.5, "shard-001": 0.5}
    assert RaySettings(encoder_num_gpus=1).encoder_in_ingress() is False
    # shards searched in the ingress: no shard deployment, the ingress alone
    built = ray_build_app(cluster.serve.build_app(tmp_path, Settings(index_dir=tmp_path),
                                                  RaySettings(shard_placement="ingress")), name="regis-test")
    assert {d.name: d.ray_actor_options["num_cpus"] for d in built.deployments} == {"Ingress": 1.0}
    assert built.ingress_deployment_name == "Ingress"
    defaults = RaySettings()
    assert min(defaults.ingress_max_ongoing_requests, defaults.encoder_max_ongoing_requests,
               defaults.shard_max_ongoing_requests) >= 2 * defaults.max_batch_size > DEFAULT_MAX_ONGOING_REQUESTS


@pytest.mark.parametrize("name", ["ingress_max_ongoing_requests", "encoder_max_ongoing_requests",
                                  "shard_max_ongoing_requests"])
def test_a_replica_that_could_never_fill_a_batch_is_refused(name):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=f"{name} \\(8\\) must be at least max_batch_size \\(16\\)"):
        RaySettings(max_batch_size=16, **{name: 8})


def test_the_rayservice_settings_are_valid_ray_settings(monkeypatch):
    import yaml

    service = yaml.safe_load((Path(__file__).parents[2] / "docker/ray/rayservice.yaml").read_text())
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    for name, value in app["runtime_env"]["env_vars"].items():
        monkeypatch.setenv(name, value)
    settings = RaySettings()  # refused if the GPU batch size outgrows what a replica admits
    assert settings.encoder_max_ongoing_requests >= 2 * settings.max_batch_size == 128


def test_the_shards_are_searched_in_the_ingress_on_one_node_unless_a_setting_asks_for_deployments():
    assert RaySettings().shards_in_ingress(1) is True
    assert RaySettings().shards_in_ingress(2) is False
    assert RaySettings().shards_in_ingress(None) is False  # an application built for a cluster (KubeRay)
    assert RaySettings(shard_replicas=2).shards_in_ingress(1) is False
    assert RaySettings(shard_num_cpus=0.5).shards_in_ingress(1) is False
    assert RaySettings(ingress_replicas=2).shards_in_ingress(1) is False  # else each replica holds every shard
    assert RaySettings(shard_placement="deployment").shards_in_ingress(1) is False
    assert RaySettings(shard_placement="ingress").shards_in_ingress(3) is True
    assert RaySettings(shard_placement="ingress", ingress_replicas=2).shards_in_ingress(1) is True  # as asked
    # resolved once (cluster.serve.start), then every part of the application reads the same answer
    for settings, nodes, deployments in ((RaySettings(), 1, 0), (RaySettings(), 2, 4),
                                         (RaySettings(ingress_replicas=3), 1, 4), (RaySettings(), None, 4),
                                         (RaySettings(shard_placement="ingress"), 2, 0)):
        resolved = settings.with_shard_placement(nodes)
        assert resolved.shard_placement == ("ingress" if deployments == 0 else "deployment")
        assert resolved.shard_deployments(4) == deployments and resolved.shards_in_ingress(5) is (deployments == 0)
    assert RaySettings().shard_deployments(4) == 4  # "auto" unresolved (app_from_args): one per shard
