"""How often RQ's registry-cleaning lock was left behind in a soak run, read from its Redis append-only file.

RQ's worker takes ``rq:clean_registries:<queue>`` (SET NX EX) before it cleans the queue's registries
(``StartedJobRegistry.cleanup`` re-queues the jobs of dead workers) and deletes it after. A lock set and never
deleted means a worker (or its Redis) was killed inside that window: until it expired no worker re-queued an
abandoned job (899 s with RQ's lock, ``maintenance_lock_s`` with regis's, ``indexer.worker``).

    python scripts/aof_cleaning_locks.py WORKDIR/appendonlydir [--queue soak-index]

Prints the number of lock takings, of those never deleted, and for each of those the seconds until the next
taking.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def commands(data: bytes):
    """Yield each command of a RESP append-only file as a list of bytes arguments (``*N`` arrays of bulk
    strings; a truncated tail, as Redis may leave after a kill, is ignored)."""
    pos, end = 0, len(data)
    while pos < end:
        if data[pos:pos + 1] != b"*":
            nl = data.find(b"\n", pos)  # not an array (a timestamp annotation "#TS:..."): skip the line
            if nl < 0:
                return
            pos = nl + 1
            continue
        nl = data.find(b"\r\n", pos)
        if nl < 0:
            return
        count = int(data[pos + 1:nl])
        pos = nl + 2
        args = []
        for _ in range(count):
            nl = data.find(b"\r\n", pos)
            if nl < 0 or data[pos:pos + 1] != b"$":
                return
            size = int(data[pos + 1:nl])
            start = nl + 2
            if start + size + 2 > end:
                return
            args.append(data[start:start + size])
            pos = start + size + 2
        yield args


def aof_files(folder: Path) -> list[Path]:
    """The incremental files of a multi-part append-only file, in the manifest's order."""
    manifest = folder / next(p.name for p in folder.iterdir() if p.name.endswith(".manifest"))
    names = []
    for line in manifest.read_text().splitlines():
        parts = line.split()
        fields = dict(zip(parts[::2], parts[1::2], strict=False))
        if fields.get("type") == "i":
            names.append(fields["file"])
    return [folder / n for n in names]


def _expires_ms(args: list[bytes]) -> int | None:
    """The absolute expiry (ms) of a SET as the append-only file keeps it (Redis writes ``EX n`` as ``PXAT t``)."""
    upper = [a.upper() for a in args]
    return int(args[upper.index(b"PXAT") + 1]) if b"PXAT" in upper else None


def lock_history(folder: Path, queue: str) -> dict:
    """{"taken": locks set, "left_behind": set and never deleted before the next taking (or the end of the
    file), "gaps_after_left_behind_s": for each lock left behind, seconds until the next taking (the time no
    worker could clean: the difference of their expiries, the lock's length being fixed)}."""
    key = f"rq:clean_registries:{queue}".encode()
    taken = left = 0
    held, last_expiry = False, None
    gaps: list[float] = []
    for path in aof_files(folder):
        for args in commands(path.read_bytes()):
            name = args[0].upper()
            if name == b"SET" and args[1] == key:
                expiry = _expires_ms(args)
                if held:
                    left += 1
                    if expiry is not None and last_expiry is not None:
                        gaps.append(round((expiry - last_expiry) / 1000, 1))
                held, taken, last_expiry = True, taken + 1, expiry
            elif name in (b"DEL", b"UNLINK") and key in args[1:]:
                held = False
    return {"taken": taken, "left_behind": left + held, "held_at_the_end": held,
            "gaps_after_left_behind_s": gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("appendonlydir", type=Path)
    parser.add_argument("--queue", default="soak-index")
    args = parser.parse_args()
    print(lock_history(args.appendonlydir, args.queue))


if __name__ == "__main__":
    main()
