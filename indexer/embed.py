"""Embedding scanned files into an index writer: the options and report of a build, and the embedding loop
that folder builds (``indexer.build``) and uploads (``indexer.uploads``) share."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from indexer.dataset import ImageFileDataset, collate_items
from indexer.resume import BuildStaging
from indexer.scan import FileEntry
from regis.errors import Interrupted
from regis.faults import pause_point
from regis.images.decode import DEFAULT_MAX_PIXELS
from regis.images.exif import FACTS_KEY, path_facts
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.models.batching import encode_grouped
from regis.models.encoder import RegisEncoder
from regis.models.transforms import eval_transform

ProgressFn = Callable[[dict], None]
log = logging.getLogger("regis.indexer")


@dataclass
class BuildOptions:
    """Knobs of a build.

    Attributes:
        batch_size: images per encoder forward pass.
        num_workers: DataLoader decoding processes; None = min(4, CPUs), 0 = decode in the main process.
        faiss_spec: FAISS factory spec for the token index; None lets regis choose by size.
        nprobe: default IVF probes stored in the manifest.
        max_pixels: decompression-bomb limit per image, pixels.
        draft: let the JPEG decoder downscale large photos while decoding (faster, same tokens up to resampling).
        progress: show a tqdm progress bar (images/s) on stderr.
        on_progress: called after each batch with {"done", "total", "skipped", "images_per_s"}.
        lock_timeout_s: wait this long for another writer of the same index.
        images_root: the folder the index's image paths are relative to (None: the folder being built). When
            set, the folder built must lie inside it and the build only adds, updates and removes images below
            that folder: images of other folders under the root stay as they are.
        token_store: what the ANN rerank reads: "float16" or a FAISS codec spec ("SQ4", "PQ96"); None keeps the
            index's (a new index: ``regis.indexes.codes.default_store``).
        depth: default candidate depth k' stored in the manifest; None: the tuned default for the FAISS spec.
        metadata: user metadata per image, keyed by path relative to the folder built (``indexer.metadata``:
            a CSV / JSONL file); it wins over sidecar files (``photo.jpg.json``). The build adds file facts
            under ``file`` (folder, name, ext, taken_at, camera).
        replace: the folder replaces everything the index holds from folders (the behaviour before
            collections; uploads are kept). Default: a build adds, updates and deletes only below its own
            folder, and the index's root widens to the common parent folder when another folder is added.
        candidates: candidate method stored in the manifest, "bounded" or "depth"; None keeps the index's
            ("bounded" for a new one).
        faiss_codec: the IVF vector codec regis sizes its FAISS spec with (``IndexWriter(faiss_codec=)``: the
            compact layout's ``PQ32x4fsr``); None: the index's, else regis's.
        k_factor: FAISS neighbours per query token as a multiple of the depth, re-ranked on the token store's
            codes (``FaissInfo.k_factor``); None: the index's while its FAISS spec stays the same, else
            ``regis.indexes.faiss_index.default_k_factor``.
        job_id: the queued job this build runs for; recorded with the version it publishes
            (``indexer.job_record``), so that a re-run of the job can report this run's result.
        resume: keep the embeddings of finished batches in the index's staging area (``indexer.resume``) until
            the build commits, and reuse those an interrupted run of the build left there.
    """

    batch_size: int = 32
    num_workers: int | None = None
    faiss_spec: str | None = None
    nprobe: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    draft: bool = True
    progress: bool = True
    on_progress: ProgressFn | None = None
    lock_timeout_s: float = 0.0
    images_root: Path | str | None = None
    token_store: str | None = None
    depth: int | None = None
    replace: bool = False
    candidates: str | None = None
    k_factor: int | None = None
    faiss_codec: str | None = None
    metadata: dict[str, dict] | None = None
    job_id: str | None = None
    resume: bool = True


@dataclass
class BuildReport:
    """What a build did. Times in seconds; ``images_per_s`` counts embedded images over the embedding time.

    ``skipped`` lists {"path", "reason"} of files that could not be indexed; ``resumed`` counts the added and
    updated images whose embeddings an interrupted run of the build had staged (``indexer.resume``).
    Time split of the embedding loop (``embed_s``): ``decode_s`` = waiting for decoded batches (all of the
    read + decode + transform time with ``num_workers=0``; only the part the workers could not hide behind
    the encoder otherwise), ``encode_s`` = the encoder forward, ``put_s`` = writing token rows
    (``IndexWriter.put``). ``write_s`` = the commit (FAISS index, codes, table, manifest).
    """

    images_root: str
    index_dir: str
    version: int | None = None
    scanned: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    touched: int = 0
    deleted: int = 0
    skipped: list[dict] = field(default_factory=list)
    resumed: int = 0
    scan_s: float = 0.0
    embed_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0
    decode_s: float = 0.0
    put_s: float = 0.0
    total_s: float = 0.0
    images_per_s: float = 0.0
    embedded_now: int = field(default=0, repr=False)  # images embedded by this run (not staged before)

    def to_json(self) -> dict:
        """JSON-ready dict."""
        out = asdict(self)
        out.pop("embedded_now")
        return out


def _default_workers(n_images: int, batch_size: int) -> int:
    if n_images < 2 * batch_size:
        return 0
    return max(0, min(4, (os.cpu_count() or 1)))


def embed_entries(
    writer: IndexWriter,
    encoder: RegisEncoder,
    jobs: list[tuple[FileEntry, int, dict]],
    options: BuildOptions,
    report: BuildReport,
    staging: BuildStaging | None = None,
) -> list[int]:
    """Embed ``jobs`` (entry, image id, metadata) and put them in the writer; returns ids that failed.

    With ``staging``, images it holds for the same file (path, size, mtime) are put from there, and each batch
    embedded now is staged before the next one starts (``indexer.resume``).

    Raises:
        Interrupted: Ctrl-C (KeyboardInterrupt) while embedding with ``staging``: the message says how many of
            the images are embedded (staged) and that running the build again resumes it.
    """
    failed_ids: list[int] = []
    t_start = time.perf_counter()
    todo = jobs
    if staging is not None:
        staging.clean_temporary()
        staged = staging.load({e.path: (e.bytes, e.mtime) for e, _, _ in jobs})
        if staged:
            todo = [job for job in jobs if job[0].path not in staged]
            _put_staged(writer, [job for job in jobs if job[0].path in staged], staged)
            report.resumed = len(jobs) - len(todo)
            log.info("resuming a build: %d of %d images were embedded by an interrupted run", report.resumed,
                     len(jobs))
    if todo:
        try:
            _embed(writer, encoder, todo, options, report, staging, failed_ids, total=len(jobs))
        except KeyboardInterrupt:
            if staging is None:
                raise
            embedded = report.resumed + report.embedded_now
            raise Interrupted(f"interrupted: {embedded} of {len(jobs)} embedded, run again to resume") from None
    report.embed_s = time.perf_counter() - t_start
    return failed_ids


def _put_staged(writer: IndexWriter, jobs: list[tuple[FileEntry, int, dict]], staged: dict,
                chunk: int = 256) -> None:
    """Put the staged images of ``jobs`` in the writer, ``chunk`` at a time (grouped by patch grid)."""
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        by_grid: dict[tuple[int, int], list] = {}
        for job in part:
            by_grid.setdefault(staged[job[0].path].grid, []).append(job)
        for grid, group in by_grid.items():
            images = [staged[e.path] for e, _, _ in group]
            records = [image_record(e, i, meta, img.item) for (e, i, meta), img in zip(group, images, strict=True)]
            writer.put(records, np.stack([img.tokens for img in images]),
                       buddies=np.stack([img.buddies for img in images]), grid=grid)


def _embed(writer: IndexWriter, encoder: RegisEncoder, jobs: list[tuple[FileEntry, int, dict]],
           options: BuildOptions, report: BuildReport, staging: BuildStaging | None, failed_ids: list[int],
           total: int) -> None:
    """The embedding loop of ``embed_entries`` over the jobs left to embed (``total``: the build's, for the
    progress)."""
    cfg = encoder.config
    dataset = ImageFileDataset(
        [e.abspath for e, _, _ in jobs], eval_transform(cfg), options.max_pixels,
        draft_size=cfg.resize_size if options.draft else None,
    )
    workers = options.num_workers
    if workers is None:
        workers = _default_workers(len(jobs), options.batch_size)
    # its own generator: a DataLoader draws its workers' base seed from torch's global one otherwise, and a
    # random-init encoder built meanwhile in another thread of the service (another collection's) then got other
    # weights than its seed gives (regis.models.encoder._random_model; found by scripts/soak.py)
    loader = DataLoader(dataset, batch_size=options.batch_size, num_workers=workers, collate_fn=collate_items,
                        generator=torch.Generator())
    done = total - len(jobs)
    bar = None
    if options.progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=done, unit="img", desc="embedding", dynamic_ncols=True)
    t_start = time.perf_counter()
    try:
        batches = iter(loader)
        while True:
            t_wait = time.perf_counter()
            batch = next(batches, None)
            report.decode_s += time.perf_counter() - t_wait
            if batch is None:
                break
            for item in batch["failed"]:
                entry, image_id, _ = jobs[item["index"]]
                report.skipped.append({"path": entry.path, "reason": item["error"]})
                failed_ids.append(image_id)
            if batch["tensors"] is not None:
                t0 = time.perf_counter()
                tokens, buddies, grid = encode_grouped(encoder, batch["tensors"])
                tokens, buddies = tokens.cpu().numpy(), buddies.cpu().numpy()
                report.encode_s += time.perf_counter() - t0
                records = [image_record(*jobs[item["index"]], item) for item in batch["ok"]]
                t0 = time.perf_counter()
                writer.put(records, tokens, buddies=buddies, grid=grid)
                report.put_s += time.perf_counter() - t0
                if staging is not None:
                    staging.save([jobs[item["index"]][0] for item in batch["ok"]], batch["ok"], tokens, buddies,
                                 grid)
                report.embedded_now += len(batch["ok"])
            n = len(batch["ok"]) + len(batch["failed"])
            done += n
            elapsed = time.perf_counter() - t_start
            if bar is not None:
                bar.update(n)
                bar.set_postfix(skipped=len(report.skipped))
            if options.on_progress is not None:
                options.on_progress({"done": done, "total": total, "skipped": len(report.skipped),
                                     "images_per_s": (done - (total - len(jobs))) / elapsed if elapsed > 0 else 0.0})
            pause_point("build.batch-reported")
    finally:
        if bar is not None:
            bar.close()


def image_record(entry: FileEntry, image_id: int, meta: dict, item: dict) -> ImageRecord:
    """The table row of an embedded file: the job's user metadata plus the file facts (path facts, EXIF).

    Args:
        entry: the scanned file; image_id: its id; meta: its user metadata (``BuildPlan.jobs``).
        item: the decoded item (``indexer.dataset.ImageFileDataset``: sha256, width, height, bytes, exif).
    """
    facts = {**path_facts(entry.path), **meta.get(FACTS_KEY, {}), **(item.get("exif") or {})}
    return ImageRecord(image_id, entry.path, item["sha256"], item["width"], item["height"], item["bytes"],
                       entry.mtime, {**meta, FACTS_KEY: facts})


def embedding_rate(images_per_s: float, to_embed: int, skipped: int) -> str:
    """The end of a build's summary line (``regis index build``, ``--ray``): " (N images/s embedding)" when this
    run embedded images over a measured time (``images_per_s`` > 0), " (nothing to embed)" when no file was new,
    changed or unreadable (``to_embed`` = added + updated, ``skipped``), else "" (every image came from an
    interrupted run's staging area, or none could be read)."""
    if images_per_s > 0:
        return f" ({images_per_s:.1f} images/s embedding)"
    return " (nothing to embed)" if not to_embed and not skipped else ""
