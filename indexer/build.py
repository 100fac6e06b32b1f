"""Incremental, atomic index builds from an image folder.

A build scans the folder, compares it with the index's image table, embeds only new and changed files,
removes deleted ones, and publishes one new index version (``regis.indexes.writer``). An unchanged folder
costs only the scan (no new version). Unreadable files are skipped and listed in the report; they never
stop the build. Image ids stay stable: a changed file keeps its id.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from indexer.embed import BuildOptions, BuildReport, embed_entries
from indexer.job_record import job_record
from indexer.metadata import read_sidecar
from indexer.resume import BuildStaging
from indexer.scan import FileEntry, file_sha256, plan_changes, scan_folder
from indexer.writers import open_writer
from regis.errors import ConfigError, RegisError
from regis.images.exif import FACTS_KEY
from regis.indexes.table import ImageRecord
from regis.indexes.thumbnails import remove_thumbnails
from regis.indexes.uploads import UPLOADS_PREFIX, is_upload_path
from regis.indexes.writer import IndexWriter
from regis.models.encoder import RegisEncoder


class NoImagesError(RegisError):
    """A build found no image file below its folder (nothing is changed: use ``regis collections delete`` or
    delete the images' ids to empty an index)."""


def _split_modified(modified: list[tuple[FileEntry, ImageRecord]]) -> tuple[list, list]:
    """(really changed (entry, record), touched records with new size/mtime but the same bytes)."""
    if not modified:
        return [], []
    with ThreadPoolExecutor(max_workers=4) as pool:
        hashes = list(pool.map(lambda pair: _safe_sha(pair[0].abspath), modified))
    changed, touched = [], []
    for (entry, rec), sha in zip(modified, hashes, strict=True):
        if sha is not None and sha == rec.sha256:
            touched.append(ImageRecord(rec.id, rec.path, rec.sha256, rec.width, rec.height, entry.bytes, entry.mtime,
                                       rec.metadata))
        else:
            changed.append((entry, rec))
    return changed, touched


def _safe_sha(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


@dataclass
class BuildPlan:
    """What a build does, decided before embedding (``plan_build``).

    Attributes:
        plan: the scan compared with the index (new, modified, unchanged, deleted).
        changed: (entry, record) of files whose bytes changed (re-embedded under their id).
        touched: records of files with a new size or mtime but the same bytes (only their row changes).
        jobs: (entry, image id, user metadata) to embed: the new files in scan order (fresh ids), then the
            changed ones.
        user: table path -> user metadata (sidecars and given rows).
    """

    plan: object
    changed: list
    touched: list
    jobs: list
    user: dict

    @property
    def num_new(self) -> int:
        """How many of ``jobs`` are new files (the first ones)."""
        return len(self.plan.new)


def plan_build(writer, entries: list[FileEntry], managed: dict[str, ImageRecord], scope: str = "",
               metadata: dict[str, dict] | None = None) -> BuildPlan:
    """Compare a scan with the index's rows and hand out ids to new files, in scan order (so every build of the
    same folder gives every image the same id: the single-machine build and ``cluster.build``'s Ray build).

    Args:
        writer: an ``IndexWriter`` or a ``ShardedWriter`` (its ``allocate_ids`` hands out the ids).
        entries: the scan (``indexer.scan.scan_folder``), table paths.
        managed: path -> row of the images this build may change (``_managed_records``).
        scope: the folder built, relative to the images root ("" for the root).
        metadata: rows of user metadata by path relative to the folder built (they win over sidecars).

    Raises:
        ConfigError: a sidecar that is not a JSON object.
    """
    plan = plan_changes(entries, managed)
    changed, touched = _split_modified(plan.modified)
    user = _user_metadata(entries, scope, metadata)
    new_ids = writer.allocate_ids(len(plan.new))
    jobs = [(e, int(i), user.get(e.path, {})) for e, i in zip(plan.new, new_ids, strict=True)]
    jobs += [(e, rec.id, user.get(e.path, _without_facts(rec.metadata))) for e, rec in changed]
    return BuildPlan(plan, changed, touched, jobs, user)


def finish_plan(writer, bp: BuildPlan, managed: dict[str, ImageRecord], failed: set[int]) -> None:
    """After embedding: remove deleted files and changed ones that no longer decode (``failed`` ids), and write
    the rows of touched files and of unchanged files whose user metadata changed."""
    gone = [rec.id for rec in bp.plan.deleted] + [rec.id for _, rec in bp.changed if rec.id in failed]
    writer.delete(gone)
    writer.update_records(_with_metadata(bp.touched, bp.user))
    unchanged = [managed[e.path] for e in bp.plan.unchanged if e.path in bp.user]
    writer.update_records([r for r in _with_metadata(unchanged, bp.user) if r.metadata != managed[r.path].metadata])


def _without_facts(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if k != FACTS_KEY}


def _user_metadata(entries: list[FileEntry], scope: str, rows: dict[str, dict] | None) -> dict[str, dict]:
    """Table path -> user metadata from sidecars and ``rows`` (keyed by path relative to the folder built; they
    win over sidecars), for the entries that have some.

    Raises:
        ConfigError: a sidecar that is not a JSON object (the message names it).
    """
    out: dict[str, dict] = {}
    cut = len(scope) + 1 if scope else 0
    for e in entries:
        side = read_sidecar(e.abspath)
        row = rows.get(e.path[cut:]) if rows else None
        if side is not None or row is not None:
            out[e.path] = {**(side or {}), **(row or {})}
    return out


def _with_metadata(records: list[ImageRecord], user: dict[str, dict]) -> list[ImageRecord]:
    """Records with their user metadata replaced by ``user``'s (file facts kept)."""
    out = []
    for r in records:
        if r.path in user:
            facts = r.metadata.get(FACTS_KEY)
            meta = {**user[r.path], **({FACTS_KEY: facts} if facts is not None else {})}
            r = ImageRecord(r.id, r.path, r.sha256, r.width, r.height, r.bytes, r.mtime, meta)
        out.append(r)
    return out


def _managed_records(writer: IndexWriter, images_root: str, scope: str, replace: bool,
                     rebased: bool) -> dict[str, ImageRecord]:
    """The table rows this build compares its scan with: never uploads; with a scope, only rows below it
    (unless ``replace``, or the index's images root changed to an unrelated folder, when every old folder
    path is stale)."""
    moved = not rebased and writer.base is not None and writer.base.images_root not in (None, images_root)
    root_changed = replace or moved
    prefix = f"{scope}/" if scope else ""
    return {
        path: rec for path, rec in writer.table.by_path().items()
        if not is_upload_path(path) and (root_changed or path.startswith(prefix))
    }


def _indexed_root(index_dir: Path) -> Path | None:
    """The images root recorded in the live version's manifest (a sharded collection's: its first shard's with
    a version; None: no index, or only uploads)."""
    from regis.errors import IndexFormatError
    from regis.indexes.layout import VERSIONS_DIR, read_current
    from regis.indexes.manifest import read_manifest
    from regis.sharding.layout import collection_manifest, is_sharded

    if is_sharded(index_dir):
        try:
            root = collection_manifest(index_dir).images_root
        except IndexFormatError:  # no shard has a version yet
            return None
        return Path(root) if root else None
    current = read_current(index_dir) if index_dir.is_dir() else None
    if current is None:
        return None
    root = read_manifest(index_dir / VERSIONS_DIR / current).images_root
    return Path(root) if root else None


def _rebase(writer: IndexWriter, old_root: Path | None, base: Path) -> bool:
    """When the index's root widens from ``old_root`` to its parent ``base``, prefix the folder paths of the
    table with ``old_root``'s place under ``base`` (ids, tokens and uploads unchanged) so that they still name
    the same files. Returns True when it did."""
    if old_root is None or old_root == base or not old_root.is_relative_to(base):
        return False
    if writer.base is None or writer.base.images_root != str(old_root):
        return False  # the index changed since we looked: the build treats the old paths as another root's
    writer.prefix_paths(old_root.relative_to(base).as_posix() + "/", exclude_prefix=UPLOADS_PREFIX,
                        folder_key=f"$.{FACTS_KEY}.folder")
    return True


def build_index(
    images_dir: Path | str,
    index_dir: Path | str,
    encoder: RegisEncoder,
    options: BuildOptions | None = None,
) -> BuildReport:
    """Create or incrementally update the index in ``index_dir`` from the images below ``images_dir``; a sharded
    collection (``regis.sharding``) is built in this process through its ``CollectionWriter``: the same plan,
    ids (new files get the next global ids, each stored in its shard ``id % S``), rows and tokens as an
    unsharded index, published as one collection version (all or nothing for readers).

    Uploaded images (table paths under ``.uploads/``, see ``regis.indexes.uploads``) are never touched by a
    build; with ``options.images_root`` set, neither are images of other folders under that root.

    Args:
        images_dir: the folder to index (walked recursively).
        index_dir: the index directory (created if missing). May lie inside ``images_dir``; it is not scanned.
        encoder: the encoder; must match an existing index's encoder config and weights.
        options: build options.

    Returns:
        The build report (also saved as ``build_report.json`` in the new version, when there is one).

    A build stopped while embedding (Ctrl-C, a signal, a crash) keeps its finished batches in the index's
    staging area (``indexer.resume``, with ``options.resume``); the next build of the index reuses those whose
    files did not change, and removes the area once its version is committed.

    Raises:
        ConfigError: ``images_dir`` is not a folder, or lies outside ``options.images_root``.
        NoImagesError: no image file below ``images_dir`` (the index is left as it was).
        Interrupted: Ctrl-C while embedding (the live version is unchanged; the staged batches are kept).
        IndexMismatchError: the index was built with another encoder.
        IndexLockedError: another build holds the index.
    """
    options = options or BuildOptions()
    if options.batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {options.batch_size}")
    root = Path(images_dir).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"image folder {root} does not exist or is not a directory")
    index_path = Path(index_dir).expanduser().resolve()
    old_root = None if options.replace else _indexed_root(index_path)
    if options.images_root:
        base = Path(options.images_root).expanduser().resolve()
    elif old_root is not None:  # another folder joins the index: paths become relative to the common parent
        base = Path(os.path.commonpath([old_root, root]))
    else:
        base = root
    if not root.is_relative_to(base):
        raise ConfigError(f"image folder {root} is not inside the images root {base}")
    scope = root.relative_to(base).as_posix() if root != base else ""
    if any(part.startswith(".") for part in Path(scope).parts):
        raise ConfigError(f"image folder {root} is hidden (a name starts with '.'); scans skip hidden folders")
    t_total = time.perf_counter()
    report = BuildReport(images_root=str(base), index_dir=str(index_path))
    with open_writer(index_path, encoder.config, encoder.weights_info, faiss_spec=options.faiss_spec,
                     nprobe=options.nprobe, images_root=str(base), lock_timeout_s=options.lock_timeout_s,
                     token_store=options.token_store, depth=options.depth,
                     candidates=options.candidates, k_factor=options.k_factor,
                     faiss_codec=options.faiss_codec) as writer:
        t0 = time.perf_counter()
        rebased = _rebase(writer, old_root, base)
        entries = scan_folder(root, exclude=(index_path,), confine_to=base)
        if not entries:  # a typo or the wrong folder, far more often than "delete everything below it"
            raise NoImagesError(f"no images found under {root}; the index is unchanged",
                                hint="regis indexes JPEG, PNG, WebP, BMP, TIFF and GIF files, skipping hidden "
                                     "files and folders")
        if scope:
            entries = [FileEntry(f"{scope}/{e.path}", e.abspath, e.bytes, e.mtime) for e in entries]
        managed = _managed_records(writer, str(base), scope, options.replace, rebased)
        bp = plan_build(writer, entries, managed, scope, options.metadata)
        report.scan_s = time.perf_counter() - t0
        report.scanned = len(entries)
        report.unchanged = len(bp.plan.unchanged)
        report.touched = len(bp.touched)
        jobs = bp.jobs
        staging = BuildStaging(index_path, {"config": encoder.config.model_dump(mode="json"),
                                            "weights_sha256": encoder.weights_info.sha256}) if options.resume else None
        failed = set(embed_entries(writer, encoder, jobs, options, report, staging)) if jobs else set()
        report.added = sum(1 for _, i, _ in jobs[: bp.num_new] if i not in failed)
        report.updated = sum(1 for _, i, _ in jobs[bp.num_new :] if i not in failed)
        # A changed file that no longer decodes leaves the index, like a deleted one.
        finish_plan(writer, bp, managed, failed)
        report.deleted = len(bp.plan.deleted)
        t0 = time.perf_counter()
        report.images_per_s = report.embedded_now / report.embed_s if report.embed_s > 0 else 0.0
        report.total_s = time.perf_counter() - t_total
        manifest = writer.commit({**report.to_json(), **job_record(options.job_id, index_path)})
        report.write_s = time.perf_counter() - t0
        report.version = manifest.version if manifest else None
        if staging is not None:
            staging.remove()  # committed (or nothing to commit): the staged embeddings are not needed any more
    if manifest is not None:  # the thumbnails of files gone or changed (regis.indexes.thumbnails)
        remove_thumbnails(index_path, [r.sha256 for r in bp.plan.deleted] + [r.sha256 for _, r in bp.changed])
    report.total_s = time.perf_counter() - t_total
    return report

