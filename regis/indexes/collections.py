"""Collections: many named regis indexes under one root folder.

    ROOT/
      default/                  a collection = a regis index directory (``regis.indexes.layout``)
        collection.json         its CollectionConfig: the encoder it embeds with (before any version exists)
        CURRENT, versions/, segments/ ...
      shoes/
        ...

Each collection has its own encoder, manifest and versions; nothing is shared between them. A collection
exists when its folder holds ``collection.json`` or a published index (``CURRENT``). Deleting one renames its
folder out of sight first (``.deleted-<name>-<uuid>``), so readers never see half of it.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from regis.errors import ConfigError, RegisError
from regis.indexes.layout import CURRENT_FILE, VERSIONS_DIR, read_current, write_json_atomic

CONFIG_FILE = "collection.json"
DEFAULT_COLLECTION = "default"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
_DELETED_PREFIX = ".deleted-"


class CollectionNotFoundError(RegisError):
    """No collection of that name exists."""


class CollectionExistsError(RegisError):
    """A collection of that name exists already."""


class CollectionConfig(BaseModel):
    """What a collection embeds with, fixed when it is created (its index manifest then records the rest).

    Attributes:
        backbone: registered backbone name (``regis backbones``); None: efficientnet-lite0, the offline default.
        weights: weights file (None: the backbone's default weights).
        random_init: random weights (tests only).
        description: free text.
    """

    model_config = ConfigDict(extra="forbid")

    backbone: str | None = None
    weights: str | None = None
    random_init: bool = False
    description: str = Field(default="", max_length=1000)


def check_name(name: str) -> str:
    """``name`` if it is a valid collection name: 1-63 of a-z, 0-9, '_' and '-', starting with a letter or digit.

    Raises:
        ConfigError: anything else (also keeps names from reaching outside the root: no '/', '.', '..').
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"invalid collection name {str(name)[:80]!r}: use 1-63 characters of a-z, 0-9, '_' and "
                          "'-', starting with a letter or digit")
    return name


class CollectionsRoot:
    """The folder holding a deployment's collections.

    Args:
        root: the folder (created on the first ``create``).
    """

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser().resolve()

    def path(self, name: str) -> Path:
        """The index directory of collection ``name`` (whether or not it exists).

        Raises:
            ConfigError: an invalid name.
        """
        return self.root / check_name(name)

    def exists(self, name: str) -> bool:
        """Whether collection ``name`` exists (a config, a published index, or a sharded collection's record)."""
        from regis.sharding.layout import SHARDS_FILE

        path = self.path(name)
        return any((path / f).is_file() for f in (CONFIG_FILE, CURRENT_FILE, SHARDS_FILE))

    def names(self) -> list[str]:
        """Every collection, sorted by name."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if _NAME.match(p.name) and self.exists(p.name))

    def config(self, name: str) -> CollectionConfig:
        """The collection's config (an index built without ``create`` has the default one).

        Raises:
            CollectionNotFoundError: no such collection.
            ConfigError: an invalid name, or an unreadable ``collection.json``.
        """
        if not self.exists(name):
            raise CollectionNotFoundError(f"no collection named {name!r}")
        path = self.path(name) / CONFIG_FILE
        if not path.is_file():
            return CollectionConfig()
        try:
            return CollectionConfig.model_validate(json.loads(path.read_text()))
        except ValueError as exc:
            raise ConfigError(f"{path} is not a valid collection config") from exc

    def ensure(self, name: str, config: CollectionConfig | None = None) -> Path:
        """Create the collection unless it exists; returns its index directory."""
        try:
            return self.create(name, config)
        except CollectionExistsError:
            return self.path(name)

    def create(self, name: str, config: CollectionConfig | None = None) -> Path:
        """Create an empty collection; returns its index directory.

        Raises:
            CollectionExistsError: it exists already.
            ConfigError: an invalid name.
        """
        path = self.path(name)
        if self.exists(name):
            raise CollectionExistsError(f"collection {name!r} exists already")
        path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path / CONFIG_FILE, (config or CollectionConfig()).model_dump())
        return path

    def overrides(self, name: str) -> dict:
        """The settings a service or worker uses for collection ``name``: {"index_dir", "uploads_dir" (the
        collection's own ``uploads/``), "backbone", "weights", "random_init"} (its config).

        Raises:
            CollectionNotFoundError: no such collection.
        """
        config = self.config(name)
        path = self.path(name)
        return {"index_dir": path, "uploads_dir": path / "uploads", "backbone": config.backbone,
                "weights": Path(config.weights) if config.weights else None, "random_init": config.random_init}

    def describe(self, name: str) -> dict:
        """{"name", "config", "index_version", "images", "backbone", "path"} of a collection (no index loaded:
        read from the live manifest).

        Raises:
            CollectionNotFoundError: no such collection.
        """

        config = self.config(name)
        path = self.path(name)
        version, images, manifest = self._published(path)
        return {
            "name": name,
            "config": config.model_dump(),
            "index_version": version,
            "images": images,
            "backbone": manifest.encoder.backbone if manifest else (config.backbone or "efficientnet-lite0"),
            "images_root": manifest.images_root if manifest else None,
        }

    @staticmethod
    def _published(path: Path):
        """(version, images, a manifest) of the state published in ``path`` (a sharded collection: its record's
        version, every shard's images, its first shard's manifest); (None, 0, None) before the first version."""
        from regis.indexes.manifest import read_manifest
        from regis.sharding.layout import is_sharded, read_state, shard_dir

        if is_sharded(path):
            state = read_state(path)
            manifests = [read_manifest(shard_dir(path, s) / VERSIONS_DIR / n) for s, n in enumerate(state.names) if n]
            if not manifests:
                return None, 0, None
            return state.version, sum(m.num_images for m in manifests), manifests[0]
        current = read_current(path)
        manifest = read_manifest(path / VERSIONS_DIR / current) if current else None
        return (manifest.version, manifest.num_images, manifest) if manifest else (None, 0, None)

    def delete(self, name: str) -> None:
        """Remove a collection and everything in it (renamed away first, then deleted).

        Raises:
            CollectionNotFoundError: no such collection.
        """
        if not self.exists(name):
            raise CollectionNotFoundError(f"no collection named {name!r}")
        path = self.path(name)
        grave = self.root / f"{_DELETED_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        path.rename(grave)
        shutil.rmtree(grave, ignore_errors=True)
