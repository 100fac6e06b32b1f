"""API keys: read or write scope, stored hashed in a JSON file (``REGIS_API_KEYS_FILE``), made with
``regis keys create``.

A key is ``regis_<id>_<secret>``: ``id`` (8 hex digits) names it in listings and revocations, ``secret`` is 32
random bytes (URL-safe base64). The file keeps only the SHA-256 of the whole key: with 256 random bits a fast
hash is enough (nothing to brute-force), and a leaked file grants nothing. The service re-reads the file when
it changes (checked on each request by its inode, size and mtime), so a revoked key stops working at once.

Clients send ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. Read keys may search, list and read
images; write keys may also upload, delete, patch metadata, run jobs and change collections.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from regis.errors import ConfigError
from regis.indexes.layout import write_json_atomic

Scope = Literal["read", "write"]
PREFIX = "regis_"


class KeyRecord(BaseModel):
    """One key as stored: never the key itself."""

    id: str = Field(pattern=r"^[0-9a-f]{8}$")
    name: str = Field(default="", max_length=200)
    scope: Scope
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: str
    revoked_at: str | None = None


class KeyFile(BaseModel):
    """The keys file."""

    keys: list[KeyRecord] = Field(default_factory=list)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_keys(path: Path) -> KeyFile:
    """The keys file (empty when it does not exist).

    Raises:
        ConfigError: unreadable or invalid file (the message names it).
    """
    try:
        raw = Path(path).read_text()
    except FileNotFoundError:
        return KeyFile()
    except OSError as exc:
        raise ConfigError(f"cannot read the API keys file {path}: {exc.strerror}") from None
    try:
        return KeyFile.model_validate(json.loads(raw))
    except ValueError:
        raise ConfigError(f"{path} is not a valid API keys file") from None


def create_key(path: Path, scope: Scope, name: str = "") -> tuple[str, KeyRecord]:
    """Make a key, store its hash; returns (the key, shown only now, its record).

    Raises:
        ConfigError: a bad scope or keys file.
    """
    if scope not in ("read", "write"):
        raise ConfigError(f"scope must be 'read' or 'write', got {scope!r}")
    keys = read_keys(path)
    taken = {k.id for k in keys.keys}
    key_id = secrets.token_hex(4)
    while key_id in taken:
        key_id = secrets.token_hex(4)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    record = KeyRecord(id=key_id, name=name, scope=scope, sha256=_hash(key), created_at=_now())
    keys.keys.append(record)
    _write(path, keys)
    return key, record


def revoke_key(path: Path, key_id: str) -> KeyRecord:
    """Revoke a key by id (it stays listed, marked revoked).

    Raises:
        ConfigError: no such key.
    """
    keys = read_keys(path)
    for record in keys.keys:
        if record.id == key_id:
            if record.revoked_at is None:
                record.revoked_at = _now()
                _write(path, keys)
            return record
    raise ConfigError(f"no API key with id {key_id!r} in {path}")


def _write(path: Path, keys: KeyFile) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, keys.model_dump())
    os.chmod(path, 0o600)


class KeyStore:
    """The service's view of the keys file, re-read whenever the file changes.

    Args:
        path: the keys file (REGIS_API_KEYS_FILE); a missing file means no valid key (every request 401).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._stamp: tuple | None = None
        self._by_hash: dict[str, KeyRecord] = {}
        self._lock = threading.Lock()

    def _load(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and (stamp is not None or not self._by_hash):
            return
        with self._lock:
            keys = read_keys(self.path) if stamp is not None else KeyFile()
            self._by_hash = {k.sha256: k for k in keys.keys if k.revoked_at is None}
            self._stamp = stamp

    def check(self, key: str | None) -> KeyRecord | None:
        """The live record of ``key``, None for a missing, unknown or revoked key (constant-time compare)."""
        if not key or not key.startswith(PREFIX) or len(key) > 200:
            return None
        self._load()
        digest = _hash(key)
        for known, record in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return record
        return None
