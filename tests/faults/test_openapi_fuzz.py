"""Schemathesis against the service's own OpenAPI schema (issue 14, fault 1): ``st run`` (every phase:
coverage, fuzzing, stateful; every check) over real HTTP against a live server holding an index, bounded to
5 examples per operation and 40 s. Every answer must be documented (status code, content type, body
schema, headers, ``Allow`` of a 405), no request may cause a 5xx, and a schema-invalid request may not be
accepted. ``tests/faults/schemathesis.toml`` says where a schema-valid request may still be refused (image
bodies that do not decode)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy.support import TINY, ServerThread
from PIL import Image

from service.app import create_app
from service.settings import Settings

CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.mark.slow
@pytest.mark.heavy  # the single slowest test of make test: 27 s of CPU (a server and schemathesis' 37 operations)
def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path):
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    if st is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    (tmp_path / "images").mkdir()
    settings = Settings(index_dir=tmp_path / "index", images_root=tmp_path / "images", enable_jobs=True,
                        max_upload_bytes=100_000, write_wait_s=5, **TINY)
    with ServerThread(create_app(settings)) as server:
        import httpx

        buf = io.BytesIO()
        Image.new("RGB", (64, 64), "green").save(buf, format="PNG")
        r = httpx.post(f"{server.url}/v1/images", files={"files": ("g.png", buf.getvalue())}, timeout=60)
        assert r.status_code == 201, r.text
        run = subprocess.run(
            [st, "--no-color", "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json",
             "--max-examples", "5", "--seed", "1", "--max-time", "40", "--request-timeout", "30"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
