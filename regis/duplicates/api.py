"""Duplicate finding in one call, as ``regis duplicates`` and ``GET /v1/.../duplicates`` use it."""

from __future__ import annotations

from regis.duplicates.config import DuplicateConfig, config_path, load_config, save_config
from regis.duplicates.finder import FileResolver, Progress, update_pairs
from regis.duplicates.groups import group_pairs
from regis.duplicates.report import records_for, report_json
from regis.indexes.snapshot import IndexSnapshot


def index_config(snapshot: IndexSnapshot) -> DuplicateConfig:
    """The index's thresholds (``regis.duplicates.config.load_config``); written into the index's config on first
    use, so later calibrations of the package do not change an index's groups behind its owner's back."""
    config = load_config(snapshot.index_dir, snapshot.manifest.encoder.backbone)
    if not config_path(snapshot.index_dir).is_file():
        save_config(snapshot.index_dir, config)
    return config


def find_duplicates(snapshot: IndexSnapshot, overrides: dict | None = None, resolve: FileResolver | None = None,
                    offset: int = 0, limit: int = 50, explain: bool = False, merge: tuple[str, ...] = (),
                    relations: tuple[str, ...] | None = None, full: bool = False, workers: int | None = None,
                    threads: int | None = None, progress: Progress | None = None) -> dict:
    """Update the index version's pairs (incremental, ``regis.duplicates.finder.update_pairs``) and answer one page
    of groups (``regis.duplicates.report.report_json``).

    Args:
        snapshot: the index version.
        overrides: thresholds replaced for this call (``DuplicateConfig`` field -> value).
        resolve: where an image's file is (None: below the index's images root, or its uploads folder).
        offset, limit: the page of groups.
        explain: add each pair's token explanation.
        merge: also join groups through these relations ("crop", "same_scene").
        relations: report only these relations (None: all).
        full: search every image again.
        workers, threads: verification threads, FAISS threads (None: every core).
        progress: called with (stage, done, total).

    Raises:
        ConfigError: a bad override, or an unreadable config file.
        ValueError: an unknown relation name in ``merge`` or ``relations``.
        IndexLockedError: another run held the duplicates lock too long.
    """
    config = index_config(snapshot).with_overrides(overrides)
    run = update_pairs(snapshot, config, resolve, full=full, workers=workers, threads=threads, progress=progress)
    table = run.stored.table
    grouping = group_pairs(table, config, merge, relations)
    records = records_for(snapshot, grouping.groups[offset:offset + limit], table)
    facts = {"searched": run.searched, "reused_pairs": run.reused, "from_version": run.from_version,
             "candidate_pairs": len(table), "timings_ms": {k: round(v, 1) for k, v in run.timings_ms.items()},
             "computed_now": run.computed_now}
    out = report_json(grouping, table, records, config, snapshot.version, offset, limit, snapshot, explain, facts)
    out["calibration"] = config.calibration
    return out
