"""Adding uploaded images to an index and deleting images by id: one atomic index version each.

Both run under the index's write lock (``IndexWriter``; on a sharded collection every shard's, through
``regis.sharding.write.CollectionWriter``, in global ids), which also serialises them with folder builds; files
of uploads are moved into the uploads folder inside that lock, so an upload never races with the deletion of
the same content. Both are idempotent: re-running a job that already committed changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from indexer.embed import BuildOptions, BuildReport, embed_entries
from indexer.job_record import job_record
from indexer.scan import FileEntry
from indexer.writers import open_live_writer, open_writer
from regis.faults import crash_point
from regis.images.exif import FACTS_KEY
from regis.indexes.table import ImageRecord
from regis.indexes.thumbnails import remove_thumbnails
from regis.indexes.uploads import is_upload_path, place_upload, upload_file, uploads_lock
from regis.models.encoder import RegisEncoder

log = logging.getLogger("regis.indexer")


@dataclass(frozen=True)
class NewImage:
    """An uploaded image to add.

    Attributes:
        path: its table path (``.uploads/ab/<sha256>.<ext>``, see ``regis.indexes.uploads``).
        staged: where the API left the file, relative to the uploads folder (``.staging/...``).
        sha256: SHA-256 of the file's bytes, hex.
        metadata: user metadata (JSON object); replaces the stored metadata when the image already exists.
        filename: the client's file name (kept as the metadata's file.name).
    """

    path: str
    staged: str
    sha256: str
    metadata: dict = field(default_factory=dict)
    filename: str = ""


@dataclass
class AddReport:
    """What ``add_images`` did: one entry per image, in input order.

    ``images`` items: {"filename", "sha256", "path", "id" (None when skipped), "status" ("added", "exists" or
    "skipped"), "reason" (skipped only)}. ``version`` is the published index version (None: nothing changed).
    Times in seconds.
    """

    version: int | None = None
    images: list[dict] = field(default_factory=list)
    total_s: float = 0.0

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass
class DeleteReport:
    """What ``delete_images`` did: ids removed, ids that were not in the index, the published version."""

    version: int | None = None
    deleted: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def add_images(
    index_dir: Path | str,
    uploads_dir: Path | str,
    encoder: RegisEncoder,
    images: list[NewImage],
    options: BuildOptions | None = None,
) -> AddReport:
    """Add uploaded images to the index (created if missing) as one new version.

    An image whose content is already indexed keeps its id (its metadata is replaced when new metadata is
    given); an undecodable one is skipped with its reason.

    Args:
        index_dir: the index directory.
        uploads_dir: the uploads folder the staged files are in (``regis.indexes.uploads``).
        encoder: the index's encoder.
        images: the images, staged.
        options: build options (batch size, lock timeout, progress callback).

    Raises:
        IndexMismatchError: the index was built with another encoder.
        IndexLockedError: another writer holds the index past ``options.lock_timeout_s``.
        ConfigError: a malformed upload path.
    """
    options = options or BuildOptions(progress=False)
    t0 = time.perf_counter()
    report = AddReport()
    build_report = BuildReport(images_root="", index_dir=str(index_dir))
    with uploads_lock(uploads_dir, options.lock_timeout_s), open_writer(
        index_dir, encoder.config, encoder.weights_info, lock_timeout_s=options.lock_timeout_s
    ) as w:
        existing = w.table.get_by_paths(sorted({im.path for im in images if is_upload_path(im.path)}))
        entries: dict[str, dict] = {}  # path -> the report item of its first occurrence
        duplicates: list[dict] = []
        jobs: list[tuple[FileEntry, int, dict]] = []
        touched: list[ImageRecord] = []
        for im in images:
            item = {"filename": im.filename, "sha256": im.sha256, "path": im.path, "id": None, "status": "skipped"}
            report.images.append(item)
            if im.path in entries:  # the same content twice in one batch: one image
                duplicates.append(item)
                continue
            entries[im.path] = item
            if not is_upload_path(im.path):
                item["reason"] = "not an upload path"
                continue
            try:
                stored = place_upload(uploads_dir, im.staged, im.path)
            except FileNotFoundError:
                item["reason"] = "the uploaded file is gone from the staging area"
                continue
            rec = existing.get(im.path)
            if rec is not None and w.is_live(rec.id):
                item.update(id=rec.id, status="exists")
                facts = rec.metadata.get(FACTS_KEY)
                meta = {**im.metadata, **({FACTS_KEY: facts} if facts is not None else {})}
                if im.metadata and meta != rec.metadata:
                    touched.append(ImageRecord(rec.id, rec.path, rec.sha256, rec.width, rec.height, rec.bytes,
                                               rec.mtime, meta))
                continue
            st = stored.stat()
            facts = {"name": im.filename, "uploaded": True} if im.filename else {"uploaded": True}
            jobs.append((FileEntry(im.path, stored, st.st_size, st.st_mtime), -1,
                         {**im.metadata, FACTS_KEY: facts}))
        crash_point("job.placed")
        ids = w.allocate_ids(len(jobs))
        jobs = [(entry, int(i), meta) for (entry, _, meta), i in zip(jobs, ids, strict=True)]
        failed = set(embed_entries(w, encoder, jobs, options, build_report)) if jobs else set()
        reasons = {s["path"]: s["reason"] for s in build_report.skipped}
        for entry, image_id, _ in jobs:
            item = entries[entry.path]
            if image_id in failed:
                item["reason"] = reasons.get(entry.path, "cannot decode the image")
            else:
                item.update(id=image_id, status="added")
        for item in duplicates:  # the same content twice in a batch: both report the one image
            first = entries[item["path"]]
            item.update({k: v for k, v in first.items() if k in ("id", "status", "reason")})
        w.update_records(touched)
        manifest = w.commit({**report.to_json(), **job_record(options.job_id, index_dir)} if options.job_id else None)
        report.version = manifest.version if manifest else None
    report.total_s = time.perf_counter() - t0
    return report


def delete_images(
    index_dir: Path | str,
    ids: list[int],
    uploads_dir: Path | str | None = None,
    lock_timeout_s: float = 0.0,
    job_id: str | None = None,
) -> DeleteReport:
    """Remove images by id as one new version; ids stay unused forever. Needs no encoder.

    Files of deleted uploads are removed from ``uploads_dir`` after the commit. Files of images indexed from a
    folder are left alone: a later scan of that folder adds them again if they are still there. ``job_id``: the
    queued job this runs for, recorded with the new version (``indexer.job_record``).

    Raises:
        IndexFormatError: there is no index.
        IndexLockedError: another writer holds the index past ``lock_timeout_s``.
    """
    report = DeleteReport()
    lock = uploads_lock(uploads_dir, lock_timeout_s) if uploads_dir is not None else contextlib.nullcontext()
    with lock:
        with open_live_writer(index_dir, lock_timeout_s, ": nothing to delete") as w:
            wanted = sorted({int(i) for i in ids})
            report.deleted = [i for i in wanted if w.is_live(i)]
            report.missing = [i for i in wanted if not w.is_live(i)]
            records = w.table.get_many(report.deleted)
            w.delete(report.deleted)
            committed = w.commit({**report.to_json(), **job_record(job_id, index_dir)} if job_id else None)
            report.version = committed.version if committed else None
        crash_point("delete.committed")
        for rec in records.values():  # still under the uploads lock: no upload of the same bytes in between
            if uploads_dir is not None and is_upload_path(rec.path):
                try:
                    upload_file(uploads_dir, rec.path).unlink(missing_ok=True)
                except OSError as exc:  # the index is already right; a stale file is only disk space
                    log.warning("could not remove the file of deleted upload %s: %s", rec.path, exc)
    if report.version is not None:
        remove_thumbnails(index_dir, [rec.sha256 for rec in records.values()])
    return report
