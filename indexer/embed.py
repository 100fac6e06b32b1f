"""Embedding scanned files into an index writer: the options and report of a build, and the embedding loop
that folder builds (``indexer.build``) and uploads (``indexer.uploads``) share."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch.utils.data import DataLoader

from indexer.dataset import ImageFileDataset, collate_items
from indexer.metadata import FACTS_KEY
from indexer.scan import FileEntry
from regis.faults import pause_point
from regis.images.decode import DEFAULT_MAX_PIXELS
from regis.images.exif import path_facts
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.models.encoder import RegisEncoder
from regis.models.transforms import eval_transform

ProgressFn = Callable[[dict], None]


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
        token_store: what the ANN rerank reads: "float16" or a FAISS codec spec ("PQ96"); None keeps the index's.
        depth: default candidate depth k' stored in the manifest; None: the tuned default for the FAISS spec.
        metadata: user metadata per image, keyed by path relative to the folder built (``indexer.metadata``:
            a CSV / JSONL file); it wins over sidecar files (``photo.jpg.json``). The build adds file facts
            under ``file`` (folder, name, ext, taken_at, camera).
        replace: the folder replaces everything the index holds from folders (the behaviour before
            collections; uploads are kept). Default: a build adds, updates and deletes only below its own
            folder, and the index's root widens to the common parent folder when another folder is added.
        candidates: candidate method stored in the manifest, "bounded" or "depth"; None keeps the index's
            ("bounded" for a new one).
        job_id: the queued job this build runs for; recorded with the version it publishes
            (``indexer.job_record``), so that a re-run of the job can report this run's result.
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
    metadata: dict[str, dict] | None = None
    job_id: str | None = None


@dataclass
class BuildReport:
    """What a build did. Times in seconds; ``images_per_s`` counts embedded images over the embedding time.

    ``skipped`` lists {"path", "reason"} of files that could not be indexed.
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
    scan_s: float = 0.0
    embed_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0
    decode_s: float = 0.0
    put_s: float = 0.0
    total_s: float = 0.0
    images_per_s: float = 0.0

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


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
) -> list[int]:
    """Embed ``jobs`` (entry, image id, metadata) and put them in the writer; returns ids that failed."""
    cfg = encoder.config
    dataset = ImageFileDataset(
        [e.abspath for e, _, _ in jobs], eval_transform(cfg), options.max_pixels,
        draft_size=cfg.resize_size if options.draft else None,
    )
    workers = options.num_workers
    if workers is None:
        workers = _default_workers(len(jobs), options.batch_size)
    loader = DataLoader(dataset, batch_size=options.batch_size, num_workers=workers, collate_fn=collate_items)
    bar = None
    if options.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="img", desc="embedding", dynamic_ncols=True)
    failed_ids: list[int] = []
    done = 0
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
                tokens, buddies, grid = encoder.encode_with_buddies(batch["tensors"])
                tokens, buddies = tokens.cpu().numpy(), buddies.cpu().numpy()
                report.encode_s += time.perf_counter() - t0
                records = [image_record(*jobs[item["index"]], item) for item in batch["ok"]]
                t0 = time.perf_counter()
                writer.put(records, tokens, buddies=buddies, grid=grid)
                report.put_s += time.perf_counter() - t0
            done += len(batch["ok"]) + len(batch["failed"])
            elapsed = time.perf_counter() - t_start
            if bar is not None:
                bar.update(len(batch["ok"]) + len(batch["failed"]))
                bar.set_postfix(skipped=len(report.skipped))
            if options.on_progress is not None:
                options.on_progress({"done": done, "total": len(jobs), "skipped": len(report.skipped),
                                     "images_per_s": done / elapsed if elapsed > 0 else 0.0})
            pause_point("build.batch-reported")
    finally:
        if bar is not None:
            bar.close()
    report.embed_s = time.perf_counter() - t_start
    return failed_ids


def image_record(entry: FileEntry, image_id: int, meta: dict, item: dict) -> ImageRecord:
    """The table row of an embedded file: the job's user metadata plus the file facts (path facts, EXIF).

    Args:
        entry: the scanned file; image_id: its id; meta: its user metadata (``BuildPlan.jobs``).
        item: the decoded item (``indexer.dataset.ImageFileDataset``: sha256, width, height, bytes, exif).
    """
    facts = {**path_facts(entry.path), **meta.get(FACTS_KEY, {}), **(item.get("exif") or {})}
    return ImageRecord(image_id, entry.path, item["sha256"], item["width"], item["height"], item["bytes"],
                       entry.mtime, {**meta, FACTS_KEY: facts})
