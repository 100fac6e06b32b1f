"""Which folders a job may read, scoped folder builds, and uploaded images in the index (no Redis needed)."""

from __future__ import annotations

import shutil

import pytest

from conftest import build
from indexer import BuildOptions, NewImage, add_images, build_index, delete_images
from regis.indexes.layout import VERSIONS_DIR, read_current
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.uploads import (
    STAGING_DIR,
    is_upload_path,
    new_staging_batch,
    stage_upload,
    upload_file,
)
from regis.jobs.folders import FolderError, resolve_folder


def test_folders_outside_the_root_are_refused(tmp_path):
    root = tmp_path / "root"
    (root / "cats" / "2024").mkdir(parents=True)
    (root / ".uploads").mkdir()
    (root / "a-file.jpg").write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (root / "inside-link").symlink_to(root / "cats")

    assert resolve_folder(root, "") == (root.resolve(), "")
    assert resolve_folder(root, ".")[1] == ""
    assert resolve_folder(root, "cats/2024")[1] == "cats/2024"
    assert resolve_folder(root, str(root / "cats"))[1] == "cats"
    assert resolve_folder(root, "inside-link")[1] == "cats"  # a link that stays inside is fine
    for bad, reason in [
        ("..", "forbidden"), ("cats/../..", "forbidden"), ("cats/../cats", "forbidden"), (str(outside), "forbidden"),
        ("escape", "forbidden"), ("/etc", "forbidden"), ("nope", "not_found"), ("a-file.jpg", "invalid"),
        (".uploads", "invalid"), ("bad\x00name", "invalid"),
    ]:
        with pytest.raises(FolderError) as err:
            resolve_folder(root, bad)
        assert err.value.reason == reason, bad


def _paths(index) -> set[str]:
    snap = IndexSnapshot.open(index)
    try:
        return {r.path for r in snap.table.iter_all()}
    finally:
        snap.close()


def test_a_folder_build_touches_only_its_folder_and_never_uploads(tmp_path, photos_dir, tiny_encoder):
    root = tmp_path / "root"
    names = sorted(p.name for p in photos_dir.iterdir())
    for folder, part in (("a", names[:5]), ("b", names[5:9])):
        (root / folder).mkdir(parents=True)
        for name in part:
            shutil.copy(photos_dir / name, root / folder / name)
    index, uploads = tmp_path / "index", root / ".uploads"  # uploads inside the root: hidden from scans
    opts = {"images_root": root}
    assert build(root / "a", index, tiny_encoder, **opts).added == 5
    assert build(root / "b", index, tiny_encoder, **opts).added == 4
    assert {p.split("/")[0] for p in _paths(index)} == {"a", "b"}

    batch = new_staging_batch()
    data = (photos_dir / names[-1]).read_bytes()
    staged, path, sha = stage_upload(uploads, batch, 0, data, "PNG" if names[-1].endswith(".png") else "JPEG")
    added = add_images(index, uploads, tiny_encoder, [NewImage(path, staged, sha, {"who": "me"}, "x")],
                       BuildOptions(progress=False, num_workers=0))
    assert added.images[0]["status"] == "added" and is_upload_path(path)
    assert upload_file(uploads, path).read_bytes() == data

    (root / "a" / names[0]).unlink()
    report = build(root / "a", index, tiny_encoder, **opts)
    assert (report.deleted, report.added, report.unchanged) == (1, 0, 4)
    report = build(root, index, tiny_encoder, **opts)  # a scan of the whole root: nothing new, upload kept
    assert (report.added, report.deleted, report.scanned) == (0, 0, 8)
    paths = _paths(index)
    assert path in paths and len(paths) == 9
    manifest_root = IndexSnapshot.open(index).manifest.images_root
    assert manifest_root == str(root.resolve())

    # a build from a folder outside the root: the root widens to the common parent, nothing is lost
    other = tmp_path / "other"
    shutil.copytree(root / "b", other)
    build_index(other, index, tiny_encoder, BuildOptions(progress=False, num_workers=0))
    assert {p for p in _paths(index) if not is_upload_path(p)} == (
        {f"root/{p}" for p in paths if not is_upload_path(p)} | {f"other/{p.name}" for p in other.iterdir()})
    # asked to replace: every old folder path is stale, uploads stay
    build_index(other, index, tiny_encoder, BuildOptions(progress=False, num_workers=0, replace=True))
    assert {p for p in _paths(index) if not is_upload_path(p)} == {p.name for p in other.iterdir()}
    assert path in _paths(index)


def test_uploads_are_idempotent_and_deletes_remove_their_files(tmp_path, photos_dir, tiny_encoder):
    index, uploads = tmp_path / "index", tmp_path / "uploads"
    opts = BuildOptions(progress=False, num_workers=0)
    data = (photos_dir / "skimage-coffee.png").read_bytes()
    batch = new_staging_batch()
    first = stage_upload(uploads, batch, 0, data, "PNG")
    twin = stage_upload(uploads, batch, 1, data, "PNG")  # the same bytes twice in one request
    other = stage_upload(uploads, batch, 2, (photos_dir / "sklearn-china.jpg").read_bytes(), "JPEG")
    broken_staged = f"{STAGING_DIR}/{batch}/3.png"
    (uploads / broken_staged).write_bytes(b"\x89PNG\r\n\x1a\n but truncated")
    images = [NewImage(p, s, h, {}, f"f{i}") for i, (s, p, h) in enumerate([first, twin, other])]
    images.append(NewImage(f".uploads/ee/{'e' * 64}.png", broken_staged, "e" * 64, {}, "broken"))
    report = add_images(index, uploads, tiny_encoder, images, opts)
    statuses = [(im["status"], im["id"]) for im in report.images]
    assert statuses[0] == ("added", 0) and statuses[1] == ("added", 0) and statuses[2] == ("added", 1)
    assert statuses[3] == ("skipped", None) and report.images[3]["reason"]
    assert report.version == 1 and len(IndexSnapshot.open(index)) == 2

    # a job retried after it committed (its staged files already moved): nothing changes
    again = add_images(index, uploads, tiny_encoder, images[:3], opts)
    assert again.version is None and [im["status"] for im in again.images] == ["exists"] * 3
    assert [im["id"] for im in again.images] == [0, 0, 1]
    # new metadata for existing content replaces the stored one (a new version, same id)
    batch2 = new_staging_batch()
    s, p, h = stage_upload(uploads, batch2, 0, data, "PNG")
    meta = add_images(index, uploads, tiny_encoder, [NewImage(p, s, h, {"tag": "cup"}, "again")], opts)
    assert meta.version == 2 and meta.images[0]["id"] == 0
    stored = IndexSnapshot.open(index).table.get(0).metadata
    assert stored["tag"] == "cup" and stored["file"]["name"] == "f0" and set(stored) == {"tag", "file"}

    stored = upload_file(uploads, first[1])
    assert stored.is_file()
    gone = delete_images(index, [0, 99], uploads)
    assert (gone.deleted, gone.missing, gone.version) == ([0], [99], 3)
    assert not stored.exists() and upload_file(uploads, other[1]).is_file()
    assert delete_images(index, [0], uploads).version is None  # already gone: no new version
    assert read_current(index) == "v000003" and (index / VERSIONS_DIR / "v000003").is_dir()
