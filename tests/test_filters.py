"""Metadata filters: the filter language on SQLite, build-time metadata (CSV/JSONL, sidecars, file facts with
EXIF), and filtered search on real photos: a filter keeping 1% of the images still returns k results, equal to
exact scoring over the filtered set."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from indexer.metadata import load_metadata_file
from regis.data.augment import edit_mixed
from regis.errors import ConfigError
from regis.indexes.filters import compile_filter, parse_filter
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord, ImageTable
from regis.retrieve.filtered import allowed_ids, exact_over, search_filtered
from regis.retrieve.searcher import Searcher
from tests.conftest import build


@pytest.fixture
def table(tmp_path):
    t = ImageTable(tmp_path / "t.sqlite", readonly=False)
    metas = [{"album": "trip", "year": 2019, "stars": 5, "tags": {"who": "ann"}},
             {"album": "trip", "year": 2021, "flag": True},
             {"album": "work", "year": 2023, "flag": False},
             {"year": 2024, "note": None},
             {}]
    t.upsert([ImageRecord(i, f"f/{i}.jpg", "0" * 64, 10 * (i + 1), 10, 1000 * i, 1.0 * i, m)
              for i, m in enumerate(metas)])
    t.commit()
    yield t
    t.close()


@pytest.mark.parametrize("f, expected", [
    ({"album": "trip"}, [0, 1]),
    ({"year": {"gte": 2021, "lt": 2024}}, [1, 2]),
    ({"album": {"in": ["work", "home"]}}, [2]),
    ({"album": {"ne": "trip"}}, [2, 3, 4]),
    ({"stars": {"exists": True}}, [0]),
    ({"note": {"exists": True}}, [3]),  # present with a null value
    ({"album": {"exists": False}}, [3, 4]),
    ({"flag": True}, [1]),
    ({"flag": False}, [2]),
    ({"tags.who": "ann"}, [0]),
    ({"or": [{"album": "work"}, {"year": 2019}]}, [0, 2]),
    ({"and": [{"album": "trip"}, {"not": {"year": 2019}}]}, [1]),
    ({"album": "trip", "year": {"gt": 2019}}, [1]),
    ({"width": {"gte": 30}, "bytes": {"lt": 4000}}, [2, 3]),
    ({"size": 0}, [0]),
    ({"path": {"in": ["f/1.jpg", "f/4.jpg"]}}, [1, 4]),
])
def test_filters_select_the_rows_worked_out_by_hand(table, f, expected):
    sql, params = compile_filter(f)
    assert table.ids_where(sql, params).tolist() == expected


@pytest.mark.parametrize("bad", [
    {}, {"a": {}}, {"a": {"like": "x"}}, {"a'); DROP TABLE images; --": 1}, {"a": {"in": []}}, {"a": {"in": "x"}},
    {"a": {"gt": [1]}}, {"a": {"exists": "yes"}}, {"or": []}, {"or": {"a": 1}}, {"a": {"eq": {"b": 1}}},
    {"not": {"not": {"not": {"not": {"not": {"not": {"not": {"not": {"not": {"a": 1}}}}}}}}}},
])
def test_malformed_filters_are_refused_with_a_message(bad):
    with pytest.raises(ConfigError):
        compile_filter(bad)


def test_query_string_forms():
    assert parse_filter('{"album": "trip"}') == {"album": "trip"}
    assert parse_filter("album:trip,year:2020,ok:true") == {"album": "trip", "year": 2020, "ok": True}
    assert parse_filter("") is None and parse_filter(None) is None
    for bad in ("[1]", "{bad", "album"):
        with pytest.raises(ConfigError):
            parse_filter(bad)


def _exif_jpeg(src: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif[0x0110] = "Canon EOS 5D"
    exif.get_ifd(0x8769)[0x9003] = "2019:05:01 12:30:00"
    buf = io.BytesIO()
    src.save(buf, format="JPEG", exif=exif)
    return buf.getvalue()


def test_build_records_csv_jsonl_sidecar_metadata_and_file_facts(tmp_path, photos_dir, tiny_encoder):
    folder = tmp_path / "pics"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(photos_dir / "skimage-coffee.png", folder / "coffee.png")
    (folder / "sub" / "cam.jpg").write_bytes(_exif_jpeg(Image.open(photos_dir / "skimage-chelsea.png").convert("RGB")))
    (folder / "coffee.png.json").write_text(json.dumps({"album": "kitchen", "year": 2020}))
    (tmp_path / "meta.csv").write_text("path,year,stars\ncoffee.png,2021,4\nsub/cam.jpg,,2\n")
    rows = load_metadata_file(tmp_path / "meta.csv")
    assert rows == {"coffee.png": {"year": 2021, "stars": 4}, "sub/cam.jpg": {"stars": 2}}
    (tmp_path / "meta.jsonl").write_text('{"path": "sub/cam.jpg", "album": "cats"}\n')
    index = tmp_path / "index"
    build(folder, index, tiny_encoder, metadata=rows)
    meta = {r.path: r.metadata for r in IndexSnapshot.open(index).table.iter_all()}
    assert meta["coffee.png"] == {"album": "kitchen", "year": 2021, "stars": 4,  # the CSV wins over the sidecar
                                  "file": {"folder": "", "name": "coffee.png", "ext": "png"}}
    assert meta["sub/cam.jpg"] == {"stars": 2, "file": {"folder": "sub", "name": "cam.jpg", "ext": "jpg",
                                                        "taken_at": "2019-05-01T12:30:00", "camera": "Canon EOS 5D",
                                                        "captured_at": "2019-05-01T12:30:00"}}
    # new metadata for unchanged files: a new version, no re-embedding
    report = build(folder, index, tiny_encoder, metadata=load_metadata_file(tmp_path / "meta.jsonl"))
    assert (report.added, report.updated, report.version) == (0, 0, 2)
    snap = IndexSnapshot.open(index)
    assert snap.table.get_by_paths(["sub/cam.jpg"])["sub/cam.jpg"].metadata["album"] == "cats"
    sql, params = compile_filter({"file.camera": "Canon EOS 5D", "file.taken_at": {"gte": "2019-01-01"}})
    assert [snap.table.get(i).path for i in snap.table.ids_where(sql, params)] == ["sub/cam.jpg"]
    for bad in ("path;x\n", ""):
        (tmp_path / "bad.csv").write_text(bad)
        with pytest.raises(ConfigError, match="bad.csv"):
            load_metadata_file(tmp_path / "bad.csv")


@pytest.fixture(scope="module")
def corpus_index(tmp_path_factory, photos_dir, tiny_encoder):
    """504 images: 24 edited copies of each of the 21 real photos, with metadata ``n`` (0..503) from a JSONL
    file, so that ``{"n": {"lt": 5}}`` keeps 1% of them and ``{"even": true}`` half."""
    root = tmp_path_factory.mktemp("filtered")
    folder = root / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    lines = []
    n = 0
    for src in sorted(photos_dir.iterdir()):
        img = Image.open(src).convert("RGB")
        img.thumbnail((160, 160))
        for _ in range(24):
            name = f"{n:04d}.jpg"
            Image.open(io.BytesIO(edit_mixed(img, rng))).convert("RGB").save(folder / name, quality=85)
            lines.append(json.dumps({"path": name, "n": n, "even": n % 2 == 0}))
            n += 1
    (root / "meta.jsonl").write_text("\n".join(lines))
    build(folder, root / "index", tiny_encoder, metadata=load_metadata_file(root / "meta.jsonl"), batch_size=64)
    return root / "index"


def _exact_filtered(searcher, query, where, k):
    """The oracle: exact MaxSim of every image matching the filter, worked out without the filtered path."""
    snap = searcher.snapshot
    keep = [r.id for r in snap.table.iter_all() if _matches(r.metadata, where)]
    ids = np.array(keep, dtype=np.int64)
    scores = searcher.rerank(query, ids)
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def _matches(meta, where):
    if "n" in where:
        return meta["n"] < where["n"]["lt"]
    return meta["even"] is where["even"]


@pytest.mark.parametrize("where, k", [({"n": {"lt": 5}}, 5), ({"even": True}, 10)])
def test_filtered_search_equals_exact_scoring_over_the_filtered_set(corpus_index, tiny_encoder, photos_dir, where,
                                                                    k, one_thread):
    from regis.retrieve.query import QueryEngine

    engine = QueryEngine(tiny_encoder, IndexSnapshot.open(corpus_index))
    searcher = engine.searcher
    assert len(searcher.snapshot) == 504
    for name in ("skimage-coffee.png", "sklearn-china.jpg", "skimage-rocket.jpg"):
        query, _ = engine.encode_bytes((photos_dir / name).read_bytes())
        want_ids, want_scores = _exact_filtered(searcher, query, where, k)
        result = engine.search_tokens(query, k=k, where=where)
        assert [h["id"] for h in result["results"]] == want_ids.tolist()
        np.testing.assert_allclose([h["score"] for h in result["results"]], want_scores, rtol=1e-5)
        # the ANN path (no shortcut for small allowed sets): candidates filtered before the rerank, k results
        # from the allowed set; for the 1% filter the candidates run short and the exact fallback answers
        allowed = allowed_ids(searcher.snapshot, where)
        ann = search_filtered(searcher, query, allowed, k=k, exact_limit=0, depth=4)
        assert len(ann.ids) == k and set(ann.ids.tolist()) <= set(allowed.tolist())
        if len(allowed) == 5:
            assert ann.ids.tolist() == want_ids.tolist() and ann.num_candidates == 5
    engine.close()


def test_exact_over_a_set_equals_the_searchers_exact_mode(corpus_index, tiny_encoder, photos_dir):
    snap = IndexSnapshot.open(corpus_index)
    searcher = Searcher(snap)
    query = np.random.default_rng(1).standard_normal((10, snap.manifest.dim)).astype(np.float32)
    query /= np.linalg.norm(query, axis=1, keepdims=True)
    ids, scores = exact_over(searcher, query, snap.store.live_ids, 7, chunk=100)
    full = searcher.search(query, k=7, mode="exact")
    assert ids.tolist() == full.ids.tolist()
    snap.close()
