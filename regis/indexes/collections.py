"""Collections: many named regis indexes under one root folder.

    ROOT/
      default/                  a collection = a regis index directory (``regis.indexes.layout``)
        collection.json         its CollectionConfig: the encoder it embeds with (before any version exists)
        CURRENT, versions/, segments/ ...
      shoes/
        ...

Each collection has its own encoder, manifest and versions; nothing is shared between them. A collection
exists when its folder holds ``collection.json`` or a published index (``CURRENT``).

Deleting one is a state change every writer sees: its folder is renamed out of sight (``.deleted-<name>-<uuid>``,
so readers never see half of it, then removed) and an empty *file* takes its name, a tombstone. A writer that
was under way (an index job, an upload being staged, a thumbnail) cannot recreate the folder through it: every
``mkdir`` or ``open`` below ``ROOT/<name>/`` fails (``NotADirectoryError``), where a plain rename let a job's
``mkdir(parents=True)`` bring the collection back with the job's images and a default config (issue 27, item 4).
Only ``create`` removes a tombstone, and a collection created again gets a new ``uid``, so a job queued for the
old one is refused (``check_alive``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from regis.errors import ConfigError, RegisError
from regis.indexes.layout import CURRENT_FILE, VERSIONS_DIR, fsync_dir, read_current, write_json_atomic
from regis.models.registry import DEFAULT_BACKBONE
from regis.settings_types import FrameName, IndexLayoutName, QueryLayoutName

CONFIG_FILE = "collection.json"
DEFAULT_COLLECTION = "default"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
_DELETED_PREFIX = ".deleted-"
COMPACT_LAYOUT = "compact"


class CollectionNotFoundError(RegisError):
    """No collection of that name exists."""


class CollectionExistsError(RegisError):
    """A collection of that name exists already."""


class CollectionDeletedError(CollectionNotFoundError):
    """The collection a job or request was for has been deleted (or deleted and created again) meanwhile."""


class CollectionConfig(BaseModel):
    """What a collection embeds with, fixed when it is created (its index manifest then records the rest).

    Attributes:
        backbone: registered backbone name (``regis backbones``); None: efficientnet-lite0, the offline default.
        weights: weights file (None: the backbone's default weights).
        random_init: random weights (tests only).
        frame, query_layout: the encoder's (``regis.models.encoder.EncoderConfig``; None: its default); the index
            manifest then records them and queries follow it.
        description: free text.
        layout: how its index is stored, fixed by the first version written: "default" (regis's FAISS codec and
            token store, ~4 KB resident per image at 256-d) or "compact" (what ``regis index build --compact``
            writes: FAISS codes of D/16 bytes per token and ``codes.compact_store``, ~1.1-1.2 KB per image, lower
            recall; docs/SCALE.md section 0). ``writer_options`` maps it to ``IndexWriter`` arguments; the
            manifest then keeps it (``FaissInfo.codec``, ``TokenStoreInfo.rule``). Configs written before the
            field existed load as "default".
        uid: this incarnation of the collection (set by ``create``; a collection deleted and created again under
            the same name gets another one). None for collections made before uids existed.
    """

    model_config = ConfigDict(extra="forbid")

    backbone: str | None = None
    weights: str | None = None
    random_init: bool = False
    frame: FrameName | None = None
    query_layout: QueryLayoutName | None = None
    description: str = Field(default="", max_length=1000)
    uid: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    layout: IndexLayoutName = "default"

    def writer_options(self) -> dict[str, str]:
        """The ``IndexWriter`` keyword arguments of this collection's first index version: {"faiss_codec":
        "compact", "token_store": "compact"} for the compact layout (as ``regis index build --compact``), {} for
        the default one (regis's choices). Later versions need none: the manifest keeps what the first recorded
        (``indexer.writers.open_writer`` passes these only while the index has no version; in a sharded
        collection ``regis.sharding.write.new_shard_options`` gives them to each shard's first version while no
        shard has one, and ``regis.sharding.reshard`` to every new shard)."""
        if self.layout == COMPACT_LAYOUT:
            return {"faiss_codec": COMPACT_LAYOUT, "token_store": COMPACT_LAYOUT}
        return {}


def read_config(index_dir: Path | str) -> CollectionConfig | None:
    """The ``CollectionConfig`` in ``index_dir/collection.json``; None when there is none (an index made without
    ``create``, a deleted collection's tombstone).

    Raises:
        ConfigError: the file is not a valid collection config.
    """
    path = Path(index_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return CollectionConfig.model_validate(json.loads(path.read_text()))
    except ValueError as exc:
        raise ConfigError(f"{path} is not a valid collection config") from exc


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

    def is_tombstone(self, name: str) -> bool:
        """Whether ``name`` was deleted (its tombstone file is there) and not created again."""
        return self.path(name).is_file()

    def names(self) -> list[str]:
        """Every collection, sorted by name."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if _NAME.match(p.name) and self.exists(p.name))

    def uid(self, name: str) -> str | None:
        """The collection's incarnation (``CollectionConfig.uid``; None for one made before uids).

        Raises:
            CollectionNotFoundError: no such collection.
        """
        return self.config(name).uid

    def check_alive(self, name: str, uid: str | None) -> None:
        """Refuse work for a collection that is gone, or was deleted and created again since ``uid`` was read.

        Raises:
            CollectionDeletedError: it was deleted (or is another incarnation now).
        """
        try:
            current = self.config(name).uid
        except (CollectionNotFoundError, ConfigError):
            raise CollectionDeletedError(f"collection {name!r} was deleted") from None
        if uid is not None and current != uid:
            raise CollectionDeletedError(f"collection {name!r} was deleted (and created again since)")

    def config(self, name: str) -> CollectionConfig:
        """The collection's config (an index built without ``create`` has the default one).

        Raises:
            CollectionNotFoundError: no such collection.
            ConfigError: an invalid name, or an unreadable ``collection.json``.
        """
        if not self.exists(name):
            raise CollectionNotFoundError(f"no collection named {name!r}")
        return read_config(self.path(name)) or CollectionConfig()

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
        if path.is_file():  # the tombstone of a deleted collection of that name
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        config = (config or CollectionConfig()).model_copy(update={"uid": uuid.uuid4().hex})
        write_json_atomic(path / CONFIG_FILE, config.model_dump())
        return path

    def overrides(self, name: str) -> dict:
        """The settings a service or worker uses for collection ``name``: {"index_dir", "uploads_dir" (the
        collection's own ``uploads/``), "backbone", "weights", "random_init", "frame", "query_layout"} (its
        config).

        Raises:
            CollectionNotFoundError: no such collection.
        """
        config = self.config(name)
        path = self.path(name)
        return {"index_dir": path, "uploads_dir": path / "uploads", "backbone": config.backbone,
                "weights": Path(config.weights) if config.weights else None, "random_init": config.random_init,
                "frame": config.frame, "query_layout": config.query_layout}

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
            "backbone": manifest.encoder.backbone if manifest else (config.backbone or DEFAULT_BACKBONE),
            "images_root": manifest.images_root if manifest else None,
        }

    @staticmethod
    def _published(path: Path):
        """(version, images, a manifest) of the state published in ``path`` (a sharded collection: its record's
        version, every shard's images, its first shard's manifest); (None, 0, None) before the first version."""
        from regis.indexes.manifest import read_manifest
        from regis.sharding.layout import is_sharded, read_state

        if is_sharded(path):
            state = read_state(path)
            manifests = [read_manifest(state.shard_path(path, s) / VERSIONS_DIR / n)
                         for s, n in enumerate(state.names) if n]
            if not manifests:
                return None, 0, None
            return state.version, sum(m.num_images for m in manifests), manifests[0]
        current = read_current(path)
        manifest = read_manifest(path / VERSIONS_DIR / current) if current else None
        return (manifest.version, manifest.num_images, manifest) if manifest else (None, 0, None)

    def delete(self, name: str, purge: bool = True) -> None:
        """Remove a collection and everything in it: renamed away, a tombstone put in its place (module
        docstring), then the renamed folder deleted (``purge``; else left to ``clean_graves``).

        Raises:
            CollectionNotFoundError: no such collection.
        """
        if not self.exists(name):
            raise CollectionNotFoundError(f"no collection named {name!r}")
        path = self.path(name)
        graves = []
        for _ in range(10):  # a writer may recreate the folder between the rename and the tombstone: again
            if path.is_dir():
                grave = self.root / f"{_DELETED_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
                path.rename(grave)
                graves.append(grave)
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                if path.is_file():
                    break
        else:
            raise CollectionDeletedError(f"collection {name!r} kept coming back while being deleted")
        fsync_dir(self.root)
        for grave in graves if purge else ():
            shutil.rmtree(grave, ignore_errors=True)

    def clean_graves(self) -> list[str]:
        """Remove what deletes left behind (a process killed while removing a renamed folder)."""
        if not self.root.is_dir():
            return []
        left = [p for p in self.root.iterdir() if p.name.startswith(_DELETED_PREFIX) and p.is_dir()]
        for p in left:
            shutil.rmtree(p, ignore_errors=True)
        return [p.name for p in left]
