"""The fast search paths regis uses by default return the exact ranking within the recall they claim.

Fast and CPU-only: clustered synthetic tokens (D = 32), small indexes built with the real ``IndexWriter``.
Speed is measured by ``bench/`` scripts (BENCHMARKS.md), never here.
"""

import numpy as np
import pytest
import torch

from regis.errors import ConfigError
from regis.indexes import codes as token_codes
from regis.indexes import faiss_index
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.table import ImageRecord
from regis.indexes.writer import IndexWriter
from regis.retrieve.searcher import Searcher
from regis.scores.maxsim import CPU_CHUNK_VALUES, gemm_chunk_docs, maxsim_gemm, maxsim_scores

D = 32
T = 10


def clustered_tokens(n: int, seed: int = 0, n_clusters: int = 64, noise: float = 0.35) -> np.ndarray:
    """(n, T, D) unit tokens: each image picks a cluster per token position, plus noise (image-like structure:
    images share parts, not i.i.d. noise)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((T, n_clusters, D)).astype(np.float32)
    pick = rng.integers(0, n_clusters, size=(n, T))
    x = centres[np.arange(T)[None, :], pick] + noise * rng.standard_normal((n, T, D)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def token_encoder():
    """The (EncoderConfig, WeightsInfo) of these indexes of D-d test tokens, T per image."""
    from regis.models.encoder import EncoderConfig, WeightsInfo

    config = EncoderConfig(backbone="test-tokens", kind="cnn", num_registers=T // 2 - 1, dim=D, cue_method="kmeans",
                           mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return config, WeightsInfo(source="test", sha256="0" * 64)


def write_index(path, tokens, **kwargs):
    config, weights = token_encoder()
    with IndexWriter(path, config, weights, **kwargs) as w:
        ids = w.allocate_ids(len(tokens))
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
        return w.commit()


def recall(searcher: Searcher, queries: np.ndarray, k: int = 10, **kwargs) -> float:
    hits = 0
    for q in queries:
        ann = searcher.search(q, k=k, **kwargs)
        exact = searcher.search(q, k=k, mode="exact")
        hits += len(np.intersect1d(ann.ids, exact.ids))
    return hits / (k * len(queries))


@pytest.fixture(scope="module")
def data():
    return clustered_tokens(3040, seed=0)


@pytest.fixture(scope="module")
def corpus(data):
    return data[:3000]


@pytest.fixture(scope="module")
def queries(data):
    return data[3000:]  # 40 held-out images from the same distribution


@pytest.fixture(scope="module")
def ivf_pq_index(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("ivfpq") / "index"
    write_index(path, corpus, faiss_spec="IVF32,SQ8", token_store="pq")
    return path


def test_maxsim_gemm_equals_maxsim_scores():
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal((7, D)).astype(np.float32))
    docs = torch.from_numpy(rng.standard_normal((50, T, D)).astype(np.float16))
    np.testing.assert_allclose(maxsim_gemm(q, docs, chunk_size=16).numpy(), maxsim_scores(q, docs).numpy(),
                               rtol=1e-5, atol=1e-5)
    assert maxsim_gemm(q, docs[:0]).shape == (0,)
    with pytest.raises(ValueError):
        maxsim_gemm(q, docs[:, :, :5])


def test_maxsim_gemm_default_chunk_is_cache_sized_on_cpu():
    # 10 x 1280 float16 tokens per image (the Lite0 index): 81 images per GEMM, not the whole candidate set
    assert gemm_chunk_docs(torch.zeros((1000, 10, 1280), dtype=torch.float16)) == CPU_CHUNK_VALUES // 12800 == 81
    assert gemm_chunk_docs(torch.zeros((3, 1, CPU_CHUNK_VALUES * 2))) == 1
    rng = np.random.default_rng(1)
    q = torch.from_numpy(rng.standard_normal((5, 2048)).astype(np.float32))
    docs = torch.from_numpy(rng.standard_normal((300, T, 2048)).astype(np.float16))  # 51 images per chunk: 6 chunks
    np.testing.assert_allclose(maxsim_gemm(q, docs).numpy(), maxsim_gemm(q, docs, chunk_size=8192).numpy(),
                               rtol=1e-5, atol=1e-4)


def test_manifest_records_tuned_defaults_and_search_uses_them(tmp_path, corpus):
    m = write_index(tmp_path / "ivf", corpus, faiss_spec="IVF32,SQ8")
    assert m.faiss.nprobe == faiss_index.default_nprobe("IVF32,SQ8")
    assert m.faiss.depth == faiss_index.default_depth("IVF32,SQ8")
    assert m.token_store.spec == token_codes.default_store(D) and m.token_store.code_size == D // 2  # SQ4
    m2 = write_index(tmp_path / "explicit", corpus[:500], depth=7, nprobe=3)
    assert (m2.faiss.depth, m2.faiss.nprobe) == (7, 3)
    snap = IndexSnapshot.open(tmp_path / "explicit")
    assert Searcher(snap).search(corpus[0], k=5).depth == 7
    snap.close()


def test_auto_spec_is_the_benchmarked_one():
    assert faiss_index.auto_spec(faiss_index.FLAT_MAX_IMAGES, T) == "Flat"
    assert faiss_index.auto_spec(15_500, T) == "IVF2048,SQ8"
    for n, t in ((2_001, 10), (2_001, 1), (5_000, 1), (300_000, 1), (10**7, 10)):
        spec = faiss_index.auto_spec(n, t)  # never more lists than the vectors can train
        assert spec == "Flat" or 39 * faiss_index.ivf_nlist(spec) <= n * t
    assert faiss_index.default_nprobe("IVF256,SQ8") == 32 and faiss_index.default_nprobe("IVF16,Flat") == 16
    spec = faiss_index.auto_spec(100_000, T)
    assert faiss_index.ivf_nlist(spec) is not None
    assert 1 <= faiss_index.default_nprobe(spec) <= faiss_index.ivf_nlist(spec)
    assert faiss_index.ivf_nlist("IVF4096,SQ8") == 4096 and faiss_index.ivf_nlist("Flat") is None
    # the values BENCHMARKS.md measured at 100k images: IVF4096,SQ8, nprobe 32, depth 64
    assert spec == "IVF4096,SQ8"
    assert (faiss_index.default_nprobe(spec), faiss_index.default_depth(spec)) == (32, 64)
    # and beyond (BENCHMARKS.md section 9): 4 sqrt(n) up to 4096 lists, then, from the size at which lists of
    # ~256 vectors take 8,192 lists (1.48M vectors), those lists found through an HNSW graph over float16
    # centroids, with the same nprobe and depth
    assert faiss_index.auto_spec(140_000, T) == "IVF4096,SQ8"  # 1.4M vectors: lists of ~340
    assert faiss_index.auto_spec(150_000, T) == "IVF8192(HNSW32_SQfp16),SQ8"  # 1.5M: 4 sqrt(n) still says 4096
    assert faiss_index.auto_spec(100_000, 20) == "IVF8192(HNSW32_SQfp16),SQ8"  # two framings, 2M vectors
    assert faiss_index.auto_spec(200_000, T) == "IVF8192(HNSW32_SQfp16),SQ8"
    assert faiss_index.auto_spec(300_000, T) == "IVF16384(HNSW32_SQfp16),SQ8"
    spec = faiss_index.auto_spec(1_000_000, T, 256)
    assert spec == "IVF32768(HNSW32_SQfp16),SQ8" and faiss_index.ivf_nlist(spec) == 32768
    assert faiss_index.spec_codec(spec) == "SQ8"
    assert (faiss_index.default_nprobe(spec), faiss_index.default_depth(spec)) == (32, 64)
    assert faiss_index.auto_spec(10**7, T) == "IVF65536(HNSW32_SQfp16),SQ8"  # capped at MAX_NLIST


@pytest.mark.parametrize(("n_images", "spec"), [(2_000, "Flat"), (3_000, "IVF512,SQ8")])
def test_default_ann_search_keeps_the_exact_ranking(tmp_path, corpus, queries, n_images, spec):
    """regis's automatic choice (Flat up to 2,000 images, IVF above) with the manifest's default nprobe and
    depth: recall@10 >= 0.99 of the exact ranking."""
    write_index(tmp_path / "auto", corpus[:n_images])
    snap = IndexSnapshot.open(tmp_path / "auto")
    assert snap.manifest.faiss.spec == spec and snap.manifest.faiss.auto
    assert recall(Searcher(snap), queries) >= 0.99
    snap.close()


@pytest.mark.heavy  # with the next test, the only users of the IVF-PQ index fixture (~21 s of CPU, 90 s at load 17)
def test_ivf_defaults_keep_the_exact_ranking(ivf_pq_index, queries):
    """IVF candidates with the default nprobe/depth: recall@10 >= 0.99 on float16; the compressed store ("pq",
    2 bits per dimension) with the default refine stays within 0.02 of it (0.002 on the real 384-d tokens,
    BENCHMARKS.md), and the returned scores are the exact float16 MaxSim scores (the refine step)."""
    snap = IndexSnapshot.open(ivf_pq_index)
    searcher = Searcher(snap)
    assert snap.codes is not None and snap.manifest.token_store.code_size == 8
    assert snap.manifest.token_store.spec == "RR32,PQ8"
    exact_scorer = Searcher(snap, use_codes=False)
    float16 = recall(exact_scorer, queries)
    assert float16 >= 0.99
    assert recall(searcher, queries) >= float16 - 0.02
    for q in queries[:5]:
        r = searcher.search(q, k=10)
        np.testing.assert_allclose(r.scores, exact_scorer.rerank(q, r.ids), rtol=1e-6)
    # codes alone (no float16 read): approximate scores, still a close ranking
    assert recall(Searcher(snap, refine=0), queries) >= 0.5  # PQ8 keeps 2 bits per dimension
    snap.close()


@pytest.mark.heavy  # the IVF-PQ index fixture (see above)
def test_search_batch_equals_search(ivf_pq_index, queries):
    snap = IndexSnapshot.open(ivf_pq_index)
    searcher = Searcher(snap)
    batch = searcher.search_batch(queries[:8], k=10)
    for q, b in zip(queries[:8], batch, strict=True):
        one = searcher.search(q, k=10)
        np.testing.assert_array_equal(one.ids, b.ids)
        np.testing.assert_allclose(one.scores, b.scores, rtol=1e-6)
    with pytest.raises(ConfigError):
        searcher.search_batch(queries[0], k=10)
    snap.close()


@pytest.mark.heavy  # 14 s of CPU, 50 s at load 17
def test_incremental_commit_reuses_the_codec(tmp_path, corpus):
    path = tmp_path / "inc"
    write_index(path, corpus[:2000], faiss_spec="IVF32,SQ8", token_store="PQ8")
    snap = IndexSnapshot.open(path)
    codec_before = token_codes.read_codec(snap.index_dir / "versions" / snap.name / token_codes.CODEC_FILE)
    codes_before = np.array(snap.codes.codes)
    snap.close()
    from regis.models.encoder import EncoderConfig, WeightsInfo

    config = EncoderConfig(backbone="test-tokens", kind="cnn", num_registers=T // 2 - 1, dim=D, cue_method="kmeans",
                           mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    with IndexWriter(path, config, WeightsInfo(source="test", sha256="0" * 64)) as w:
        ids = w.allocate_ids(100)
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], corpus[2000:2100])
        w.delete([3, 5])
        m = w.commit()
    assert m.token_store.spec == "PQ8" and m.num_images == 2098
    snap = IndexSnapshot.open(path)
    codes = np.asarray(snap.codes.codes)
    keep = np.setdiff1d(np.arange(2000), [3, 5])
    np.testing.assert_array_equal(codes[keep], codes_before[keep])  # old rows untouched
    assert not codes[[3, 5]].any()  # deleted rows zeroed
    new_rows = token_codes.encode(codec_before, snap.store.get(np.arange(2000, 2100)))
    np.testing.assert_array_equal(codes[2000:2100], new_rows)
    snap.close()


def test_pq_alias_is_rotation_plus_pq():
    assert token_codes.resolve_spec("pq", 384) == "RR384,PQ96"
    assert token_codes.check_spec("pq", D) == "RR32,PQ8"
    assert token_codes.resolve_spec("SQ8", 384) == "SQ8"
    with pytest.raises(ConfigError):
        token_codes.resolve_spec("pq", 30)


def test_bad_token_store_specs_are_refused(tmp_path, corpus):
    for spec in ("nonsense", "HNSW32", "float17"):
        with pytest.raises(ConfigError):
            write_index(tmp_path / f"bad-{spec}", corpus[:100], token_store=spec)
    with pytest.raises(ConfigError):  # too few vectors to train 256 centroids per sub-quantiser
        write_index(tmp_path / "small", corpus[:10], token_store="PQ8")
