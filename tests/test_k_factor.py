"""Token re-ranking on the codes (``FaissInfo.k_factor``, issue 24): FAISS returns k_factor x depth neighbours
per query token and the compressed token store's codes keep the best depth. The similarities are worked out from
the decoded codes; the searcher's neighbours are exactly the best depth of FAISS's longer list by those; the
factor is recorded in the manifest and kept as the index grows; old manifests read as 1. Small random tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import add_tokens, token_writer, unit_tokens
from regis.errors import ConfigError
from regis.indexes import codes as token_codes
from regis.indexes import faiss_index
from regis.indexes.layout import MANIFEST_FILE
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.writer import IndexWriter
from regis.retrieve.searcher import Searcher

T, D, N = 10, 32, 2_400  # above FLAT_MAX_IMAGES: an IVF index with the spec asked for


def _writer(path, **kwargs) -> IndexWriter:
    return token_writer(path, "test-k-factor", D, **kwargs)


def _add(path, tokens: np.ndarray, **kwargs):
    return add_tokens(path, tokens, "test-k-factor", **kwargs)


def _tokens(n: int, seed: int) -> np.ndarray:
    return unit_tokens(n, seed, T, D)


@pytest.mark.parametrize("store", ["SQ4", "PQ8"])
def test_token_sims_are_inner_products_with_the_decoded_codes(tmp_path, store):
    tokens = _tokens(N, 0)
    _add(tmp_path / "idx", tokens, token_store=store)
    snap = IndexSnapshot.open(tmp_path / "idx")
    query = _tokens(1, 1)[0]
    rng = np.random.default_rng(2)
    token_ids = rng.integers(0, N * T, (T, 7))
    token_ids[3, 5:] = -1  # FAISS found fewer neighbours for this query token
    sims = snap.codes.token_sims(query, token_ids)
    assert sims.shape == (T, 7) and sims.dtype == np.float32
    # a batch's thousands of rows are decoded a few at a time: same values
    np.testing.assert_allclose(snap.codes.token_sims(query, token_ids, chunk_tokens=15), sims, rtol=1e-5, atol=1e-6)
    # by hand: decode image id // T, position id % T, and take the inner product with that row's query vector
    decoded = snap.codes.get(np.arange(N))  # (N, T, D)
    for i in range(T):
        for j in range(7):
            t = token_ids[i, j]
            if t < 0:
                assert sims[i, j] == -np.inf
            else:
                assert sims[i, j] == pytest.approx(float(decoded[t // T, t % T] @ query[i]), abs=1e-5)
    snap.close()


def test_neighbours_are_the_best_depth_of_the_longer_faiss_list_by_the_codes(tmp_path):
    spec = "IVF64,PQ4x4fs"  # coarse FAISS codes (2 bytes per token) beside the SQ4 store
    m = _add(tmp_path / "idx", _tokens(N, 0), faiss_spec=spec)  # 16 bits per 32-d token: k_factor 4 by default
    assert (m.faiss.spec, m.faiss.k_factor, m.token_store.spec) == (spec, 4, "SQ4")
    snap = IndexSnapshot.open(tmp_path / "idx")
    query, depth = _tokens(1, 1)[0], 16
    searcher = Searcher(snap)
    assert searcher.k_factor == 4
    sims, ids = searcher._neighbours(query, depth, None, 1)
    longer_sims, longer = faiss_index.search(snap.faiss, query, 4 * depth, nprobe=m.faiss.nprobe)
    code_sims = snap.codes.token_sims(query, longer)
    for i in range(T):
        assert set(ids[i]) <= set(longer[i]) and len(set(ids[i])) == depth
        np.testing.assert_array_equal(sims[i], np.sort(code_sims[i])[::-1][:depth])  # descending, the best depth
    # factor 1: FAISS's own list and similarities
    plain_sims, plain_ids = Searcher(snap, k_factor=1)._neighbours(query, depth, None, 1)
    np.testing.assert_allclose(plain_sims, longer_sims[:, :depth], rtol=1e-6)  # (ties may swap places)
    assert not np.array_equal(np.sort(plain_ids, axis=1), np.sort(ids, axis=1))  # the codes re-ordered the list
    # a search still returns exact MaxSim scores for what it ranks
    result = searcher.search(query, k=10)
    np.testing.assert_allclose(result.scores, searcher.rerank(query, result.ids), rtol=1e-6)
    with pytest.raises(ConfigError, match="k_factor"):
        Searcher(snap, k_factor=0)
    snap.close()


def test_the_factor_is_kept_as_the_index_grows_and_old_manifests_read_as_1(tmp_path):
    path = tmp_path / "idx"
    spec = "IVF64,PQ4x4fs"
    _add(path, _tokens(N, 0), faiss_spec=spec, k_factor=8)
    m = _add(path, _tokens(100, 3), faiss_spec=spec)
    assert m.faiss.k_factor == 8 and m.num_images == N + 100
    assert _add(tmp_path / "default", _tokens(100, 0)).faiss.k_factor == faiss_index.default_k_factor("Flat", D) == 1
    # the FAISS codes decide the default: at most 1 bit per dimension (the compact layout) 4, else 1
    specs = ("IVF16384(HNSW32_SQfp16),PQ32x4fs", "IVF4096,PQ64x4fs", "IVF4096,SQ8", "IVF4096,PQ128x4fs", "HNSW32")
    assert [faiss_index.default_k_factor(s, 256) for s in specs] == [4, 4, 1, 1, 1]
    assert faiss_index.default_k_factor("IVF4096,PQ640x4fs", 1280) == 1  # regis's wide-token codec: 2 bits / dim
    # residual codes ("x4fsr"): 2 at 1 bit per dimension, as the others otherwise
    assert [faiss_index.default_k_factor(s + "r", 256) for s in specs[:2]] == [4, 2]
    assert faiss_index.default_k_factor("IVF4096,PQ128x4fsr", 256) == 1
    assert faiss_index.default_depth("IVF4096,PQ64x4fsr") == faiss_index.FAST_SCAN_DEPTH
    assert [faiss_index.fast_scan_pq(c) for c in ("PQ64x4fs", "PQ64x4fsr", "SQ8", "PQ64", "PQ64x4fsrr", None)] == [
        (64, False), (64, True), None, None, None, None]
    with pytest.raises(ConfigError, match="k_factor"):
        _writer(tmp_path / "bad", k_factor=0)
    snap = IndexSnapshot.open(path)
    manifest_file = path / "versions" / snap.name / MANIFEST_FILE
    snap.close()
    data = json.loads(manifest_file.read_text())
    del data["faiss"]["k_factor"]  # a manifest written before the field existed
    manifest_file.write_text(json.dumps(data))
    snap = IndexSnapshot.open(path)
    assert snap.manifest.faiss.k_factor == 1 and Searcher(snap).k_factor == 1
    snap.close()


def test_an_index_without_codes_ignores_the_factor(tmp_path):
    _add(tmp_path / "idx", _tokens(N, 0), token_store="float16", faiss_spec="IVF64,SQ8", k_factor=4)
    snap = IndexSnapshot.open(tmp_path / "idx")
    assert snap.manifest.faiss.k_factor == 4 and snap.codes is None
    assert Searcher(snap).k_factor == 1  # nothing to re-rank on: FAISS's own list
    assert token_codes.FLOAT16 == snap.manifest.token_store.spec
    snap.close()


def test_a_faiss_codec_keeps_regis_sizing_the_lists_as_the_index_grows(tmp_path):
    """The compact layout without a hand-sized spec (``--faiss-codec``): Flat while small, then the IVF lists regis
    picks for the size with the codec asked for, the codec remembered through the Flat phase and kept after."""
    path = tmp_path / "idx"
    m = _add(path, _tokens(1_500, 0), faiss_codec="PQ4x4fs")  # <= 2,000 images: Flat
    assert (m.faiss.spec, m.faiss.codec, m.faiss.auto, m.faiss.k_factor) == ("Flat", "PQ4x4fs", True, 1)
    m = _add(path, _tokens(900, 1))  # 24,000 token vectors: 4 sqrt(n) -> 512 lists, the codec asked for at first
    assert m.faiss.spec == faiss_index.auto_spec(2_400, T, D, "PQ4x4fs") == "IVF512,PQ4x4fs"
    # 16 bits per 32-d token: the compact layout's token re-ranking and fast-scan depth follow from the spec
    assert (m.faiss.codec, m.faiss.k_factor, m.faiss.depth) == ("PQ4x4fs", 4, faiss_index.FAST_SCAN_DEPTH)
    m = _add(path, _tokens(100, 2))
    assert (m.faiss.spec, m.faiss.codec, m.num_images) == ("IVF512,PQ4x4fs", "PQ4x4fs", 2_500)
    snap = IndexSnapshot.open(path)
    query = _tokens(1, 3)[0]
    searcher = Searcher(snap)
    result = searcher.search(query, k=10)
    np.testing.assert_allclose(result.scores, searcher.rerank(query, result.ids), rtol=1e-6)
    snap.close()
    # the sizes of BENCHMARKS.md section 9's compact runs, 256-d tokens: the specs measured there
    assert faiss_index.auto_spec(300_000, 10, 256, "PQ32x4fs") == "IVF16384(HNSW32_SQfp16),PQ32x4fs"
    assert faiss_index.auto_spec(1_000_000, 10, 256, "PQ32x4fs") == "IVF32768(HNSW32_SQfp16),PQ32x4fs"
    # without it, the same growth gets regis's codec for the width
    plain = tmp_path / "plain"
    _add(plain, _tokens(1_500, 0))
    assert _add(plain, _tokens(900, 1)).faiss.spec == "IVF512,SQ8"
    with pytest.raises(ConfigError, match="FAISS cannot build"):
        _writer(tmp_path / "bad", faiss_codec="PQ5x4fs")  # 32 dimensions do not split into 5 sub-vectors


def test_the_compact_preset_sizes_its_codec_and_its_store_as_the_index_grows(tmp_path):
    """``--compact`` (faiss_codec and token_store "compact"): the FAISS codec PQ{D/8}x4fsr with regis's lists, and a
    store that starts as a plain PQ{D/4} and becomes the residual IVF1024,PQ{D/4} (re-encoded) once 39 x 1,024
    token vectors can train it; a search still returns exact MaxSim scores, and later writes keep the rule."""
    path = tmp_path / "idx"
    m = _add(path, _tokens(1_500, 0), faiss_codec="compact", token_store="compact")
    assert (m.faiss.spec, m.faiss.codec) == ("Flat", faiss_index.compact_codec(D)) == ("Flat", "PQ4x4fsr")
    assert (m.token_store.spec, m.token_store.rule) == ("PQ8", "compact")  # 15,000 vectors: the plain PQ
    snap = IndexSnapshot.open(path)
    codes_before = np.array(snap.codes.codes)
    snap.close()
    m = _add(path, _tokens(2_700, 1))  # 42,000 vectors >= 39,936: the residual store, every row re-encoded
    assert (m.faiss.spec, m.faiss.k_factor) == ("IVF1024,PQ4x4fsr", 4)
    assert (m.token_store.spec, m.token_store.rule, m.token_store.code_size) == ("IVF1024,PQ8", "compact", 10)
    snap = IndexSnapshot.open(path)
    assert snap.codes.codes.shape == (4_200, T, 10) and codes_before.shape == (1_500, T, 8)
    query = _tokens(1, 3)[0]
    searcher = Searcher(snap)
    result, exact = searcher.search(query, k=10), searcher.search(query, k=10, mode="exact")
    np.testing.assert_allclose(result.scores, searcher.rerank(query, result.ids), rtol=1e-6)
    assert len(np.intersect1d(result.ids, exact.ids)) >= 5  # random tokens: a loose check that it ranks at all
    snap.close()
    assert _add(path, _tokens(10, 4)).token_store.rule == "compact"  # kept without being asked again
    # a collection too small for the PQ's 8-bit codebooks (256 vectors) starts on SQ4
    assert [token_codes.compact_store(n, 256) for n in (100, 256, 39_935, 39_936)] == [
        "SQ4", "PQ64", "PQ64", "IVF1024,PQ64"]
    with pytest.raises(ConfigError, match="divisible by 8"):
        faiss_index.compact_codec(36)


def test_two_framings_of_256_d_tokens_get_residual_fast_scan_codes(tmp_path):
    """New two-framing indexes of 256-d tokens (the shipped encoder's) get ``PQ64x4fsr`` FAISS codes once they leave
    Flat, with k_factor 2 and depth 192 (``faiss_index.default_codec``); one framing of the same width stays SQ8, and
    a two-framing index that already has SQ8 codes keeps them as it grows. Searches return exact MaxSim scores."""
    from regis.indexes.table import ImageRecord
    from regis.models.encoder import EncoderConfig, WeightsInfo

    d, n = 256, 2_100  # 42,000 token vectors: IVF1024
    two = EncoderConfig(backbone="test-two-framings", kind="cnn", num_registers=4, dim=d, cue_method="grid",
                        frame="center-crop+aspect", framing_score="best", mean=(0.5,) * 3, std=(0.5,) * 3)
    t = two.tokens_per_image

    def add(path, tokens, config=two, **kwargs):
        with IndexWriter(path, config, WeightsInfo(source="test", sha256="0" * 64), **kwargs) as w:
            ids = w.allocate_ids(len(tokens))
            w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
            return w.commit()

    tokens = unit_tokens(n, 0, t, d)
    m = add(tmp_path / "two", tokens)
    assert (m.faiss.spec, m.faiss.k_factor, m.faiss.depth) == ("IVF1024,PQ64x4fsr", 2, faiss_index.FAST_SCAN_DEPTH)
    snap = IndexSnapshot.open(tmp_path / "two")
    searcher, query = Searcher(snap), unit_tokens(1, 1, 2 * two.query_tokens_per_framing, d)[0]
    result = searcher.search(query, k=10)
    np.testing.assert_allclose(result.scores, searcher.rerank(query, result.ids), rtol=1e-6)
    snap.close()
    one = two.model_copy(update={"frame": "center-crop", "framing_score": "union"})
    assert add(tmp_path / "one", unit_tokens(n, 2, one.tokens_per_image, d), config=one).faiss.spec == "IVF512,SQ8"
    kept = tmp_path / "kept"
    add(kept, tokens, faiss_spec="IVF1024,SQ8")
    assert add(kept, unit_tokens(100, 3, t, d)).faiss.spec == "IVF1024,SQ8"
    assert faiss_index.default_codec(256, framings=2) == "PQ64x4fsr"
    assert [faiss_index.default_codec(w, framings=2) for w in (32, 1280)] == ["SQ8", "PQ640x4fs"]
