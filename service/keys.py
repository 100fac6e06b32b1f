"""API keys: read or write scope, stored hashed in a JSON file (``REGIS_API_KEYS_FILE``), made with
``regis keys create``.

A key is ``regis_<id>_<secret>``: ``id`` (8 hex digits) names it in listings and revocations, ``secret`` is 32
random bytes (URL-safe base64). The file keeps only the SHA-256 of the whole key: with 256 random bits a fast
hash is enough (nothing to brute-force), and a leaked file grants nothing. The service re-reads the file when
it changes (checked on each request by its inode, size and mtime), so a revoked key stops working at once.

Clients send ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. Read keys may search, list and read
images; write keys may also upload, delete, patch metadata, run jobs and change collections. A key made with
``--collection NAME`` (one or more) is limited to those collections (``KeyRecord.allows``).

A keys file that cannot be read or parsed (half-written by hand, say) never fails requests with a 500: the
service keeps the keys it last read and logs the problem; before any good read every request answers 503
``keys_unavailable`` (``KeysUnavailableError``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from regis.errors import ConfigError
from regis.indexes.collections import NAME_PATTERN
from regis.indexes.layout import write_json_atomic

Scope = Literal["read", "write"]
PREFIX = "regis_"
log = logging.getLogger("regis.service")


class KeysUnavailableError(ConfigError):
    """The keys file has never been read successfully by this process (no key can be checked)."""


class KeyRecord(BaseModel):
    """One key as stored: never the key itself."""

    id: str = Field(pattern=r"^[0-9a-f]{8}$")
    name: str = Field(default="", max_length=200)
    scope: Scope
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: str
    revoked_at: str | None = None
    collections: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = None

    def allows(self, collection: str) -> bool:
        """Whether this key may use collection ``collection`` (keys without ``collections`` may use every one)."""
        return self.collections is None or collection in self.collections

    @property
    def restricted(self) -> bool:
        """Whether the key is limited to named collections."""
        return self.collections is not None


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
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return KeyFile()
    except OSError as exc:
        raise ConfigError(f"cannot read the API keys file {path}: {exc.strerror}") from None
    try:
        return KeyFile.model_validate(json.loads(raw))
    except (ValueError, RecursionError):
        raise ConfigError(f"{path} is not a valid API keys file") from None


def create_key(path: Path, scope: Scope, name: str = "",
               collections: list[str] | None = None) -> tuple[str, KeyRecord]:
    """Make a key, store its hash; returns (the key, shown only now, its record).

    Args:
        path: the keys file.
        scope: "read" or "write".
        name: what the key is for.
        collections: the collections the key may use (None: every one; ``KeyRecord.allows``).

    Raises:
        ConfigError: a bad scope, collection name or keys file.
    """
    from regis.indexes.collections import check_name

    if scope not in ("read", "write"):
        raise ConfigError(f"scope must be 'read' or 'write', got {scope!r}")
    if collections is not None:
        if not collections:
            raise ConfigError("a key limited to collections needs at least one collection name")
        collections = sorted({check_name(c) for c in collections})
    keys = read_keys(path)
    taken = {k.id for k in keys.keys}
    key_id = secrets.token_hex(4)
    while key_id in taken:
        key_id = secrets.token_hex(4)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    record = KeyRecord(id=key_id, name=name, scope=scope, sha256=_hash(key), created_at=_now(),
                       collections=collections)
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
        self._loaded = False  # a good read happened (a missing file counts: no keys)
        self._lock = threading.Lock()

    def _load(self) -> None:
        try:
            st = self.path.stat()
            stamp: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = ("missing",)
        except OSError:
            stamp = ("unreadable",)
        if stamp == self._stamp:
            if not self._loaded:
                raise KeysUnavailableError("the API keys file cannot be read")
            return
        with self._lock:
            try:
                keys = read_keys(self.path)  # a missing file: no keys
            except ConfigError as exc:  # half-written, invalid or unreadable: keep the keys read last
                self._stamp = stamp  # read again when the file changes, not on every request
                log.error("%s; %s", exc, "keeping the keys read before" if self._loaded else
                          "every request is refused (503) until it can be read")
                if not self._loaded:
                    raise KeysUnavailableError("the API keys file cannot be read") from None
                return
            self._by_hash = {k.sha256: k for k in keys.keys if k.revoked_at is None}
            self._stamp = stamp
            self._loaded = True

    def check(self, key: str | None) -> KeyRecord | None:
        """The live record of ``key``, None for a missing, unknown or revoked key (constant-time compare).

        Raises:
            KeysUnavailableError: the keys file has never been read (it is unreadable or invalid).
        """
        if not key or not key.startswith(PREFIX) or len(key) > 200:
            return None
        self._load()
        digest = _hash(key)
        for known, record in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return record
        return None
