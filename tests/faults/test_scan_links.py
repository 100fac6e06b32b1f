"""A symlinked file inside an indexed folder that leads outside the images root is never read (issue 14,
fault 5); one that stays inside the root is indexed like any file."""

from __future__ import annotations

import shutil

from conftest import build
from indexer.scan import scan_folder
from regis.indexes.snapshot import IndexSnapshot


def test_symlinked_files_leading_out_of_the_root_are_skipped(tmp_path, photos_dir, tiny_encoder):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    secret = tmp_path / "outside" / "secret.png"
    secret.parent.mkdir()
    shutil.copy(photos_dir / "skimage-coffee.png", secret)
    shutil.copy(photos_dir / "skimage-moon.png", root / "b" / "moon.png")
    shutil.copy(photos_dir / "skimage-chelsea.png", root / "a" / "chelsea.png")
    (root / "a" / "leak.png").symlink_to(secret)
    (root / "a" / "moon-link.png").symlink_to(root / "b" / "moon.png")
    (root / "a" / "dangling.png").symlink_to(tmp_path / "missing.png")

    assert [e.path for e in scan_folder(root)] == ["a/chelsea.png", "a/moon-link.png", "b/moon.png"]
    # a folder build confined to the images root keeps a link to a sibling folder, never one leading out
    assert [e.path for e in scan_folder(root / "a", confine_to=root)] == ["chelsea.png", "moon-link.png"]
    assert [e.path for e in scan_folder(root / "a")] == ["chelsea.png"]

    index = tmp_path / "index"
    build(root / "a", index, tiny_encoder, images_root=root)
    snap = IndexSnapshot.open(index)
    try:
        assert sorted(r.path for r in snap.table.iter_all()) == ["a/chelsea.png", "a/moon-link.png"]
    finally:
        snap.close()
