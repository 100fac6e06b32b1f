"""Nothing is left behind by a crash (issue 27, item 9; embedded mode, the API runs the jobs): the audit found
staged uploads that survived a restart for 10 minutes, and uploaded files never removed when their image was
never indexed or its delete was committed (8 orphan files in 6 rounds). The API is killed inside each window
(``regis.faults``); after the next start nothing is left over: no staged batch, no file the index does not list,
no thumbnail of a deleted image, and the image written again is there exactly once."""

from __future__ import annotations

import io
import signal

import httpx
import numpy as np
import pytest
from deploy.support import kill
from PIL import Image

from faults.test_crash_points import _serve
from regis.indexes.uploads import STAGING_DIR

pytestmark = pytest.mark.slow


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _stored(uploads) -> list[str]:
    return sorted(f"{d.name}/{f.name}" for d in uploads.iterdir() if len(d.name) == 2 for f in d.iterdir())


def test_an_upload_killed_after_placing_its_file_leaves_nothing_after_restart(tmp_path):
    (tmp_path / "root").mkdir()
    uploads = tmp_path / "root" / ".uploads"
    proc, url = _serve(tmp_path, {"REGIS_CRASH_AT": "job.placed"}, "api-1.log")
    try:
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"{url}/v1/images", files={"files": ("a.png", _png(1))}, timeout=120)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert len(_stored(uploads)) == 1 and len(list((uploads / STAGING_DIR).iterdir())) == 1  # the window
    finally:
        kill(proc)
    proc, url = _serve(tmp_path, {}, "api-2.log")  # the default staging grace (600 s): embedded needs none
    try:
        assert _stored(uploads) == [] and list((uploads / STAGING_DIR).iterdir()) == []
        r = httpx.post(f"{url}/v1/images", files={"files": ("a.png", _png(1))}, timeout=120)
        assert r.status_code == 201 and r.json()["images"][0]["status"] == "added", r.text
        assert httpx.get(f"{url}/v1/images", timeout=30).json()["total"] == 1
        assert len(_stored(uploads)) == 1 and list((uploads / STAGING_DIR).iterdir()) == []
    finally:
        kill(proc)


def test_a_delete_killed_after_it_was_committed_leaves_nothing_after_restart(tmp_path):
    (tmp_path / "root").mkdir()
    uploads, thumbs = tmp_path / "root" / ".uploads", tmp_path / "index" / "thumbnails"
    proc, url = _serve(tmp_path, {"REGIS_CRASH_AT": "delete.committed"}, "api-1.log")
    try:
        r = httpx.post(f"{url}/v1/images", files=[("files", ("a.png", _png(1))), ("files", ("b.png", _png(2)))],
                       timeout=120)
        assert r.status_code == 201, r.text
        gone, kept = [im["id"] for im in r.json()["images"]]
        for image_id in (gone, kept):
            assert httpx.get(f"{url}/v1/images/{image_id}/thumbnail", timeout=30).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.delete(f"{url}/v1/images/{gone}", timeout=120)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert len(_stored(uploads)) == 2 and len(list(thumbs.rglob("*.jpg"))) == 2  # the window
    finally:
        kill(proc)
    proc, url = _serve(tmp_path, {}, "api-2.log")
    try:
        assert httpx.get(f"{url}/v1/images/{gone}", timeout=30).status_code == 404  # the delete was committed
        kept_sha = httpx.get(f"{url}/v1/images/{kept}", timeout=30).json()["sha256"]
        assert [name.split("/")[1].split(".")[0] for name in _stored(uploads)] == [kept_sha]
        assert [p.name.split("-")[0] for p in thumbs.rglob("*.jpg")] == [kept_sha]
    finally:
        kill(proc)
