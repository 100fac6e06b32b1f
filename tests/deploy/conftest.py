"""Fixtures of the deployment tests: real redis-server processes on free loopback ports (or
``REGIS_TEST_REDIS_URL``), unique key prefixes, and image roots made of the bundled photos."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from deploy.support import REDIS_SERVER, RedisProcess


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A Redis URL: ``REGIS_TEST_REDIS_URL`` if set (tests keep to their own key prefixes), else a
    redis-server started for the session on a free port."""
    configured = os.environ.get("REGIS_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make system-deps installs it) and REGIS_TEST_REDIS_URL is not set")
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test alone (to stop and restart it)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make system-deps installs it): this test stops its own Redis")
    server = RedisProcess(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    """A Redis key prefix of this test alone."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def images_root(tmp_path, photos_dir) -> Path:
    """An images root holding the 21 bundled photos in ``photos/``."""
    root = tmp_path / "images"
    shutil.copytree(photos_dir, root / "photos")
    return root
