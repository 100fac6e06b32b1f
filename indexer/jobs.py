"""Running one indexing job (``regis.jobs.model.JobSpec``): the code both the embedded queue (a thread of the
API) and ``regis worker`` call. Every job publishes at most one new index version, atomically."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from indexer.build import BuildOptions, build_index
from indexer.uploads import NewImage, add_images, delete_images
from regis.errors import ConfigError, IndexLockedError, RegisError
from regis.indexes.uploads import STAGING_DIR
from regis.jobs.folders import resolve_folder
from regis.jobs.model import MAX_SKIPPED_REPORTED, JobSpec
from regis.models.encoder import RegisEncoder

ProgressFn = Callable[[dict], None]


@dataclass
class JobContext:
    """Where and how jobs run.

    Attributes:
        index_dir: the index directory.
        uploads_dir: the uploads folder (``regis.indexes.uploads``).
        images_root: the only folder (with its subfolders) index jobs may read; None refuses index jobs.
        encoder: returns the encoder (called only by jobs that embed images).
        batch_size: images per forward pass.
        num_workers: DataLoader decoding processes (None: min(4, CPUs) for large jobs).
        lock_timeout_s: how long to wait for another writer of the index, seconds.
    """

    index_dir: Path
    uploads_dir: Path
    images_root: Path | None
    encoder: Callable[[], RegisEncoder]
    batch_size: int = 32
    num_workers: int | None = None
    lock_timeout_s: float = 300.0


def _discard_staging(uploads_dir: Path, spec: JobSpec) -> None:
    """Remove the staging batch folder(s) of an add job."""
    for batch in {PurePosixPath(u.staged).parts[1] for u in spec.uploads if u.staged.startswith(STAGING_DIR + "/")}:
        shutil.rmtree(Path(uploads_dir) / STAGING_DIR / batch, ignore_errors=True)


def execute_job(spec: JobSpec, ctx: JobContext, report: ProgressFn) -> dict:
    """Run a job and return its JSON-ready result (``version``: the published version, None if unchanged).

    ``report`` receives progress updates: {"phase"} and, while embedding, {"done", "total", "skipped",
    "images_per_s"} (done / total count the images to embed: new or changed files).

    Raises:
        FolderError / ConfigError: the folder is not allowed or no images root is configured; bad spec.
        IndexMismatchError: the index was built with another encoder.
        IndexLockedError: another writer held the index past ``ctx.lock_timeout_s``.
        IndexFormatError: a delete on a missing index.
    """

    def on_progress(p: dict) -> None:
        report({"phase": "embedding", **p})

    options = BuildOptions(batch_size=ctx.batch_size, num_workers=ctx.num_workers, progress=False,
                           on_progress=on_progress, lock_timeout_s=ctx.lock_timeout_s, images_root=ctx.images_root)
    if spec.kind == "index":
        from regis.sharding.layout import is_sharded

        if is_sharded(ctx.index_dir):
            from regis.sharding.engine import FOLDER_BUILDS

            raise ConfigError(FOLDER_BUILDS)
        if ctx.images_root is None:
            raise ConfigError("index jobs are disabled: no images root is configured (REGIS_IMAGES_ROOT)")
        folder, rel = resolve_folder(ctx.images_root, spec.folder or "")
        report({"phase": "scanning"})
        r = build_index(folder, ctx.index_dir, ctx.encoder(), options)
        embedded = r.added + r.updated + len(r.skipped)
        report({"phase": "written", "done": embedded, "total": embedded, "skipped": len(r.skipped)})
        return {
            "version": r.version, "folder": rel, "scanned": r.scanned, "added": r.added, "updated": r.updated,
            "deleted": r.deleted, "unchanged": r.unchanged + r.touched, "skipped_count": len(r.skipped),
            "skipped": r.skipped[:MAX_SKIPPED_REPORTED], "images_per_s": round(r.images_per_s, 2),
            "total_s": round(r.total_s, 3),
        }
    if spec.kind == "add":
        report({"phase": "embedding", "done": 0, "total": len(spec.uploads)})
        images = [NewImage(u.path, u.staged, u.sha256, u.metadata, u.filename) for u in spec.uploads]
        try:
            r = add_images(ctx.index_dir, ctx.uploads_dir, ctx.encoder(), images, options)
        except (IndexLockedError, OSError):  # worth a retry: keep the staged files
            raise
        except RegisError:  # refused for good: the staged files will never be used
            _discard_staging(ctx.uploads_dir, spec)
            raise
        _discard_staging(ctx.uploads_dir, spec)  # what is left there was skipped
        counts = {s: sum(1 for im in r.images if im["status"] == s) for s in ("added", "exists", "skipped")}
        report({"phase": "written", "done": len(images), "total": len(images), "skipped": counts["skipped"]})
        return {"version": r.version, "images": r.images, **counts, "total_s": round(r.total_s, 3)}
    if spec.kind == "delete":
        report({"phase": "writing"})
        r = delete_images(ctx.index_dir, spec.ids, ctx.uploads_dir, lock_timeout_s=ctx.lock_timeout_s)
        return r.to_json()
    if spec.kind == "metadata":
        from indexer.metadata import update_metadata

        report({"phase": "writing"})
        return update_metadata(ctx.index_dir, spec.ids[0], spec.metadata or {}, spec.replace_metadata,
                               lock_timeout_s=ctx.lock_timeout_s)
    raise ConfigError(f"unknown job kind {spec.kind!r}")
