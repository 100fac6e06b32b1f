"""Which job published the live version. A job's write saves the job id in the report of the version it
publishes (``build_report.json``, key ``job``, written before the version goes live), beside that write's own
report (``BuildReport``, ``AddReport``, ``DeleteReport``, or a metadata change's result). A run of the same job
after its acknowledgement was lost (RQ runs a job again when the worker could not report it done, e.g. Redis
went away right after the publish) then reports what the first run did, from that saved report, marked
``"replayed": true``, instead of "added 0": the work is in the index, done by this very job.

Only the live version is looked at: when another job has published since, a re-run does the job again (every
write is idempotent: images already indexed are found unchanged, deleted ids are missing) and reports that.
Indexes written before the record existed have none and behave the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from regis.indexes.layout import REPORT_FILE, VERSIONS_DIR, read_current, version_number

JOB_KEY = "job"


def job_record(job_id: str | None) -> dict:
    """The report field that records job ``job_id`` with the version its write publishes; {} for a write that
    is not a queued job (``job_id`` None)."""
    return {JOB_KEY: {"id": job_id}} if job_id else {}


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
    """(live version, saved report) when job ``job_id`` published the live version (for a sharded collection:
    its collection version and the report of a shard the job changed); None when it did not (another job
    published since, no record, no index yet) or ``job_id`` is None."""
    index_dir = Path(index_dir)
    if not job_id or not index_dir.is_dir():
        return None
    version, reports = _live_reports(index_dir)
    for report in reports:
        if (report.get(JOB_KEY) or {}).get("id") == job_id:
            return version, report
    return None
