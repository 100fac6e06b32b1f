"""Collections and folder-scoped builds on the bundled real photos: two folders in one collection, and in two
collections, both survive each other's builds; ``--replace`` keeps the old one-folder behaviour."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from regis.errors import ConfigError
from regis.indexes.collections import CollectionExistsError, CollectionNotFoundError, CollectionsRoot
from regis.indexes.snapshot import IndexSnapshot
from tests.conftest import build


def _split(photos_dir: Path, tmp_path: Path) -> tuple[Path, Path, list[str], list[str]]:
    """Two sibling folders a/ and b/ holding different photos (12 and 9)."""
    names = sorted(p.name for p in photos_dir.iterdir())
    a, b = tmp_path / "data" / "a", tmp_path / "data" / "b"
    for folder, part in ((a, names[:12]), (b, names[12:])):
        folder.mkdir(parents=True)
        for name in part:
            shutil.copy(photos_dir / name, folder / name)
    return a, b, names[:12], names[12:]


def _paths(index: Path) -> dict[str, int]:
    snap = IndexSnapshot.open(index)
    try:
        return {r.path: r.id for r in snap.table.iter_all()}
    finally:
        snap.close()


def test_two_folders_in_one_index_both_survive_each_others_builds(tmp_path, photos_dir, lite0_encoder, one_thread):
    a, b, names_a, names_b = _split(photos_dir, tmp_path)
    index = tmp_path / "index"
    assert build(a, index, lite0_encoder).added == 12
    ids_a = _paths(index)
    report = build(b, index, lite0_encoder)
    assert (report.added, report.deleted) == (9, 0)
    paths = _paths(index)
    assert set(paths) == {f"a/{n}" for n in names_a} | {f"b/{n}" for n in names_b}
    assert {f"a/{p}": i for p, i in ids_a.items()} == {p: i for p, i in paths.items() if p.startswith("a/")}
    snap = IndexSnapshot.open(index)
    assert snap.manifest.images_root == str((tmp_path / "data").resolve())
    snap.close()

    # rebuilding a/ after one of its files went: only that file leaves; b/ is untouched
    (a / names_a[0]).unlink()
    report = build(a, index, lite0_encoder)
    assert (report.added, report.deleted, report.unchanged) == (0, 1, 11)
    assert set(_paths(index)) == {f"a/{n}" for n in names_a[1:]} | {f"b/{n}" for n in names_b}
    # the old behaviour, asked for: b/ replaces everything
    report = build(b, index, lite0_encoder, replace=True)
    assert set(_paths(index)) == set(names_b)
    assert report.deleted == 11 + 9 and report.added == 9  # b/'s paths are re-rooted: new rows


def test_search_finds_images_of_both_folders(tmp_path, photos_dir, lite0_encoder, one_thread):
    from regis.retrieve.query import QueryEngine

    a, b, names_a, names_b = _split(photos_dir, tmp_path)
    index = tmp_path / "index"
    build(a, index, lite0_encoder)
    build(b, index, lite0_encoder)
    engine = QueryEngine(lite0_encoder, IndexSnapshot.open(index))
    for path in (a / names_a[3], b / names_b[2]):
        top = engine.search_file(path, k=1)["results"][0]
        assert top["path"] == f"{path.parent.name}/{path.name}"
    engine.close()


def _three_photos(tmp_path, photos_dir):
    """A folder of three bundled photos (coffee, chelsea, rocket) to build collections from."""
    folder = tmp_path / "three"
    folder.mkdir()
    for name in ("skimage-coffee.png", "skimage-chelsea.png", "skimage-rocket.jpg"):
        shutil.copy(photos_dir / name, folder / name)
    return folder


def test_two_collections_are_separate_indexes(tmp_path, photos_dir, lite0_encoder, tiny_encoder, one_thread):
    a, b, names_a, names_b = _split(photos_dir, tmp_path)
    root = CollectionsRoot(tmp_path / "collections")
    build(a, root.create("alpha"), lite0_encoder)
    build(b, root.create("beta"), tiny_encoder)  # another backbone in the same deployment
    build(a, root.path("alpha"), lite0_encoder)  # a rebuild changes nothing in either
    assert root.names() == ["alpha", "beta"]
    assert set(_paths(root.path("alpha"))) == set(names_a)
    assert set(_paths(root.path("beta"))) == set(names_b)
    assert root.describe("beta")["backbone"] == "vit-tiny-reg4-test" and root.describe("beta")["images"] == 9
    with pytest.raises(CollectionExistsError):
        root.create("alpha")
    for bad in ("", "../x", "A", "a/b", ".hidden", "x" * 64):
        with pytest.raises(ConfigError):
            root.path(bad)
    root.delete("beta")
    assert root.names() == ["alpha"] and not any(p.name.startswith(".deleted") for p in root.root.iterdir())
    with pytest.raises(CollectionNotFoundError):
        root.describe("beta")


def test_a_collections_layout_decides_its_first_index_version(tmp_path, photos_dir, tiny_encoder, one_thread):
    """A compact collection's folder build writes the compact layout (as ``regis index build --compact``);
    configs written before ``layout`` existed load as "default"; a layout not offered is refused."""
    import json

    from regis.indexes.collections import CollectionConfig

    folder = _three_photos(tmp_path, photos_dir)
    root = CollectionsRoot(tmp_path / "collections")
    compact = root.create("small", CollectionConfig(layout="compact"))
    assert root.config("small").writer_options() == {"faiss_codec": "compact", "token_store": "compact"}
    build(folder, compact, tiny_encoder)
    snap = IndexSnapshot.open(compact)
    assert (snap.manifest.faiss.codec, snap.manifest.token_store.rule) == ("PQ4x4fsr", "compact")
    snap.close()
    old = root.create("old")
    config = old / "collection.json"
    written = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in written.items() if k != "layout"}))  # as before the field
    assert root.config("old").layout == "default" and root.config("old").writer_options() == {}
    config.write_text(json.dumps({**written, "layout": "tiny"}))
    with pytest.raises(ConfigError, match="not a valid collection config"):
        root.config("old")


def _shard_layouts(collection: Path) -> list[tuple[str | None, str | None]]:
    """(FaissInfo.codec, TokenStoreInfo.rule) of every shard version the collection's record lists."""
    from regis.indexes.layout import VERSIONS_DIR
    from regis.indexes.manifest import read_manifest
    from regis.sharding.layout import read_state

    state = read_state(collection)
    manifests = [read_manifest(state.shard_path(collection, s) / VERSIONS_DIR / name)
                 for s, name in enumerate(state.names) if name is not None]
    return [(m.faiss.codec, m.token_store.rule) for m in manifests]


def test_a_sharded_compact_collections_shards_and_resharded_shards_are_compact(tmp_path, photos_dir, tiny_encoder,
                                                                              one_thread):
    """A compact collection made sharded (2 shards, as ``regis index build --ray --shards 2 --collection`` makes
    it) and filled by a folder build (through its ``CollectionWriter``): each shard's first version is in the
    compact layout, as the unsharded test above checks (it was the default: the layout was read for unsharded
    collections only), and so are the 3 shards a re-sharding writes (it kept neither the codec nor the store's
    compact rule)."""
    from regis.indexes.collections import CollectionConfig
    from regis.sharding.layout import create_collection, read_state
    from regis.sharding.reshard import reshard

    folder = _three_photos(tmp_path, photos_dir)
    root = CollectionsRoot(tmp_path / "collections")
    compact = root.create("small", CollectionConfig(layout="compact"))
    create_collection(compact, 2)
    assert build(folder, compact, tiny_encoder).added == 3
    assert _shard_layouts(compact) == [("PQ4x4fsr", "compact")] * 2  # ids 0 and 2 in shard 0, 1 in shard 1
    assert reshard(compact, 3).images == 3
    assert read_state(compact).num_shards == 3 and _shard_layouts(compact) == [("PQ4x4fsr", "compact")] * 3
    assert root.describe("small")["images"] == 3


def test_cli_creates_a_compact_collection_and_refuses_other_layouts(cli, tmp_path, photos_dir, one_thread):
    """``regis collections create --layout compact``: collection.json records it, ``collections list`` and
    ``info`` show it, the first ``index build`` writes the compact layout; a layout not offered is a usage
    error (exit 2, one line naming --layout) that creates nothing."""
    import json

    root = tmp_path / "collections"
    tiny = ("--root", root, "--backbone", "vit-tiny-reg4-test", "--random-init")
    bad = cli("collections", "create", "odd", *tiny, "--layout", "tiny")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.startswith("error: ") and "--layout" in bad.stderr and "compact" in bad.stderr, bad.stderr
    assert not (root / "odd").exists()
    assert cli("collections", "create", "small", *tiny, "--layout", "compact").returncode == 0
    assert cli("collections", "create", "plain", *tiny).returncode == 0
    for name, layout in (("small", "compact"), ("plain", "default")):
        assert json.loads((root / name / "collection.json").read_text())["layout"] == layout
        assert json.loads(cli("collections", "info", name, "--root", root).stdout)["config"]["layout"] == layout
    listing = cli("collections", "list", "--root", root).stdout.splitlines()
    assert sorted((line.split()[0], line.split()[-1]) for line in listing) == [("plain", "default"),
                                                                              ("small", "compact")]
    folder = _three_photos(tmp_path, photos_dir)
    built = cli("index", "build", folder, "--collection", "small", "--root", root, "--no-progress", "--workers", "0")
    assert built.returncode == 0, built.stderr
    snap = IndexSnapshot.open(root / "small")
    assert (snap.manifest.faiss.codec, snap.manifest.token_store.rule) == ("PQ4x4fsr", "compact")
    snap.close()


def test_cli_builds_two_folders_into_a_collection(tmp_path, photos_dir, one_thread):
    from typer.testing import CliRunner

    from cli.main import app

    a, b, names_a, names_b = _split(photos_dir, tmp_path)
    root = tmp_path / "collections"
    runner = CliRunner()

    def regis(*args):  # in-process (the subprocess path of the CLI is covered by tests/test_cli.py)
        out = runner.invoke(app, list(args))
        assert out.exit_code == 0, (out.output, out.exception)
        return out.stdout

    regis("collections", "create", "photos", "--root", str(root), "--backbone", "vit-tiny-reg4-test",
          "--random-init")
    assert "12 added, 0 updated, 0 deleted" in regis("index", "build", str(a), "--collection", "photos",
                                                     "--root", str(root), "--no-progress", "--workers", "0")
    assert "9 added, 0 updated, 0 deleted" in regis("index", "build", str(b), "-c", "photos", "--root", str(root),
                                                    "--no-progress", "--workers", "0")
    import json

    hits = json.loads(regis("search", "-c", "photos", "--root", str(root), str(b / names_b[0]), "-k", "4", "--json",
                            "--filter", "file.folder:a"))["results"]
    assert len(hits) == 4 and all(h["path"].startswith("a/") for h in hits)
    first = json.loads(regis("search", "-c", "photos", "--root", str(root), "--id", str(hits[0]["id"]), "-k", "1",
                             "--json"))["results"]
    assert first[0]["id"] == hits[0]["id"]
    listing = regis("collections", "list", "--root", str(root))
    assert listing.split()[:2] == ["photos", "21"] and "vit-tiny-reg4-test" in listing
    out = regis("index", "build", str(b), "-c", "photos", "--root", str(root), "--replace", "--no-progress",
                "--workers", "0")
    assert "21 deleted" in out  # a/ and b/ paths: b/ is re-rooted, its images come back as new rows
    regis("collections", "delete", "photos", "--root", str(root), "--yes")
    assert regis("collections", "list", "--root", str(root)) == ""
