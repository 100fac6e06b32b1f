"""Forms are counted while they stream (issue 27, item 5): a request with more file parts than
REGIS_MAX_UPLOAD_FILES, or one file part over REGIS_MAX_UPLOAD_BYTES, is refused (413) at that part, not after
the framework's parser has spooled everything up to the route's total limit. Before, /v1/search/batch with a
read key parsed 600 parts of 1 MB (each spooled in memory) before its 32-file check, and a chunked file part was
read up to 32 x the file limit before the 413. The counts below are of the bytes the server read before it
answered; each test failed on the code before (the server read everything sent)."""

from __future__ import annotations

import select
import socket

import pytest
from deploy.support import TINY, ServerThread

from service.app import create_app
from service.settings import Settings

MB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forms")
    app = create_app(Settings(index_dir=tmp / "index", images_root=tmp, enable_jobs=True, max_upload_files=4,
                              **TINY))  # REGIS_MAX_UPLOAD_BYTES: the default 20 MB
    with ServerThread(app) as s:
        yield s


def _stream_form(port: int, path: str, parts: list[tuple[str, str | None, int]]) -> tuple[int, bytes, int]:
    """POST a multipart form, chunked, over a raw socket: ``parts`` = (field, filename or None, bytes of data).
    Stops sending as soon as the server answers (or stops reading for 10 s). Returns (HTTP status, the response
    head and body start, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    block = b"x" * (256 * 1024)

    def frames():
        for field, filename, size in parts:
            name = f'; filename="{filename}"' if filename else ""
            yield f'--zz\r\nContent-Disposition: form-data; name="{field}"{name}\r\n\r\n'.encode()
            while size > 0:
                yield block[:size]
                size -= len(block)
            yield b"\r\n"
        yield b"--zz--\r\n"

    sent, answered = 0, False
    try:
        for data in frames():
            readable, writable, _ = select.select([sock], [sock], [], 10)
            if readable or not writable:
                answered = True
                break
            sock.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            sent += len(data)
        if not answered:
            sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server answered and closed while we were still sending
        pass
    reply = _response(sock)
    sock.close()
    return int(reply.split(b"\r\n", 1)[0].split()[1]), reply, sent


def _response(sock) -> bytes:
    """The response head and body (by its Content-Length)."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(65536)
        if not chunk:
            return reply
        reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("path, field", [("/v1/search/batch", "files"), ("/v1/images", "files")])
def test_parts_past_the_file_count_are_refused_at_the_first_one_over(server, path, field):
    """200 parts of 256 KiB (50 MB, under the route's total): refused at the 5th file part."""
    status, reply, sent = _stream_form(server.port, path, [(field, f"{i}.png", 256 * 1024) for i in range(200)])
    assert status == 413 and b"too_many_files" in reply, reply[:300]
    assert sent < 20 * MB, f"the server read {sent / MB:.0f} MB before its 413"  # the socket buffers hold a few MB


@pytest.mark.parametrize("path, field", [("/v1/search", "file"), ("/v1/search/batch", "files"),
                                         ("/v1/images", "files")])
def test_a_file_part_over_the_file_limit_is_refused_at_the_limit(server, path, field):
    """One 70 MB file part (under the upload route's 4 x 20 MB total): refused once it passes 20 MB."""
    status, reply, sent = _stream_form(server.port, path, [(field, "big.png", 70 * MB)])
    assert status == 413 and b"payload_too_large" in reply, reply[:300]
    assert sent < 40 * MB, f"the server read {sent / MB:.0f} MB before its 413"


def test_many_text_fields_or_a_huge_one_are_refused(server):
    """(Part headers are bounded by python-multipart itself: "Maximum header size exceeded", 400.)"""
    status, reply, _ = _stream_form(server.port, "/v1/images", [(f"f{i}", None, 10) for i in range(50)])
    assert status == 413, reply[:300]
    status, reply, sent = _stream_form(server.port, "/v1/images", [("metadata", None, 60 * MB)])
    assert status == 413 and sent < 20 * MB, (reply[:300], sent)


def test_forms_within_the_limits_still_work(server, photos_dir):
    import httpx

    data = (photos_dir / "skimage-coffee.png").read_bytes()
    r = httpx.post(f"{server.url}/v1/images", files=[("files", (f"{i}.png", data + bytes([i]))) for i in range(4)],
                   data={"metadata": '{"a": 1}'}, timeout=120)
    assert r.status_code == 201, r.text
    r = httpx.post(f"{server.url}/v1/search/batch", files=[("files", ("q.png", data))] * 4, timeout=120)
    assert r.status_code == 200 and len(r.json()["results"]) == 4, r.text
