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
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(cluster.serve.serve, "start", lambda **kwargs: calls.update(start=kwargs))
    monkeypatch.setattr(cluster.serve.serve, "run", lambda app, **kwargs: calls.update(run=kwargs))
    monkeypatch.setattr(cluster.serve, "build_app", lambda *args: "app")
    settings = RaySettings(http_port=8123)
    cluster.serve.start(tmp_path, Settings(index_dir=tmp_path), settings)

    options = calls["start"]["http_options"]
    assert options == {"host": settings.http_host, "port": 8123, "keep_alive_timeout_s": 62}
    assert HTTPOptions(**options).keep_alive_timeout_s == 62  # an option this Ray's proxy takes


def test_the_rayservice_proxy_keeps_idle_connections_as_long_as_regis_serve():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    service = yaml.safe_load((Path(__file__).parents[2] / "docker/ray/rayservice.yaml").read_text())
    config = ServeDeploySchema(**yaml.safe_load(service["spec"]["serveConfigV2"]))  # Ray's own validation
    assert config.http_options.keep_alive_timeout_s == Settings.model_fields["keep_alive_s"].default == 75
