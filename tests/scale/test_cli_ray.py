"""The --ray options of the CLI: what they cannot serve or build is refused with a clear error before Ray starts;
``index build --ray --collection NAME`` builds into the named collection (with its encoder)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from regis.errors import ConfigError, IndexFormatError


def test_serve_ray_needs_a_sharded_collection(lite0_index):
    result = CliRunner().invoke(app, ["serve", "--ray", "--index", str(lite0_index)])
    assert isinstance(result.exception, IndexFormatError)
    assert "is not a sharded collection" in str(result.exception)


def test_index_build_ray_refuses_single_machine_options(tmp_path, photos_dir):
    result = CliRunner().invoke(app, ["index", "build", str(photos_dir), "--index", str(tmp_path / "c"), "--ray",
                                      "--replace"])
    assert isinstance(result.exception, ConfigError) and "--replace" in str(result.exception)
    assert not (tmp_path / "c").exists()
    with pytest.raises(ConfigError, match="num_shards must be between 1 and 4096"):
        from regis.sharding.layout import create_collection

        create_collection(tmp_path / "c", 0)


def test_index_build_ray_builds_into_a_named_collection(tmp_path, photos_dir, monkeypatch):
    """The Ray build itself is tests/scale/test_ray.py's; here: the collection is created under --root with the
    encoder asked for, and the build goes to its folder with the metadata rows."""
    import cluster.cli

    calls = []
    monkeypatch.setattr(cluster.cli, "build_ray_cli", lambda *args: calls.append(args))
    rows = tmp_path / "meta.jsonl"
    rows.write_text(json.dumps({"path": "skimage-coins.png", "album": "money"}) + "\n")
    result = CliRunner().invoke(app, ["index", "build", str(photos_dir), "--collection", "photos", "--root",
                                      str(tmp_path / "root"), "--ray", "--shards", "2", "--backbone",
                                      "vit-tiny-reg4-test", "--random-init", "--metadata", str(rows)])
    assert result.exit_code == 0, result.output
    (images, index, shards, encoder, index_options, _, _), = calls
    assert index == tmp_path / "root" / "photos" and shards == 2 and images == photos_dir
    assert encoder["backbone"] == "vit-tiny-reg4-test" and encoder["random_init"] is True
    assert index_options["metadata"] == {"skimage-coins.png": {"album": "money"}}
    config = json.loads(next((tmp_path / "root" / "photos").glob("*.json")).read_text())
    assert config["backbone"] == "vit-tiny-reg4-test" and config["random_init"] is True
