"""Hostile requests the audit of issue 14 found getting through: ids past int64 and non-integer ids (fault 1),
a folder name past NAME_MAX (fault 2), bodies over the limit (fault 4), /healthz starved by busy threads
(fault 7), and 405 without ``Allow``. Each answer must be a 4xx with a JSON error, never a 500."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest
from deploy.support import TINY
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.settings import Settings


def _png(color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (80, 64), color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-inputs")
    (tmp / "images").mkdir()
    settings = Settings(index_dir=tmp / "index", images_root=tmp / "images", enable_jobs=True,
                        max_upload_bytes=200_000, **TINY)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/images", files=[("files", ("a.png", _png("red"))), ("files", ("b.png", _png("blue")))])
        assert r.status_code == 201, r.text
        c.ids = [im["id"] for im in r.json()["images"]]
        yield c


@pytest.mark.parametrize("path", ["/v1/images/{}", "/v1/images/{}/file"])
@pytest.mark.parametrize("raw", ["9223372036854775808", "99999999999999999999999", "-1", "1.0", "1e0", "+1",
                                 "%201", "0x1", "\u0661"])
def test_ids_that_are_not_int64_are_refused(client, path, raw):
    r = client.get(path.format(raw))
    assert r.status_code == 422, (raw, r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_request"


def test_delete_of_a_non_integer_id_deletes_nothing(client):
    target = client.ids[1]
    for raw in (f"{target}.0", "9223372036854775808", f"{target}e0"):
        r = client.delete(f"/v1/images/{raw}")
        assert r.status_code == 422, (raw, r.text)
    assert client.get(f"/v1/images/{target}").status_code == 200  # still there
    assert client.get("/v1/images/9223372036854775807").status_code == 404  # the largest id: just unknown


def test_405_says_which_methods_the_path_allows(client):
    for method, path, allowed in [("TRACE", "/v1/images/1", "DELETE, GET, PATCH"), ("PUT", "/v1/images", "GET, POST"),
                                  ("TRACE", "/healthz", "GET"), ("DELETE", "/v1/jobs", "GET")]:
        r = client.request(method, path)
        assert r.status_code == 405 and r.headers.get("allow") == allowed, (method, path, r.headers)
        assert r.json()["error"]["code"] == "method_not_allowed"


def test_a_folder_name_past_name_max_is_not_found_not_a_crash(client):
    for folder in ["a" * 256, "x/" + "b" * 300 + "/c", "é" * 200]:
        r = client.post("/v1/jobs/index", json={"folder": folder})
        assert r.status_code == 404 and r.json()["error"]["code"] == "folder_not_found", r.text


def _post_chunked(port: int, path: str, total: int) -> tuple[int, int]:
    """POST a file part of ``total`` bytes, chunked, over a raw socket, stopping as soon as the server answers
    or stops reading. Returns (HTTP status, bytes of body sent)."""
    import select
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    field = "file" if path == "/v1/search" else "files"
    part = f'--zz\r\nContent-Disposition: form-data; name="{field}"; filename="big.png"\r\n\r\n'.encode()
    sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")  # a well-formed file part that never ends
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 10)
            if readable or not writable:  # an early answer, or the server stopped reading for 10 s
                break
            sock.sendall(frame)
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server answered and closed while we were still sending
        pass
    head = sock.recv(65536).split(b"\r\n", 1)[0]
    sock.close()
    return int(head.split()[1]), sent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from deploy.support import ServerThread

    tmp = tmp_path_factory.mktemp("limits")
    app = create_app(Settings(index_dir=tmp / "index", images_root=tmp, enable_jobs=True, max_upload_bytes=200_000,
                              **TINY))
    with ServerThread(app) as s:
        yield s


@pytest.mark.parametrize("path, limit", [("/v1/search", 200_000 + 65536),
                                         ("/v1/images", 32 * (200_000 + 65536) + 65536)])
def test_a_body_over_the_limit_is_refused_while_it_streams(server, path, limit):
    """No Content-Length (chunked): the server stops reading at the limit and answers 413, instead of spooling
    the whole 64 MiB to a temporary file first (the socket buffers may hold a few MB more)."""
    status, sent = _post_chunked(server.port, path, 64 * 1024 * 1024)
    assert status == 413
    assert sent < limit + 8 * 1024 * 1024, f"the server took {sent:,} bytes before its 413"


def test_a_declared_length_over_the_limit_is_refused_before_reading(client):
    r = client.post("/v1/search", content=b"x" * 300_000, headers={"content-type": "multipart/form-data; boundary=zz"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


def test_healthz_answers_while_every_worker_thread_is_busy():
    """Two slow synchronous requests hold both threads of the pool: /healthz still answers at once (it runs
    on the event loop), so a busy container is not marked unhealthy."""
    import anyio.to_thread

    release = threading.Event()

    def slow_get(image_id):
        release.wait(20)
        return None

    app = create_app(Settings(index_dir="/nonexistent"), load=False)
    app.state.engine = SimpleNamespace(snapshot=SimpleNamespace(table=SimpleNamespace(get=slow_get), version=1))
    with TestClient(app) as c:
        c.portal.call(lambda: setattr(anyio.to_thread.current_default_thread_limiter(), "total_tokens", 2))
        busy = [threading.Thread(target=c.get, args=(f"/v1/images/{i}",)) for i in range(2)]
        for t in busy:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        try:
            healthz = threading.Thread(target=lambda: setattr(c, "health", c.get("/healthz")))
            healthz.start()
            healthz.join(timeout=5)
            waited = time.monotonic() - t0
        finally:
            release.set()
            for t in busy:
                t.join(timeout=20)
        assert waited < 2.0 and c.health.status_code == 200, f"/healthz waited {waited:.1f} s"
