"""The service's collections: one ``LiveIndex`` (and one embedded job queue) per collection, opened lazily.

The default collection is the service's ``index_dir`` (``REGIS_INDEX_DIR``, else ``COLLECTIONS_ROOT/default``)
and is loaded at startup, as before collections existed; the routes without ``/collections/{name}`` answer
from it. Other collections live under ``REGIS_COLLECTIONS_ROOT`` (``regis.indexes.collections``) and are
opened on their first request, each with its own encoder (several backbones can be served at once).

A deleted collection is gone for every request at once: ``delete`` drops it from the registry, tombstones its
folder (``regis.indexes.collections``: no job under way can bring it back), fails the jobs its embedded queue
still held (``collection_deleted``) and refuses later submissions; every write looks the collection up again
(one ``stat``), so a write on another replica answers 404 too, and the index watcher closes collections whose
folder is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from regis.indexes.collections import (
    CollectionConfig,
    CollectionExistsError,
    CollectionNotFoundError,
    CollectionsRoot,
)
from regis.indexes.layout import read_current
from regis.jobs.model import JobError
from regis.models.registry import DEFAULT_BACKBONE
from service.errors import APIError
from service.live import LiveIndex

log = logging.getLogger("regis.service")


class CollectionRegistry:
    """Name -> live index of every collection this service has opened.

    Args:
        settings: the service settings.
        default: the default collection's live index (already loaded).
        default_jobs: the default collection's job queue (None: read-only service).
        on_swap: called with (collection, version) after a collection swaps versions.
    """

    def __init__(self, settings, default: LiveIndex | None, default_jobs=None,
                 on_swap: Callable[[str, int], None] | None = None):
        self.settings = settings
        self.root = CollectionsRoot(settings.collections_root) if settings.collections_root else None
        self.default_name = settings.default_collection
        self.on_swap = on_swap
        self._live: dict[str, LiveIndex] = {}
        self._jobs: dict[str, object] = {}
        self._settings: dict[str, object] = {}
        if default is not None:
            self._live[self.default_name] = default
        if default_jobs is not None:
            self._jobs[self.default_name] = default_jobs
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lookup
    def _require_root(self) -> CollectionsRoot:
        if self.root is None:
            raise APIError(404, "collections_disabled", "this service serves one index; set "
                                                        "REGIS_COLLECTIONS_ROOT to hold several collections")
        return self.root

    def exists(self, name: str) -> bool:
        """Whether ``name`` is a collection of this service."""
        if name == self.default_name:
            return True
        return self.root is not None and self.root.exists(name)

    def _check(self, name: str) -> None:
        if not self.exists(name):
            raise APIError(404, "collection_not_found", f"no collection named {name!r}")

    def settings_for(self, name: str):
        """The service settings as collection ``name`` sees them: its index directory, its encoder choice and
        its own uploads folder.

        Raises:
            APIError: 404 for an unknown (or deleted) collection.
        """
        if name == self.default_name:
            return self.settings
        self._check(name)  # every time: deleted by another replica meanwhile
        found = self._settings.get(name)
        if found is None:
            found = self._settings[name] = self.settings.model_copy(update=self._require_root().overrides(name))
        return found

    def live(self, name: str) -> LiveIndex:
        """The collection's live index, opened on first use (its newest version, if it has one yet).

        Raises:
            APIError: 404 for an unknown collection.
        """
        found = self._live.get(name)
        if found is not None:
            return found
        with self._lock:  # under the lock: a delete either comes before this (404) or drops what this opens
            self._check(name)
            found = self._live.get(name)
            if found is None:
                found = LiveIndex(self.settings_for(name),
                                  on_swap=(lambda v, n=name: self.on_swap(n, v)) if self.on_swap else None)
                found.refresh()  # opens the live version when there is one; else waits for the first
                self._live[name] = found
                log.info("collection %s opened (index version %s)", name, found.version)
        return found

    def jobs(self, name: str):
        """The collection's job queue (embedded queue per collection, or the shared Redis queue).

        Raises:
            APIError: 404 unknown collection; 403 read-only service.
        """
        queue = self._jobs.get(name)
        if queue is not None:
            if name != self.default_name:
                self._check(name)  # deleted by another replica meanwhile
            return queue
        if self._jobs.get(self.default_name) is None:
            raise APIError(403, "jobs_disabled", "this service is read-only: set REGIS_ENABLE_JOBS=true to index "
                                                 "folders, upload and delete images")
        live = self.live(name)
        settings = self.settings_for(name)
        with self._lock:
            self._check(name)
            queue = self._jobs.get(name)
            if queue is None:
                from service.jobs import make_job_queue

                queue = make_job_queue(settings, live, collection=name, uid=self._require_root().uid(name))
                self._jobs[name] = queue
        return queue

    def refresh(self) -> bool:
        """Refresh every opened collection (the index watcher calls this), closing those deleted meanwhile (by
        another replica); True when any swapped."""
        swapped = False
        for name, live in list(self._live.items()):
            if name != self.default_name and not self.exists(name):
                self._forget(name)
                continue
            try:
                swapped = live.refresh() or swapped
            except Exception:  # one bad collection must not stop the others
                log.exception("refreshing collection %s failed", live.index_dir)
        return swapped

    def _forget(self, name: str) -> None:
        """Drop a deleted collection: its queued jobs fail (``collection_deleted``), later submissions are refused,
        its index is dropped, not closed: searches under way finish on the version they hold, and its table
        connection and memory maps go when the last of them returns, as a swapped-out version's do (closing it
        under them answered 500, "Cannot operate on a closed database": found by scripts/soak.py)."""
        with self._lock:
            live = self._live.pop(name, None)
            queue = self._jobs.pop(name, None)
            self._settings.pop(name, None)
        if queue is not None:
            try:
                queue.close(cancel=JobError(code="collection_deleted", message=f"collection {name!r} was deleted"))
            except Exception:
                log.exception("stopping the jobs of collection %s", name)
        if live is not None or queue is not None:
            log.info("collection %s deleted: closed", name)

    # ------------------------------------------------------------------ management
    def names(self) -> list[str]:
        """Every collection: the default one too, unless it is a collections root's default collection that holds
        no index and that this read-only service cannot write (``default_missing``)."""
        names = set(self.root.names()) if self.root is not None else set()
        if not self.default_missing() or self._jobs.get(self.default_name) is not None:
            names.add(self.default_name)
        return sorted(names)

    def default_missing(self) -> bool:
        """Whether the default collection is a collections root's (``LiveIndex.is_default_collection``) that has
        no index version to search."""
        live = self._live.get(self.default_name)
        return live is not None and live.engine is None and live.is_default_collection

    def default_created(self) -> bool:
        """Whether the default collection of a collections root exists there (a config or an index under its
        name): then a route without /collections/{name} searches it, empty or not, instead of answering 404."""
        return self.root is not None and self.root.exists(self.default_name)

    def searchable_names(self) -> list[str]:
        """The collections that hold an index version (what a search can be sent to), by name."""
        out = []
        for name in self.names():
            live = self._live.get(name)
            if live is not None and live.engine is not None:
                out.append(name)
            elif self.root is not None and self.root.exists(name) and read_current(self.root.path(name)):
                out.append(name)
        return out

    def no_default_error(self) -> APIError:
        """The 404 of a default-collection route when ``default_missing``: it names the collections to use."""
        names = self.searchable_names()
        listed = ", ".join(names[:20]) + (f" (and {len(names) - 20} more)" if len(names) > 20 else "")
        where = f"search one of its collections: {listed}" if names else "it has no collection with images yet"
        return APIError(404, "no_default_collection",
                        f"this service has no default collection ({self.default_name!r} holds no index); {where}, "
                        "under /v1/collections/{name}/search", collections=names)

    def describe(self, name: str) -> dict:
        """{"name", "default", "loaded", "index_version", "images", "backbone", "layout", "config"} of a
        collection."""
        self._check(name)
        live = self._live.get(name)
        engine = live.engine if live is not None else None
        if engine is not None:
            snapshot = engine.snapshot
            manifest = snapshot.manifest  # a sharded collection's: its first shard's (the encoder is the same)
            config = (self.root.config(name).model_dump() if self.root is not None and self.root.exists(name)
                      else CollectionConfig().model_dump())
            body = {"index_version": snapshot.version,
                    "images": len(snapshot) if live.sharded else manifest.num_images,
                    "backbone": manifest.encoder.backbone, "config": config}
        elif self.root is not None and self.root.exists(name):
            body = self.root.describe(name)
            body.pop("images_root", None)
        else:  # the default collection before its first version
            body = {"index_version": None, "images": 0, "config": CollectionConfig().model_dump(),
                    "backbone": self.settings.backbone or DEFAULT_BACKBONE}
        return {**body, "name": name, "default": name == self.default_name, "loaded": engine is not None,
                "layout": body["config"]["layout"]}

    def create(self, name: str, config: CollectionConfig) -> dict:
        """Create an empty collection.

        Raises:
            APIError: 404 collections disabled; 409 it exists.
        """
        root = self._require_root()
        if name == self.default_name or root.exists(name):
            raise APIError(409, "collection_exists", f"collection {name!r} exists already")
        try:
            root.create(name, config)
        except CollectionExistsError:
            raise APIError(409, "collection_exists", f"collection {name!r} exists already") from None
        return self.describe(name)

    def delete(self, name: str) -> None:
        """Close and delete a collection (not the default one).

        Raises:
            APIError: 404 unknown; 409 the default collection.
        """
        root = self._require_root()
        if name == self.default_name:
            raise APIError(409, "collection_protected", "the default collection cannot be deleted")
        with self._lock:  # no live index or queue can be opened for it meanwhile (live(), jobs())
            self._check(name)
            try:  # from here on no writer can bring it back (a tombstone takes its place)
                root.delete(name, purge=False)
            except CollectionNotFoundError:
                raise APIError(404, "collection_not_found", f"no collection named {name!r}") from None
        self._forget(name)
        root.clean_graves()  # the renamed folder, outside the lock

    def close(self) -> None:
        """Close every opened collection but the default one (the app closes that)."""
        for name in list(self._live):
            if name == self.default_name:
                continue
            queue = self._jobs.pop(name, None)
            if queue is not None:
                try:
                    queue.close()
                except Exception:
                    log.exception("stopping the jobs of collection %s", name)
            self._live.pop(name).close()
