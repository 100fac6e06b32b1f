"""Index building and search: candidates + rerank vs exact, incremental updates, corrupt files, atomicity."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import build
from regis.errors import IndexLockedError, IndexMismatchError
from regis.indexes.layout import CURRENT_FILE, VERSIONS_DIR
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.writer import IndexWriter
from regis.models.encoder import build_encoder
from regis.retrieve.query import QueryEngine
from regis.retrieve.searcher import Searcher
from regis.scores.maxsim import maxsim_scores


@pytest.fixture()
def photos(tmp_path, photos_dir):
    """A private, writable copy of the photos."""
    out = tmp_path / "photos"
    shutil.copytree(photos_dir, out)
    return out


@pytest.fixture()
def tiny_index(tmp_path, photos, tiny_encoder):
    index = tmp_path / "index"
    report = build(photos, index, tiny_encoder)
    assert report.added == 21 and report.version == 1
    return index


def _paths(index):
    snap = IndexSnapshot.open(index)
    try:
        return {r.path: r.id for r in snap.table.iter_all()}
    finally:
        snap.close()


def test_ann_equals_exact_when_depth_covers_the_index(tiny_index, tiny_encoder):
    snap = IndexSnapshot.open(tiny_index)
    searcher = Searcher(snap)
    rng = np.random.default_rng(0)
    for _ in range(5):
        q = rng.standard_normal((10, 32)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        ann = searcher.search(q, k=21, depth=210)  # k' = every token vector: the candidates are all images
        exact = searcher.search(q, k=21, mode="exact")
        assert ann.num_candidates == 21
        np.testing.assert_array_equal(ann.ids, exact.ids)
        np.testing.assert_allclose(ann.scores, exact.scores, rtol=1e-6)
    snap.close()


def test_returned_score_is_maxsim_of_the_stored_tokens(tiny_index, photos):
    engine = QueryEngine.open(tiny_index)
    result = engine.search_file(photos / "skimage-coffee.png", k=5)
    q, _ = engine.encode_bytes((photos / "skimage-coffee.png").read_bytes())
    for hit in result["results"]:
        stored = torch.from_numpy(engine.snapshot.store.get(np.array([hit["id"]])).astype(np.float32))
        assert np.isclose(maxsim_scores(torch.from_numpy(q), stored)[0].item(), hit["score"], atol=1e-5)
    assert result["results"][0]["path"] == "skimage-coffee.png"
    assert result["results"][0]["score"] == pytest.approx(10.0, abs=1e-2)  # S(Q, Q) = m (float16 storage)
    engine.close()


def test_stored_tokens_are_unit_norm_float16(tiny_index):
    snap = IndexSnapshot.open(tiny_index)
    ids, tokens = next(snap.store.iter_chunks())
    assert tokens.dtype == np.float16 and tokens.shape == (21, 10, 32)
    np.testing.assert_allclose(np.linalg.norm(tokens.astype(np.float32), axis=-1), 1.0, atol=2e-3)
    assert snap.faiss.ntotal == 210
    snap.close()


def test_manifest_describes_the_encoder(tiny_index, tiny_encoder):
    m = IndexSnapshot.open(tiny_index).manifest
    assert m.encoder == tiny_encoder.config and m.weights.sha256 == tiny_encoder.weights_info.sha256
    assert (m.tokens_per_image, m.dim, m.encoder.num_registers, m.encoder.roi_size) == (10, 32, 4, 3)
    assert m.faiss.spec == "Flat" and m.format_version == 1 and m.num_images == 21


def test_incremental_add_change_delete_keeps_ids_stable(tiny_index, photos, tiny_encoder):
    before = _paths(tiny_index)
    # unchanged folder: only a scan, no new version
    report = build(photos, tiny_index, tiny_encoder)
    assert (report.added, report.updated, report.deleted, report.version) == (0, 0, 0, None)
    # add one, change one, delete one, touch one (new mtime, same bytes)
    (photos / "sub").mkdir()
    shutil.copyfile(photos / "skimage-astronaut.png", photos / "sub" / "copy.png")
    shutil.copyfile(photos / "skimage-moon.png", photos / "skimage-coffee.png")
    (photos / "skimage-rocket.jpg").unlink()
    os.utime(photos / "skimage-brick.png", (time.time() + 5, time.time() + 5))
    report = build(photos, tiny_index, tiny_encoder)
    assert (report.added, report.updated, report.deleted, report.touched) == (1, 1, 1, 1)
    assert report.version == 2
    after = _paths(tiny_index)
    assert "skimage-rocket.jpg" not in after
    assert after["sub/copy.png"] == max(before.values()) + 1  # new id, never a reused one
    for path, image_id in after.items():
        if path in before:
            assert before[path] == image_id  # stable ids, also for the changed file
    engine = QueryEngine.open(tiny_index)
    hit = engine.search_file(photos / "skimage-moon.png", k=2)["results"]
    assert {h["path"] for h in hit} == {"skimage-moon.png", "skimage-coffee.png"}  # same bytes now
    assert engine.snapshot.faiss.ntotal == 21 * 10
    engine.close()


def test_corrupt_files_are_skipped_and_listed(tmp_path, photos, tiny_encoder):
    (photos / "empty.jpg").write_bytes(b"")
    (photos / "notes.png").write_bytes(b"these are notes, not a picture")
    good = (photos / "skimage-rocket.jpg").read_bytes()
    (photos / "truncated.jpg").write_bytes(good[: len(good) // 4])
    (photos / "readme.txt").write_text("ignored: not an image extension")
    report = build(photos, tmp_path / "index", tiny_encoder, num_workers=2, batch_size=4)
    assert report.added == 21
    assert sorted(s["path"] for s in report.skipped) == ["empty.jpg", "notes.png", "truncated.jpg"]
    assert all(s["reason"] for s in report.skipped)
    assert IndexSnapshot.open(tmp_path / "index").manifest.num_images == 21


def test_failed_commit_leaves_the_old_index_intact(tiny_index, photos, tiny_encoder, monkeypatch):
    from regis.indexes import writer as writer_mod

    before = _paths(tiny_index)
    shutil.copyfile(photos / "skimage-moon.png", photos / "new.png")

    def explode(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(writer_mod, "write_current", explode)  # dies just before CURRENT is replaced
    with pytest.raises(OSError, match="disk full"):
        build(photos, tiny_index, tiny_encoder)
    monkeypatch.undo()
    assert (tiny_index / CURRENT_FILE).read_text().strip() == "v000001"
    assert _paths(tiny_index) == before
    # the next build cleans up and succeeds
    assert build(photos, tiny_index, tiny_encoder).added == 1
    assert sorted(p.name for p in (tiny_index / VERSIONS_DIR).iterdir()) == ["v000001", "v000002"]


def test_garbage_collection_keeps_the_live_chain(tiny_index, photos, tiny_encoder):
    (tiny_index / VERSIONS_DIR / "v000002").mkdir()  # a writer killed after its rename, before CURRENT
    for i in range(4):
        shutil.copyfile(photos / "skimage-moon.png", photos / f"more{i}.png")
        build(photos, tiny_index, tiny_encoder)
    assert sorted(p.name for p in (tiny_index / VERSIONS_DIR).iterdir()) == ["v000004", "v000005", "v000006"]
    referenced = set()
    for name in ("v000004", "v000005", "v000006"):
        referenced |= {s.file for s in IndexSnapshot.open(tiny_index, name).manifest.segments}
    assert {p.name for p in (tiny_index / "segments").iterdir()} == referenced


def test_killed_build_leaves_the_old_index_readable(tmp_path, photos, tiny_index):
    """SIGKILL a real `regis index build` at several moments; the old version stays readable every time."""
    for i in range(40):
        shutil.copyfile(photos / "skimage-astronaut.png", photos / f"extra{i:02d}.png")
    before = _paths(tiny_index)
    cmd = [sys.executable, "-m", "regis", "index", "build", str(photos), "--index", str(tiny_index),
           "--no-progress", "--workers", "0", "--batch-size", "4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for delay in (1.5, 2.5, 3.5, 4.5):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        paths = _paths(tiny_index)  # readable after every kill
        if len(paths) == len(before) + 40:
            break  # the kill came after the publish: the new version is complete
        assert paths == before
        engine = QueryEngine.open(tiny_index)
        assert engine.search_file(photos / "skimage-chelsea.png", k=1)["results"][0]["path"] == "skimage-chelsea.png"
        engine.close()
    # whatever happened, a final build completes the index
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    assert len(_paths(tiny_index)) == len(before) + 40


def test_another_encoder_is_refused(tiny_index, photos):
    other = build_encoder("vit-tiny-reg4-test", random_init=True, seed=1)
    with pytest.raises(IndexMismatchError, match="they differ in the weights .* new index directory"):
        build(photos, tiny_index, other)
    shifted = build_encoder("vit-tiny-reg4-test", random_init=True, border="shift")  # the same weights
    with pytest.raises(IndexMismatchError, match="they differ in border 'clip' vs 'shift' \\(index vs encoder\\)"):
        build(photos, tiny_index, shifted)
    both = build_encoder("vit-tiny-reg4-test", random_init=True, seed=1, border="shift")  # each named
    with pytest.raises(IndexMismatchError, match="they differ in border 'clip' vs 'shift', the weights \\(index"):
        build(photos, tiny_index, both)
    with pytest.raises(IndexMismatchError):
        QueryEngine(other, IndexSnapshot.open(tiny_index))


def test_one_writer_at_a_time(tiny_index, tiny_encoder):
    with IndexWriter(tiny_index, tiny_encoder.config, tiny_encoder.weights_info):
        with pytest.raises(IndexLockedError, match="another process"):
            IndexWriter(tiny_index, tiny_encoder.config, tiny_encoder.weights_info)
    IndexWriter(tiny_index, tiny_encoder.config, tiny_encoder.weights_info).abort()  # released


def test_ivf_index_with_per_call_nprobe(tmp_path, tiny_encoder):
    """An IVF token index: search parameters come per call and never change the shared index."""
    rng = np.random.default_rng(1)
    tokens = rng.standard_normal((400, 10, 32)).astype(np.float32)
    tokens /= np.linalg.norm(tokens, axis=-1, keepdims=True)
    from regis.indexes.table import ImageRecord

    with IndexWriter(tmp_path / "ivf", tiny_encoder.config, tiny_encoder.weights_info, faiss_spec="IVF16,Flat") as w:
        ids = w.allocate_ids(400)
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
        m = w.commit()
    assert m.faiss.spec == "IVF16,Flat" and not m.faiss.auto
    snap = IndexSnapshot.open(tmp_path / "ivf")
    searcher = Searcher(snap)
    import faiss

    nprobe_before = faiss.extract_index_ivf(snap.faiss).nprobe
    full = searcher.search(tokens[7], k=10, depth=400, nprobe=16)
    exact = searcher.search(tokens[7], k=10, mode="exact")
    np.testing.assert_array_equal(full.ids, exact.ids)
    narrow = searcher.search(tokens[7], k=10, depth=5, nprobe=1)
    assert narrow.ids[0] == 7 and narrow.num_candidates < full.num_candidates
    assert faiss.extract_index_ivf(snap.faiss).nprobe == nprobe_before
