"""Which job published a live or recent version. A job's write saves the job id in the report of the version it
publishes (``build_report.json``, key ``job``, written before the version goes live), beside that write's own
report (``BuildReport``, ``AddReport``, ``DeleteReport``, or a metadata change's result), and carries the last
``MAX_RECENT_JOBS`` jobs' ids, versions and reports forward from the version it replaces (key ``recent_jobs``,
newest first). A run of the same job after its acknowledgement was lost (RQ runs a job again when the worker
could not report it done, e.g. Redis went away right after the publish) then reports what the first run did, from
that saved report, marked ``"replayed": true``, instead of "added 0" or "deleted: false": the work is in the
index, done by this very job, even when other jobs have published since (the Redis soak of 2026-11-27: a delete
run again after two more versions answered ``deleted: false`` for the image it had itself removed; DEPLOY.md).

A write that is not a queued job (the CLI) carries no history, so a job run again after one runs again (every
write is idempotent: images already indexed are found unchanged, deleted ids are missing) and reports that, as do
jobs older than the last ``MAX_RECENT_JOBS`` and indexes written before the record existed.
"""

from __future__ import annotations

import json
from pathlib import Path

from regis.indexes.layout import REPORT_FILE, VERSIONS_DIR, read_current, version_number

JOB_KEY = "job"


RECENT_KEY = "recent_jobs"
MAX_RECENT_JOBS = 32  # jobs whose re-run is recognised after other jobs published (RQ re-runs within minutes)


def job_record(job_id: str | None, index_dir: Path | str | None = None) -> dict:
    """The report fields that record job ``job_id`` with the version its write publishes, and (``index_dir``
    given: the index or collection being written, read under its write lock) the recent jobs of the version it
    replaces; {} for a write that is not a queued job (``job_id`` None)."""
    if not job_id:
        return {}
    record = {JOB_KEY: {"id": job_id}}
    if index_dir is not None and Path(index_dir).is_dir():
        record[RECENT_KEY] = _history(*_live_reports(Path(index_dir)))
    return record


def _history(version: int, reports: list[dict]) -> list[dict]:
    """{"id", "version", "report"} of the live version's own job(s) and of their recent jobs, newest first, each
    job once, at most ``MAX_RECENT_JOBS``."""
    out, seen = [], set()
    own = [{"id": r[JOB_KEY]["id"], "version": version,
            "report": {k: v for k, v in r.items() if k not in (JOB_KEY, RECENT_KEY)}}
           for r in reports if (r.get(JOB_KEY) or {}).get("id")]
    for entry in own + [e for r in reports for e in r.get(RECENT_KEY) or []]:
        if isinstance(entry, dict) and entry.get("id") and entry["id"] not in seen:
            seen.add(entry["id"])
            out.append(entry)
    return out[:MAX_RECENT_JOBS]


def _read_report(version_dir: Path) -> dict:
    try:
        return json.loads((version_dir / REPORT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _live_reports(index_dir: Path) -> tuple[int, list[dict]]:
    """The live version number and the build reports of the live version (an index) or of each shard's live
    version (a sharded collection)."""
    from regis.sharding.layout import is_sharded, read_state

    if is_sharded(index_dir):
        state = read_state(index_dir)
        return state.version, [_read_report(state.shard_path(index_dir, s) / VERSIONS_DIR / name)
                               for s, name in enumerate(state.names) if name]
    name = read_current(index_dir)
    return version_number(name), [_read_report(index_dir / VERSIONS_DIR / name)] if name else []


def published_report(index_dir: Path | str, job_id: str | None) -> tuple[int, dict] | None:
    """(version, saved report) when job ``job_id`` published the live version (for a sharded collection: its
    collection version and the report of a shard the job changed) or one of the versions the live one's recent
    jobs record; None when it did not (no record, older than the recent jobs, no index yet) or ``job_id`` is
    None."""
    index_dir = Path(index_dir)
    if not job_id or not index_dir.is_dir():
        return None
    version, reports = _live_reports(index_dir)
    for entry in _history(version, reports):
        if entry["id"] == job_id:
            return int(entry["version"]), entry["report"]
    return None
