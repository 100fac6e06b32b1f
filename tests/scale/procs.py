"""What a process started, read from /proc (Linux): its descendants and the TCP ports they listen on. For the
tests that check ``--ray`` leaves nothing running and listens on 127.0.0.1 only."""

from __future__ import annotations

import os
from pathlib import Path


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...) now."""
    children, found, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids) -> set[int]:
    """The processes of ``pids`` still running (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _address(hex_addr: str) -> str:
    """The IP of a /proc/net/tcp{,6} local address (hex, little-endian words)."""
    ip = hex_addr.split(":")[0]
    if len(ip) == 8:
        return ".".join(str(int(ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
    words = [ip[i : i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped
        return ".".join(str(b) for b in raw[12:])
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def listening(pids) -> list[tuple[int, str]]:
    """(pid, local IP) of every listening TCP socket the processes ``pids`` hold."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in owner:  # state 0A: LISTEN
                out.append((owner[fields[9]], _address(fields[1])))
    return out
