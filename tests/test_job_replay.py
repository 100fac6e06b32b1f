"""A job run again after its first run published (its acknowledgement lost): it reports the first run's
result, marked replayed, instead of "nothing to do" (``indexer.job_record``); another job's publish in between,
or no job id, and it runs again as before."""

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


def test_after_another_jobs_publish_or_without_a_job_id_the_job_runs_again(ctx, tmp_path):
    first = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    ctx.job_id = "job-2"
    execute_job(JobSpec(kind="delete", ids=[0]), ctx, lambda p: None)  # another job publishes version 2
    ctx.job_id = "job-1"
    again = execute_job(JobSpec(kind="index", folder="photos"), ctx, lambda p: None)
    # run again: the deleted photo, still in the folder, is added back (what a folder scan does)
    assert "replayed" not in again and again["added"] == 1 and again["version"] == 3
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
