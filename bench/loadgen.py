"""A cheap HTTP load generator for the service benchmarks: pre-encoded requests over keep-alive sockets.

The service benchmark shares the machine's cores with the server it measures, so the client must cost as
little CPU as possible: every request's bytes (request line, headers, multipart body) are built once before the
clock starts; ``clients`` asyncio connections on one event loop each send their requests one after the other
and read each response (``Content-Length`` or chunked) without parsing it; the JSON bodies are parsed after the
level ends. A thread per client with ``httpx.Client`` (what ``bench.service`` used before) spent several ms of
Python per request on the same 2 cores as the server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from urllib.parse import urlsplit


def multipart_request(url: str, data: bytes, filename: str = "q.jpg", content_type: str = "image/jpeg",
                      field: str = "file") -> bytes:
    """The full HTTP/1.1 request bytes of a POST of one file as multipart/form-data (keep-alive).

    Args:
        url: ``http://host:port/path?query``.
        data: the file's bytes.

    Returns:
        Bytes ready to write to a socket.
    """
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: {content_type}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: keep-alive\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response: (status code, body bytes). Handles Content-Length and chunked bodies."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length, chunked = None, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readline()  # the empty trailer
                return status, bytes(body)
            body += await reader.readexactly(size)
            await reader.readline()
    return status, (await reader.readexactly(length)) if length else b""


async def _client(host: str, port: int, requests: list[bytes], out: list) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for req in requests:
            t0 = time.perf_counter()
            writer.write(req)
            status, body = await _read_response(reader)
            out.append((t0, time.perf_counter() - t0, status, body))
    finally:
        writer.close()


def run_load(url: str, payloads: list[bytes], clients: int, total: int) -> dict:
    """``total`` requests (POST ``url`` with one of ``payloads`` as the multipart ``file``) from ``clients``
    concurrent keep-alive connections.

    Returns:
        {"latencies_s": [per successful request, s], "errors": [status codes or exception names],
        "timings": [the server's ``timings_ms`` of each successful response], "sent_s": [when each successful
        request was written, ``time.perf_counter()`` s], "wall_s": s,
        "client_cpu_s": this process's CPU time during the run, s (user + system)}.
    """
    parts = urlsplit(url)
    built = [multipart_request(url, p) for p in payloads]
    per = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    queues = [[built[(i * 7 + j) % len(built)] for j in range(per[i])] for i in range(clients)]
    outs: list[list] = [[] for _ in range(clients)]

    async def main() -> list:
        clients_ = (_client(parts.hostname, parts.port, q, o) for q, o in zip(queues, outs, strict=True))
        return await asyncio.gather(*clients_, return_exceptions=True)

    cpu0, t0 = time.process_time(), time.perf_counter()
    failures = asyncio.run(main())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    latencies, errors, timings, sent = [], [type(f).__name__ for f in failures if isinstance(f, BaseException)], [], []
    for out in outs:
        for sent_at, dt, status, body in out:
            if status != 200:
                errors.append(status)
                continue
            latencies.append(dt)
            sent.append(sent_at)
            timings.append(json.loads(body).get("timings_ms", {}))
    return {"latencies_s": latencies, "errors": errors, "timings": timings, "sent_s": sent, "wall_s": wall,
            "client_cpu_s": cpu}
