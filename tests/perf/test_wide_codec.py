"""Wide tokens (D >= 1024, EfficientNet-Lite0's 1280) get a 4-bit fast-scan PQ codec in new IVF indexes
(``faiss_index.default_codec``); an index keeps the codec it was written with as it grows or changes.

Clustered synthetic 1024-d tokens through the real ``IndexWriter``; the candidates' recall against the exact
ranking is checked, never their speed (``python -m bench.faiss_specs``, BENCHMARKS.md section 3).
"""

import numpy as np
import pytest

from regis.errors import ConfigError
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.retrieve.searcher import Searcher

D = 1024
T = 10
N = 2_100  # just over FLAT_MAX_IMAGES: IVF512 (21,000 vectors train 512 lists)


def clustered(n: int, seed: int, n_clusters: int = 48, noise: float = 0.5) -> np.ndarray:
    """(n, T, D) unit tokens: each image picks a cluster per token position, plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((T, n_clusters, D)).astype(np.float32)
    pick = rng.integers(0, n_clusters, size=(n, T))
    x = centres[np.arange(T)[None, :], pick] + noise * rng.standard_normal((n, T, D)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def writer(path, **kwargs) -> IndexWriter:
    from regis.models.encoder import EncoderConfig, WeightsInfo

    config = EncoderConfig(backbone="test-wide-tokens", kind="cnn", num_registers=T // 2 - 1, dim=D,
                           cue_method="grid", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return IndexWriter(path, config, WeightsInfo(source="test", sha256="0" * 64), **kwargs)


def add(path, tokens: np.ndarray, delete: list[int] = ()) -> None:
    with writer(path) as w:
        ids = w.allocate_ids(len(tokens))
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
        if delete:
            w.delete(delete)
        w.commit()


@pytest.fixture(scope="module")
def tokens():
    return clustered(N + 30, seed=0)


def test_codec_choice_by_width():
    assert faiss_index.default_codec(384) == "SQ8" and faiss_index.default_codec(None) == "SQ8"
    assert faiss_index.default_codec(256) == "SQ8"  # narrow: 4-bit codes lost recall on dense 256-d tokens
    assert faiss_index.default_codec(1280) == "PQ640x4fs"
    with pytest.raises(ConfigError, match="odd"):
        faiss_index.default_codec(1025)
    assert faiss_index.auto_spec(100_000, T, 1280) == "IVF4096,PQ640x4fs"
    assert faiss_index.auto_spec(100_000, T, 384) == "IVF4096,SQ8"
    assert faiss_index.auto_spec(100_000, T, 1280, codec="SQ8") == "IVF4096,SQ8"
    assert faiss_index.auto_spec(1_000, T, 1280) == "Flat"
    assert faiss_index.spec_codec("IVF4096,PQ640x4fs") == "PQ640x4fs"
    assert faiss_index.spec_codec("Flat") is None and faiss_index.spec_codec("HNSW32") is None
    assert faiss_index.default_depth("IVF4096,PQ640x4fs") == 192
    assert faiss_index.default_depth("IVF4096,SQ8") == 64


def test_wide_index_ranks_like_exact_search_and_keeps_its_codec(tmp_path, tokens):
    path = tmp_path / "wide"
    add(path, tokens[:N])
    snap = IndexSnapshot.open(path)
    assert snap.manifest.faiss.spec == "IVF512,PQ512x4fs" and snap.manifest.faiss.auto
    assert snap.manifest.faiss.depth == 192
    searcher = Searcher(snap)
    queries = tokens[N:]
    hits = 0
    for q in queries:
        ann, exact = searcher.search(q, k=10), searcher.search(q, k=10, mode="exact")
        hits += len(np.intersect1d(ann.ids, exact.ids))
        # candidates come from the PQ codes, scores from the stored tokens: exact MaxSim
        np.testing.assert_allclose(ann.scores, searcher.rerank(q, ann.ids), rtol=1e-5)
    snap.close()
    assert hits / (10 * len(queries)) >= 0.99
    # an update (adds and deletes go through remove_ids / add on the fast-scan index) keeps spec and depth
    add(path, tokens[N:N + 5], delete=[0, 1])
    snap = IndexSnapshot.open(path)
    assert snap.manifest.faiss.spec == "IVF512,PQ512x4fs" and snap.manifest.faiss.depth == 192
    assert snap.manifest.num_images == N + 5 - 2 and snap.faiss.ntotal == (N + 3) * T
    found = Searcher(snap).search(tokens[N + 2], k=1)
    assert int(found.ids[0]) == N + 2  # a new image finds itself
    snap.close()


def test_an_sq8_index_of_wide_tokens_stays_sq8_as_it_grows(tmp_path, tokens, monkeypatch):
    """An index written before wide tokens got fast-scan PQ (auto spec, SQ8) keeps SQ8 on its next writes,
    even when its size picks another nlist, instead of rebuilding its FAISS index with another codec."""
    path = tmp_path / "old"
    monkeypatch.setattr(faiss_index, "default_codec", lambda dim, framings=1: "SQ8")  # the codec choice before
    add(path, tokens[:N])
    monkeypatch.undo()
    assert IndexSnapshot.open(path).manifest.faiss.spec == "IVF512,SQ8"
    add(path, tokens[N:N + 30])
    m = IndexSnapshot.open(path).manifest
    assert m.faiss.spec == "IVF512,SQ8" and m.faiss.depth == 64
