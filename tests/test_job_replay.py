"""A job run again after its first run published (its acknowledgement lost): it reports the first run's
result, marked replayed, instead of "nothing to do" (``indexer.job_record``), also after other jobs published;
older than the recent jobs, or with no job id, it runs again."""

from __future__ import annotations

import shutil

import pytest

from indexer.jobs import JobContext, execute_job
from regis.indexes.snapshot import IndexSnapshot
from regis.jobs.model import JobSpec


@pytest.fixture
def ctx(tmp_path, photos_dir, tiny_encoder):
    root = tmp_path / "root"
    shutil.copytree(photos_dir, root / "photos")
    return JobContext(index_dir=tmp_path / "index", uploads_dir=root / ".uploads", images_root=root,
                      encoder=lambda: tiny_encoder, batch_size=4, num_workers=0, lock_timeout_s=5.0, job_id="job-1")


def _paths(index_dir) -> list[str]:
    snap = IndexSnapshot.open(index_dir)
    try:
        return sorted(r.path for r in snap.table.iter_all())
    finally:
        snap.close()


def test_an_index_job_run_again_after_it_published_reports_its_first_run(ctx, photos_dir):
    first = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    n = len(list(photos_dir.iterdir()))
    assert first["added"] == n and first["version"] == 1 and "replayed" not in first
    again = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    timing = ("total_s",)  # the saved report's total is taken just before the version's files are written
    assert {k: v for k, v in again.items() if k not in timing} == {
        **{k: v for k, v in first.items() if k not in timing}, "replayed": True}  # not "added 0, unchanged n"
    assert _paths(ctx.index_dir) == sorted(f"photos/{p.name}" for p in photos_dir.iterdir())  # each image once


def test_a_delete_job_run_again_reports_what_it_deleted(ctx):
    execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    ctx.job_id = "job-2"
    first = execute_job(JobSpec(kind="delete", ids=[0, 1, 999]), ctx, lambda p: None)
    assert first["deleted"] == [0, 1] and first["missing"] == [999]
    again = execute_job(JobSpec(kind="delete", ids=[0, 1, 999]), ctx, lambda p: None)
    assert again == {**first, "replayed": True}  # not "deleted [], missing [0, 1, 999]"


def test_a_delete_run_again_after_other_jobs_published_reports_what_it_deleted(ctx):
    """The Redis soak's false loss (DEPLOY.md, 2026-11-27): a delete whose first run published, then two other
    jobs, then its re-run: it reports the ids it deleted, not ``deleted: []`` (the API's ``deleted: false``)."""
    execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    ctx.job_id = "del-103"
    first = execute_job(JobSpec(kind="delete", ids=[3]), ctx, lambda p: None)
    for other in ("other-1", "other-2"):
        ctx.job_id = other
        execute_job(JobSpec(kind="delete", ids=[4 if other == "other-1" else 5]), ctx, lambda p: None)
    ctx.job_id = "del-103"
    again = execute_job(JobSpec(kind="delete", ids=[3]), ctx, lambda p: None)
    assert first["deleted"] == [3] and first["version"] == 2
    assert again == {**first, "replayed": True}  # version 2: the one it published, not the live 4


def test_an_index_job_run_again_after_another_jobs_publish_is_replayed(ctx, photos_dir):
    first = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    ctx.job_id = "job-2"
    execute_job(JobSpec(kind="delete", ids=[0]), ctx, lambda p: None)  # another job publishes version 2
    ctx.job_id = "job-1"
    again = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    assert again["replayed"] is True and again["version"] == 1 and again["added"] == first["added"]
    assert len(_paths(ctx.index_dir)) == len(list(photos_dir.iterdir())) - 1  # not scanned again: 0 stays deleted


def test_older_than_the_recent_jobs_or_without_a_job_id_the_job_runs_again(ctx, monkeypatch):
    import indexer.job_record as job_record

    monkeypatch.setattr(job_record, "MAX_RECENT_JOBS", 1)
    first = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    for other, image in (("job-2", 0), ("job-3", 1)):  # two publishes since: job-1 is out of the history of 1
        ctx.job_id = other
        execute_job(JobSpec(kind="delete", ids=[image]), ctx, lambda p: None)
    ctx.job_id = "job-1"
    again = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    # run again: the deleted photos, still in the folder, are added back (what a folder scan does)
    assert "replayed" not in again and again["added"] == 2 and again["version"] == 4
    ctx.job_id = None
    plain = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    assert "replayed" not in plain and plain["version"] is None
    assert first["version"] == 1


def test_a_metadata_job_run_again_reports_the_metadata_it_set(ctx):
    """Run again for real, the patch would find nothing to change and publish nothing (version None);
    replayed, it reports the version and metadata of its first run."""
    execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    ctx.job_id = "job-3"
    first = execute_job(JobSpec(kind="metadata", ids=[2], metadata={"colour": "red"}), ctx, lambda p: None)
    assert first["version"] == 2 and first["metadata"]["colour"] == "red"
    again = execute_job(JobSpec(kind="metadata", ids=[2], metadata={"colour": "red"}), ctx, lambda p: None)
    assert again == {**first, "replayed": True}  # a real second run: version None
