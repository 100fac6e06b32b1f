"""Running one indexing job (``regis.jobs.model.JobSpec``): the code both the embedded queue (a thread of the
API) and ``regis worker`` call. Every job publishes at most one new index version, atomically."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from indexer.build import BuildOptions, BuildReport, build_index
from indexer.job_record import published_report
from indexer.uploads import AddReport, DeleteReport, NewImage, add_images, delete_images
from regis.errors import ConfigError, IndexLockedError, RegisError
from regis.faults import crash_point
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
        job_id: the queue's id of the job (None: not from a queue that may run it again); recorded with the
            version the job publishes, so that a re-run reports the first run's result (``indexer.job_record``).
        check_alive: for a named collection: raises ``CollectionDeletedError`` once it is deleted (or is
            another incarnation); called before the job and when it fails, so a job whose collection went away
            under it fails saying so (not with the ``OSError`` its writes met at the tombstone).
    """

    index_dir: Path
    uploads_dir: Path
    images_root: Path | None
    encoder: Callable[[], RegisEncoder]
    batch_size: int = 32
    num_workers: int | None = None
    lock_timeout_s: float = 300.0
    job_id: str | None = None
    check_alive: Callable[[], None] | None = None


def _discard_staging(uploads_dir: Path, spec: JobSpec) -> None:
    """Remove the staging batch folder(s) of an add job."""
    for batch in {PurePosixPath(u.staged).parts[1] for u in spec.uploads if u.staged.startswith(STAGING_DIR + "/")}:
        shutil.rmtree(Path(uploads_dir) / STAGING_DIR / batch, ignore_errors=True)


def _index_result(r: BuildReport, folder: str) -> dict:
    """An index job's result from its build report (``folder``: relative to the images root)."""
    return {
        "version": r.version, "folder": folder, "scanned": r.scanned, "added": r.added, "updated": r.updated,
        "deleted": r.deleted, "unchanged": r.unchanged + r.touched, "skipped_count": len(r.skipped),
        "skipped": r.skipped[:MAX_SKIPPED_REPORTED], "images_per_s": round(r.images_per_s, 2),
        "total_s": round(r.total_s, 3),
    }


def _add_result(r: AddReport) -> dict:
    """An add job's result from its report: per image, and the counts per status."""
    counts = {s: sum(1 for im in r.images if im["status"] == s) for s in ("added", "exists", "skipped")}
    return {"version": r.version, "images": r.images, **counts, "total_s": round(r.total_s, 3)}


def _replay(spec: JobSpec, ctx: JobContext) -> dict | None:
    """The result of an earlier run of this very job (``ctx.job_id``) whose version is live, from the report it
    saved with that version, marked ``"replayed": true``; None when there is none (``indexer.job_record``). An
    add job's staged files are discarded (the earlier run may have stopped before it did)."""
    if spec.kind not in ("index", "add", "delete", "metadata"):
        return None
    found = published_report(ctx.index_dir, ctx.job_id)
    if found is None:
        return None
    version, saved = found
    if spec.kind == "index":
        names = {f.name for f in dataclasses.fields(BuildReport)}
        r = BuildReport(**{k: v for k, v in saved.items() if k in names})
        r.version = version
        result = _index_result(r, resolve_folder(ctx.images_root, spec.folder or "")[1]
                               if ctx.images_root is not None else spec.folder or "")
    elif spec.kind == "add":
        _discard_staging(ctx.uploads_dir, spec)
        result = _add_result(AddReport(version=version, images=saved.get("images", []),
                                       total_s=saved.get("total_s", 0.0)))
    elif spec.kind == "delete":
        result = DeleteReport(version=version, deleted=saved.get("deleted", []),
                              missing=saved.get("missing", [])).to_json()
    else:
        result = {"version": version, **saved.get("result", {})}
    return {**result, "replayed": True}


def execute_job(spec: JobSpec, ctx: JobContext, report: ProgressFn) -> dict:
    """Run a job and return its JSON-ready result (``version``: the published version, None if unchanged). A
    job whose earlier run already published (same ``ctx.job_id``, its version still live) is not run again:
    that run's result is returned with ``"replayed": true`` (``indexer.job_record``).

    ``report`` receives progress updates: {"phase"} and, while embedding, {"done", "total", "skipped",
    "images_per_s"} (done / total count the images to embed: new or changed files).

    Raises:
        FolderError / ConfigError: the folder is not allowed or no images root is configured; bad spec.
        IndexMismatchError: the index was built with another encoder.
        IndexLockedError: another writer held the index past ``ctx.lock_timeout_s``.
        IndexFormatError: a delete on a missing index.
        CollectionDeletedError: the job's collection was deleted before or while it ran (``ctx.check_alive``).
    """
    if ctx.check_alive is not None:
        ctx.check_alive()
    try:
        return _execute(spec, ctx, report)
    except Exception:
        if ctx.check_alive is not None:
            ctx.check_alive()  # its collection went away under it: say so
        raise


def _execute(spec: JobSpec, ctx: JobContext, report: ProgressFn) -> dict:
    def on_progress(p: dict) -> None:
        report({"phase": "embedding", **p})

    replayed = _replay(spec, ctx)
    if replayed is not None:
        report({"phase": "written"})
        return replayed
    options = BuildOptions(batch_size=ctx.batch_size, num_workers=ctx.num_workers, progress=False,
                           on_progress=on_progress, lock_timeout_s=ctx.lock_timeout_s, images_root=ctx.images_root,
                           job_id=ctx.job_id)
    if spec.kind == "index":
        if ctx.images_root is None:
            raise ConfigError("index jobs are disabled: no images root is configured (REGIS_IMAGES_ROOT)")
        folder, rel = resolve_folder(ctx.images_root, spec.folder or "")
        report({"phase": "scanning"})
        r = build_index(folder, ctx.index_dir, ctx.encoder(), options)
        embedded = r.added + r.updated + len(r.skipped)
        report({"phase": "written", "done": embedded, "total": embedded, "skipped": len(r.skipped)})
        crash_point("job.published")
        return _index_result(r, rel)
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
        crash_point("job.published")
        _discard_staging(ctx.uploads_dir, spec)  # what is left there was skipped
        result = _add_result(r)
        report({"phase": "written", "done": len(images), "total": len(images), "skipped": result["skipped"]})
        return result
    if spec.kind == "delete":
        report({"phase": "writing"})
        r = delete_images(ctx.index_dir, spec.ids, ctx.uploads_dir, lock_timeout_s=ctx.lock_timeout_s,
                          job_id=ctx.job_id)
        crash_point("job.published")
        return r.to_json()
    if spec.kind == "metadata":
        from indexer.metadata import update_metadata

        report({"phase": "writing"})
        result = update_metadata(ctx.index_dir, spec.ids[0], spec.metadata or {}, spec.replace_metadata,
                                 lock_timeout_s=ctx.lock_timeout_s, job_id=ctx.job_id)
        crash_point("job.published")
        return result
    raise ConfigError(f"unknown job kind {spec.kind!r}")
