"""IVF indexes with an HNSW coarse quantizer ("IVF{nlist}(HNSW32_SQfp16),SQ8", regis's default from ~210k images
of 10 tokens; issue 24, BENCHMARKS.md section 9).

Mechanics on clustered synthetic tokens (D = 32) through the real ``IndexWriter`` and ``Searcher``: two-level
training fills the quantizer, searches keep the exact ranking, the quantizer's search depth is per call, and an
index that grows keeps its spec. Speed is measured by ``bench.million``, never here.
"""

import numpy as np
import pytest

from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.retrieve.searcher import Searcher
from tests.perf.test_fast_paths import D, clustered_tokens, recall, token_encoder, write_index

SPEC = "IVF64(HNSW32_SQfp16),SQ8"  # the default's form (``faiss_index.auto_spec``)


@pytest.fixture(scope="module")
def data():
    return clustered_tokens(3240, seed=3)


@pytest.fixture(scope="module")
def hnsw_index(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("ivfhnsw") / "index"
    write_index(path, data[:3000], faiss_spec=SPEC)
    return path


@pytest.mark.parametrize("spec", [SPEC, "IVF64_HNSW32,SQ8"])
def test_two_level_training_fills_the_quantizer_with_unit_centroids(data, spec):
    index = faiss_index.new_index(spec, D)
    assert faiss_index.hnsw_quantizer(index) is not None
    assert faiss_index.hnsw_quantizer(faiss_index.new_index("IVF64,SQ8", D)) is None
    vectors = data[:3000].reshape(-1, D)
    faiss_index.train(index, vectors)
    quantizer = faiss_index.hnsw_quantizer(index)
    assert index.is_trained and quantizer.ntotal == 64
    centroids = quantizer.storage.reconstruct_n(0, 64)
    # spherical, as IVF-IP (float16 storage: to its precision)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=2e-3)
    # every list is used: the centroids sit on the data, not where a failed clustering leaves them
    _, lists = quantizer.search(vectors, 1)
    assert len(np.unique(lists)) == 64


def test_hnsw_quantizer_search_keeps_the_exact_ranking(hnsw_index, data):
    snap = IndexSnapshot.open(hnsw_index)
    try:
        assert snap.manifest.faiss.spec == SPEC and snap.manifest.faiss.nprobe == 32
        quantizer = faiss_index.hnsw_quantizer(snap.faiss)
        before = quantizer.hnsw.efSearch
        searcher = Searcher(snap)
        assert recall(searcher, data[3000:3040]) >= 0.99  # bounded candidates: range search through HNSW too
        assert recall(searcher, data[3000:3040], candidates="depth") >= 0.95
        assert quantizer.hnsw.efSearch == before  # the depth goes per call, never onto the shared index
        params = faiss_index.search_params(snap.faiss, nprobe=48)
        assert params.nprobe == 48
        assert params.referenced_objects[0].efSearch == faiss_index.QUANTIZER_EF_SEARCH == 128
        deep = faiss_index.search_params(snap.faiss, nprobe=200)  # more lists than the default depth: depth nprobe
        assert deep.nprobe == 200 and deep.referenced_objects[0].efSearch == 200
    finally:
        snap.close()


def test_hnsw_index_keeps_its_spec_as_it_grows(tmp_path, data):
    path = tmp_path / "grow"
    write_index(path, data[:3000], faiss_spec=SPEC)
    config, weights = token_encoder()
    with IndexWriter(path, config, weights, faiss_spec=SPEC) as w:
        ids = w.allocate_ids(200)
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], data[3000:3200])
        m = w.commit()
    assert m.faiss.spec == SPEC
    snap = IndexSnapshot.open(path)
    try:
        assert snap.faiss.ntotal == 3200 * 10 and faiss_index.hnsw_quantizer(snap.faiss).ntotal == 64
        hit = Searcher(snap).search(data[3100], k=1)
        assert int(hit.ids[0]) == int(ids[100])  # an added image is found through the old quantizer
    finally:
        snap.close()
    with IndexWriter(path, config, weights, faiss_spec=SPEC) as w:
        w.delete([int(ids[100])])  # removed from the inverted lists; the graph of centroids stays
        m = w.commit()
    snap = IndexSnapshot.open(path)
    try:
        assert m.faiss.spec == SPEC and snap.faiss.ntotal == 3199 * 10
        assert int(ids[100]) not in Searcher(snap).search(data[3100], k=5).ids
    finally:
        snap.close()


def test_wide_fast_scan_codec_trains_behind_an_hnsw_quantizer(tmp_path, data):
    """The default for wide tokens at that size is ``IVF{nlist}(HNSW32_SQfp16),PQ{D/2}x4fs``: it trains, holds
    every image and keeps recall@10 >= 0.9 of the exact ranking."""
    path = tmp_path / "wide"
    write_index(path, data[:3000], faiss_spec="IVF64(HNSW32_SQfp16),PQ16x4fs")
    snap = IndexSnapshot.open(path)
    try:
        assert snap.faiss.ntotal == 3000 * 10 and faiss_index.hnsw_quantizer(snap.faiss).ntotal == 64
        assert recall(Searcher(snap), data[3000:3020]) >= 0.9
    finally:
        snap.close()
