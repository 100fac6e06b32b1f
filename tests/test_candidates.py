"""Candidate generation (issue 15): the default finds the exact top-k even when a token's neighbour list
saturates, i.e. more images hold a near-identical token than the candidate depth keeps."""

import json

import numpy as np
import pytest

from regis.errors import ConfigError
from regis.indexes.layout import MANIFEST_FILE, VERSIONS_DIR
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.models.encoder import EncoderConfig, WeightsInfo
from regis.retrieve import candidates as cands
from regis.retrieve.searcher import Searcher

D = 32
T = 10

SHARERS = 50  # images holding each shared token
BOTH = 10  # images holding both shared tokens: the exact top-10 of the query (s1, s2)


def write_index(path, tokens, **kwargs):
    """A regis index of ``tokens`` (n, T, D) written by the real ``IndexWriter``; returns its manifest."""
    config = EncoderConfig(backbone="test-tokens", kind="cnn", num_registers=T // 2 - 1, dim=D, cue_method="kmeans",
                           mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    with IndexWriter(path, config, WeightsInfo(source="test", sha256="0" * 64), **kwargs) as w:
        ids = w.allocate_ids(len(tokens))
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
        return w.commit()


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def shared_token_corpus(n_other: int = 210, seed: int = 0):
    """Tokens (n, T, D) where 50 images hold a copy of s1 (position 0) and 50 a copy of s2 (position 1), 10 of
    them both; those 10 hold their copies with more noise (cos ~0.96) than the 80 others (cos ~0.999), so the
    depth-8 neighbour lists of s1 and s2 are filled with single holders. Returns tokens, query (2, D), the ids
    holding both."""
    rng = np.random.default_rng(seed)
    n = 2 * SHARERS - BOTH + n_other
    tokens = _unit(rng.standard_normal((n, T, D)))
    s1, s2 = _unit(rng.standard_normal((2, D)))
    both = np.arange(BOTH)
    only1 = np.arange(BOTH, SHARERS)
    only2 = np.arange(SHARERS, 2 * SHARERS - BOTH)
    for ids, pos, s in ((both, 0, s1), (both, 1, s2)):
        tokens[ids, pos] = _unit(s + 0.05 * rng.standard_normal((len(ids), D)))
    tokens[only1, 0] = _unit(s1 + 0.005 * rng.standard_normal((len(only1), D)))
    tokens[only2, 1] = _unit(s2 + 0.005 * rng.standard_normal((len(only2), D)))
    perm = rng.permutation(n)  # ids must not reveal the structure
    inverse = np.argsort(perm)
    return tokens[perm], np.stack([s1, s2]), np.sort(inverse[both])


@pytest.fixture(scope="module")
def corpus():
    return shared_token_corpus()


@pytest.mark.parametrize("spec", [None, "IVF16,Flat"])
def test_default_finds_the_exact_top_k_when_50_images_share_a_token(tmp_path, corpus, spec):
    tokens, query, both = corpus
    manifest = write_index(tmp_path / "idx", tokens, depth=8, faiss_spec=spec, nprobe=4 if spec else None)
    assert manifest.faiss.depth == 8 and manifest.faiss.candidates == "bounded"
    snap = IndexSnapshot.open(tmp_path / "idx")
    try:
        searcher = Searcher(snap)
        exact = searcher.search(query, k=10, mode="exact")
        np.testing.assert_array_equal(np.sort(exact.ids), both)  # the case is what it claims to be
        ann = searcher.search(query, k=10)
        np.testing.assert_array_equal(ann.ids, exact.ids)
        np.testing.assert_allclose(ann.scores, exact.scores, rtol=1e-5)
        batch = searcher.search_batch(query[None], k=10)[0]
        np.testing.assert_array_equal(batch.ids, exact.ids)
        # today's path, still selectable, saturates: its depth-8 lists hold only single holders
        old = searcher.search(query, k=10, candidates="depth")
        assert len(np.intersect1d(old.ids, both)) < BOTH // 2
        assert ann.num_candidates > old.num_candidates
    finally:
        snap.close()


def test_depth_method_is_recorded_and_old_manifests_read_as_bounded(tmp_path, corpus):
    tokens, query, both = corpus
    write_index(tmp_path / "idx", tokens[:200], depth=8, candidates="depth")
    snap = IndexSnapshot.open(tmp_path / "idx")
    assert snap.manifest.faiss.candidates == "depth"
    assert Searcher(snap).candidate_method == "depth"
    assert Searcher(snap, candidates="bounded").candidate_method == "bounded"
    with pytest.raises(ConfigError):
        Searcher(snap, candidates="all")
    with pytest.raises(ConfigError):
        Searcher(snap).search(query, k=10, candidates="widest")
    path = tmp_path / "idx" / VERSIONS_DIR / snap.name / MANIFEST_FILE
    snap.close()
    raw = json.loads(path.read_text())
    del raw["faiss"]["candidates"]  # an index written before the field existed
    path.write_text(json.dumps(raw))
    snap = IndexSnapshot.open(tmp_path / "idx")
    assert snap.manifest.faiss.candidates == "bounded"
    snap.close()
    with pytest.raises(ConfigError):
        write_index(tmp_path / "bad", tokens[:10], candidates="all")


def test_range_radius_worked_by_hand():
    full = np.ones(3, dtype=bool)
    # sum of tails 2.0 > theta 1.5: tokens above 1.5 / 3 = 0.5 searched with r = (1.5 - 0.2) / 2
    which, r = cands.range_radius(np.array([0.9, 0.9, 0.2], np.float32), full, 1.5)
    assert which.tolist() == [0, 1] and r == pytest.approx(0.65)
    # 0.45 > theta/3 = 0.4 but <= r = (1.2 - 0) / 2 = 0.6: it joins the others, r = (1.2 - 0.45) / 1
    which, r = cands.range_radius(np.array([0.9, 0.45, 0.0], np.float32), full, 1.2)
    assert which.tolist() == [0] and r == pytest.approx(0.75)
    # an exhausted list (not full) is never searched again; its tail still counts
    which, r = cands.range_radius(np.array([0.9, 0.9, 0.2], np.float32), np.array([True, False, True]), 1.5)
    assert which.tolist() == [0] and r == pytest.approx(0.4)
    # the candidates are complete: sum of tails <= theta
    which, _ = cands.range_radius(np.array([0.3, 0.3, 0.2], np.float32), full, 1.0)
    assert len(which) == 0
    which, _ = cands.range_radius(np.array([0.9, 0.9], np.float32), full[:2], -np.inf)
    assert len(which) == 0


def test_list_tails():
    sims = np.array([[0.9, 0.8, 0.7], [0.5, -np.inf, -np.inf], [-np.inf] * 3], np.float32)
    ids = np.array([[1, 2, 3], [4, -1, -1], [-1, -1, -1]])
    tails, full = cands.list_tails(sims, ids)
    assert tails[:2].tolist() == pytest.approx([0.7, 0.5]) and tails[2] == -np.inf
    assert full.tolist() == [True, False, False]


def test_filtered_search_keeps_the_bound(tmp_path, corpus):
    """A metadata-filtered ANN search (``search_filtered``) gets the same range search, its images filtered."""
    from regis.retrieve.filtered import search_filtered

    tokens, query, both = corpus
    write_index(tmp_path / "idx", tokens, depth=8)
    snap = IndexSnapshot.open(tmp_path / "idx")
    try:
        searcher = Searcher(snap)
        allowed = np.setdiff1d(np.arange(len(tokens)), np.arange(0, len(tokens), 7))  # 1 image in 7 filtered out
        exact = search_filtered(searcher, query, allowed, k=10, mode="exact")
        ann = search_filtered(searcher, query, allowed, k=10, exact_limit=0)
        np.testing.assert_array_equal(ann.ids, exact.ids)
        assert np.isin(ann.ids, allowed).all()
        old = search_filtered(searcher, query, allowed, k=10, exact_limit=0, candidates="depth")
        assert len(np.intersect1d(old.ids, exact.ids)) < 5
    finally:
        snap.close()


def test_filtered_depth_scales_with_the_kept_fraction():
    from regis.retrieve.filtered import filtered_depth

    assert filtered_depth(64, 50_000, 100_000) == 128  # a 50 % filter
    assert filtered_depth(64, 33_334, 100_000) == 192
    assert filtered_depth(64, 100_000, 100_000) == 64  # no filter
    assert filtered_depth(64, 5_000, 100_000) == 1280
    assert filtered_depth(64, 1_000, 100_000) == 4096  # capped at MAX_DEPTH
    assert filtered_depth(64, 0, 100_000) == 64


def test_a_50_percent_filter_scores_as_many_allowed_images_as_an_unfiltered_search(tmp_path):
    """s1 and s2 are each held very closely by 8 filtered-out images and closely by 8 allowed ones (one token
    each); 4 allowed images hold both, less closely: the exact filtered top-4. Depth 16 per query token reaches
    only the first two groups, so a filter applied to depth-16 candidates ranks single holders; the depth scaled
    by the kept fraction (x2) reaches the 4 (fixed-depth candidate method, no bounded range search)."""
    from regis.retrieve.filtered import search_filtered

    rng = np.random.default_rng(3)
    n_random = 200
    s1, s2 = _unit(rng.standard_normal((2, D)))
    tokens = _unit(rng.standard_normal((36 + n_random, T, D)))
    groups = {"out1": np.arange(0, 8), "out2": np.arange(8, 16), "in1": np.arange(16, 24), "in2": np.arange(24, 32),
              "both": np.arange(32, 36)}
    for name, pos, s, noise in (("out1", 0, s1, 0.005), ("out2", 1, s2, 0.005), ("in1", 0, s1, 0.03),
                                ("in2", 1, s2, 0.03), ("both", 0, s1, 0.06), ("both", 1, s2, 0.06)):
        tokens[groups[name], pos] = _unit(s + noise * rng.standard_normal((len(groups[name]), D)))
    perm = rng.permutation(len(tokens))  # ids must not reveal the structure
    inverse = np.argsort(perm)
    tokens = tokens[perm]
    rejected = np.concatenate([groups["out1"], groups["out2"], 36 + np.arange(0, n_random, 2)])
    allowed = np.sort(np.setdiff1d(np.arange(len(tokens)), inverse[rejected]))
    both = np.sort(inverse[groups["both"]])
    write_index(tmp_path / "idx", tokens, depth=16, candidates="depth")
    snap = IndexSnapshot.open(tmp_path / "idx")
    try:
        searcher = Searcher(snap)
        query = np.stack([s1, s2])
        exact = search_filtered(searcher, query, allowed, k=4, mode="exact")
        np.testing.assert_array_equal(np.sort(exact.ids), both)  # the case is what it claims to be
        ann = search_filtered(searcher, query, allowed, k=4, exact_limit=0)
        assert ann.depth == 32  # 16 / (118 allowed of 236)
        np.testing.assert_array_equal(ann.ids, exact.ids)
        # a first round of depth 16 (what the unscaled depth gave; here depth 8 scaled x2) misses all 4
        shallow = search_filtered(searcher, query, allowed, k=4, exact_limit=0, depth=8)
        assert shallow.depth == 16 and len(np.intersect1d(shallow.ids, both)) == 0
    finally:
        snap.close()
