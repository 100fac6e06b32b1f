"""The --ray options of the CLI refuse what they cannot serve or build, with a clear error, before Ray starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from regis.cli.main import app
from regis.errors import ConfigError, IndexFormatError


def test_serve_ray_needs_a_sharded_collection(lite0_index):
    result = CliRunner().invoke(app, ["serve", "--ray", "--index", str(lite0_index)])
    assert isinstance(result.exception, IndexFormatError)
    assert "is not a sharded collection" in str(result.exception)


def test_index_build_ray_needs_an_index_folder(tmp_path, photos_dir):
    result = CliRunner().invoke(app, ["index", "build", str(photos_dir), "--collection", "photos", "--root",
                                      str(tmp_path), "--ray"])
    assert isinstance(result.exception, ConfigError) and "--index PATH" in str(result.exception)
    with pytest.raises(ConfigError, match="num_shards must be between 1 and 4096"):
        from regis.sharding.layout import create_collection

        create_collection(tmp_path / "c", 0)
