"""The FAISS token index: every token vector of every live image, id = image_id * T + token_position.

Metric: inner product (tokens are unit-norm, so it is cosine similarity). Small collections get an exact
``Flat`` index; larger ones an IVF index whose spec is chosen from the size (``auto_spec``) unless the user
gives one. Search parameters (``nprobe``, ``ef_search``) are passed per call through FAISS
``SearchParameters`` objects and are never set on the shared index.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from regis.errors import ConfigError

FLAT_MAX_IMAGES = 2_000  # up to this many images the exact Flat token index is used (BENCHMARKS.md)


def _faiss():
    import faiss

    return faiss


FAST_SCAN_PQ = re.compile(r"PQ(\d+)x4fs(r?)")  # FAISS's 4-bit fast-scan PQ codec; "r": codes of the residuals


def fast_scan_pq(codec: str | None) -> tuple[int, bool] | None:
    """(M, by_residual) of a 4-bit fast-scan PQ codec spec ("PQ64x4fsr" -> (64, True)), None for any other codec.

    ``x4fsr`` codes each vector's residual to its IVF centroid, ``x4fs`` the vector itself (FAISS's
    ``index_factory``: ``IndexIVFPQFastScan.by_residual``). Same bytes per vector and, for inner products, the
    same scan (one lookup table per query plus the centroid's inner product), but the residual's smaller spread is
    coded far more exactly. On the shipped encoder's real 256-d tokens (``IVF512``, nprobe 32, depth 192; ``python
    -m bench.residual_codes``, docs/results/million/residual-codes-2026-11-29u.json), ``PQ64x4fs`` put the top 10
    neighbours' similarities 0.108 too low on average (``PQ64x4fsr``: 0.002; SQ8: 0.000), so a FAISS range search,
    which the bounded candidates rely on, found 0.26 of the tokens above its radius (residuals: 0.78; SQ8: 0.86),
    and FAISS's best 4 x 192 re-ranked exactly held 0.951 of the exact best 192 (residuals: 0.969; SQ8: 0.976).
    At 1M images of two framings (BENCHMARKS.md section 9, run U): recall@10 0.981 against 0.997.
    """
    match = FAST_SCAN_PQ.fullmatch(codec or "")
    return (int(match.group(1)), bool(match.group(2))) if match else None


WIDE_DIM = 1024  # token widths from which new IVF indexes code their vectors with 4-bit fast-scan PQ
SQ8_CODEC = "SQ8"


RESIDUAL_DIMS = range(256, WIDE_DIM)  # token widths whose two-framing indexes get residual fast-scan codes


def default_codec(dim: int | None, framings: int = 1) -> str:
    """The IVF vector codec regis picks for new indexes of ``dim``-d tokens, ``framings`` framings per image.

    Two framings of 256- to 1023-d tokens (the shipped encoder's): ``PQ{dim/4}x4fsr``, 4-bit fast-scan codes of each
    token's residual to its IVF centroid, 1 bit per dimension (``fast_scan_pq``; k_factor 2, depth 192:
    ``default_k_factor``, ``default_depth``). BENCHMARKS.md section 9, run U, the shipped encoder's tokens, two
    framings, against ``SQ8``: 1M images 3,686 against 8,002 B resident per image, recall@10 0.9973 against 0.9980,
    p50 24-27 against 29.8 ms (run T); 100k 4,187 against 8,443 B, 0.9993 against 1.0000, 13.4-13.8 against 15.2 ms;
    10k 7.6 against 12.5 KB, 0.9997 both, 8.9 against 7.0 ms. One framing keeps ``SQ8``: there k_factor 2 lost recall
    (1M: 0.994 against 0.9987 at 10 against 18 ms, 1.9 against 4.0 KB; k_factor 4: 0.9987 at 13-23 ms).

    Otherwise ``SQ8`` (1 byte per dimension) below ``WIDE_DIM``. From ``WIDE_DIM`` up (EfficientNet-Lite0's 1280-d
    tokens), ``PQ{dim/2}x4fs``: product quantisation of 2 dimensions per 4-bit code, scanned with FAISS's SIMD fast-scan
    kernels (dim / 4 bytes per vector), searched at depth 192 (``default_depth``). On 100,000 Fashion-MNIST images
    through Lite0 (``IVF4096``, 32 probes, 500 held-out queries in 4-query batches, one thread; ``python -m
    bench.faiss_specs``, BENCHMARKS.md section 3): recall@10 of the exact MaxSim ranking 0.997 against 0.997 for
    SQ8 at depth 64, 3.7 against 13.1 KB of FAISS index per image, search CPU 7.9 against 19.3 ms per query, FAISS
    build 1.8x as long. Only the candidates come from these codes: the rerank scores the stored tokens.

    Codes of the tokens themselves were worse at 256-d (issue 24, BENCHMARKS.md section 9): on 100,000 images
    generated densely around 1,800 real ones (``bench.corpus1m``), ``IVF4096,PQ128x4fs`` without re-ranking kept
    recall@10 0.78 / 0.86 / 0.91 at depth 64 / 128 / 192 against 0.9995 for ``IVF4096,SQ8`` at depth 64
    (``python -m bench.search``); ``PQ64x4fs`` at 1M, two framings, k_factor 4: 0.981 (run U).

    Raises:
        ConfigError: a wide ``dim`` that is odd (no 2-dimension sub-vectors).
    """
    if dim is None:
        return SQ8_CODEC
    if framings >= 2 and dim in RESIDUAL_DIMS and dim % 4 == 0:
        return f"PQ{dim // 4}x4fsr"
    if dim < WIDE_DIM:
        return SQ8_CODEC
    if dim % 2:
        raise ConfigError(f"token width {dim} is odd: no fast-scan PQ codec of 2-dimension sub-vectors")
    return f"PQ{dim // 2}x4fs"


def spec_codec(spec: str) -> str | None:
    """The vector codec of an IVF factory spec ("IVF4096,SQ8" -> "SQ8"), None for a spec that is not "IVF<n>,X"."""
    head, _, codec = spec.partition(",")
    return codec if ivf_nlist(head) is not None and codec else None


LIST_VECTORS = 256  # token vectors per IVF list of the large collections whose lists an HNSW graph finds
HNSW_QUANTIZER_FROM = 8192  # lists (by either rule below) from which the lists are sized and found that way
HNSW_QUANTIZER = "HNSW32_SQfp16"  # that graph: 32 links per centroid, centroids stored as float16
MAX_NLIST = 65536  # at most this many lists (two-level training on 39 x 65,536 vectors: 2.6 GB of float32)


def auto_spec(num_images: int, tokens_per_image: int, dim: int | None = None, codec: str | None = None,
              framings: int = 1) -> str:
    """The FAISS factory spec regis picks for a collection of ``num_images`` images of ``dim``-d tokens.

    Up to ``FLAT_MAX_IMAGES`` images: ``Flat`` (exact). Above: ``IVF{nlist},{codec}`` with nlist the power of two
    nearest 4 * sqrt(n) for n token vectors, at least 256; the codec is ``codec`` (an index that grows keeps the
    codec it was written with) or else ``default_codec(dim, framings)``. Where lists of ~``LIST_VECTORS`` vectors (the
    power of two nearest n / 256, at most ``MAX_NLIST``) take ``HNSW_QUANTIZER_FROM`` lists or more (n from ~1.48M: 148k
    images of 10 tokens, 75k of 20), those lists instead, found through an HNSW graph over float16 centroids:
    ``IVF{nlist}(HNSW32_SQfp16),{codec}`` (trained by ``train``: two-level clustering). (Until 2026-11-29 the
    switch came where the 4 sqrt(n) rule itself reached 8,192 lists, n ~2.1M: between the two, its 4,096 lists
    held up to ~510 vectors each.)

    Why (BENCHMARKS.md section 9): 4 sqrt(n) is FAISS's rule for up to ~1M vectors; with it the codes each probe
    scans grow as sqrt(n) (244 -> 610 vectors per list from 100k to 1M images of 10 tokens), and the flat
    quantizer's nlist inner products per query token with them: together most of a 1M query's time. Lists of a
    fixed length keep the scan constant, and the graph finds them in ~log(nlist) (FAISS's own advice from 1M
    vectors up, its wiki's "Guidelines to choose an index"). Measured on 256-d tokens, 10 per image, nprobe 32,
    one thread (runs N, K): 300k images ``IVF16384(HNSW32_SQfp16)`` 5.0 ms p50 at recall@10 0.997 against
    ``IVF8192``'s 9.4 ms at 0.995; 1M ``IVF32768(...)`` 8.0-9.7 ms at 0.992 against ``IVF16384``'s 18.0-21.9 ms
    at 0.994, memory +8-22 B per image (4,063-4,074 B); build 3-10x faster (two-level training). Between 1.48M and
    2.1M vectors (run S, the shipped encoder's tokens, Zen 3): 100k images of two framings (2M vectors)
    ``IVF8192(HNSW32_SQfp16)`` 24.1 ms p50 against ``IVF4096``'s 37.4 ms, recall@10 1.0 both, build 35 s against 57;
    150k of one framing (1.5M) 11.9-12.0 ms against 18.5-19.0 ms, recall 0.9997 both, 4,336 against 4,378 B per
    image, build 28 s against 54 (``docs/results/million/hnsw-rule-2026-11-29s.txt``).

    The Flat limit was 20,000 images; on a CPU a Flat scan of 155k token vectors costs ~30 ms per query against
    ~2 ms for ``IVF2048,SQ8`` at recall@10 0.995 (BENCHMARKS.md), so IVF starts at 2,000 images (20k vectors:
    enough to train 512 lists). nlist never asks for more than the 39 training vectors per list FAISS wants;
    below 256 lists' worth, Flat stays.

    Raises:
        ConfigError: see ``default_codec``.
    """
    n_vectors = max(1, num_images * tokens_per_image)
    if num_images <= FLAT_MAX_IMAGES or n_vectors < 39 * 256:
        return "Flat"
    nlist = max(2 ** round(math.log2(4 * math.sqrt(n_vectors))), 256)
    fixed = min(2 ** round(math.log2(n_vectors / LIST_VECTORS)), MAX_NLIST)  # lists of ~LIST_VECTORS vectors
    quantizer = ""
    if max(nlist, fixed) >= HNSW_QUANTIZER_FROM:
        nlist = fixed
        quantizer = f"({HNSW_QUANTIZER})"
    while 39 * nlist > n_vectors:
        nlist //= 2
    return f"IVF{nlist}{quantizer},{codec or default_codec(dim, framings)}" if nlist >= 256 else "Flat"


def ivf_nlist(spec: str) -> int | None:
    """The number of IVF lists of a factory spec ("IVF4096,SQ8" -> 4096), None when it is not an IVF spec."""
    head = spec.split(",")[0]
    if not head.startswith("IVF"):
        return None
    digits = ""
    for ch in head[3:]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


DEFAULT_DEPTH = 64  # candidate depth k' regis records in new manifests


def default_nprobe(spec: str) -> int:
    """The IVF lists probed per query token that regis records for ``spec``: 32 (or every list if fewer).

    Tuned with ``bench/search.py`` on real image tokens (BENCHMARKS.md), one CPU thread, depth 64:
    100k images, ``IVF4096,SQ8``: nprobe 16 / 32 / 64 -> recall@10 0.989 / 0.997 / 0.999 at 3.0 / 4.7 / 7.0 ms
    p50; 15.5k images, ``IVF2048,SQ8``: nprobe 16 / 32 / 48 -> 0.984 / 0.995 / 0.998 at 1.5 / 1.9 / 2.4 ms.
    """
    nlist = ivf_nlist(spec)
    if nlist is None:
        return 32  # not used by non-IVF indexes; the manifest's historical default
    return int(min(nlist, 32))


FAST_SCAN_DEPTH = 192  # candidate depth of fast-scan PQ indexes (their similarities are coarser than SQ8's)


COMPACT_K_FACTOR = 4  # k_factor of a new index whose FAISS codes hold at most 1 bit per dimension
RESIDUAL_K_FACTOR = 2  # ... whose codes are of the residuals at exactly 1 bit per dimension (``default_k_factor``)
COMPACT = "compact"  # IndexWriter(faiss_codec="compact"): ``compact_codec``


def compact_codec(dim: int) -> str:
    """The compact layout's IVF vector codec for ``dim``-d tokens: ``PQ{D/8}x4fsr``, 4-bit fast-scan codes of 8
    dimensions each of the residual to the token's IVF centroid (D / 16 bytes per token: 16 at 256-d;
    ``fast_scan_pq``), re-ranked on the token store (``default_k_factor``). BENCHMARKS.md section 9: with the
    ``codes.compact_store`` store, 1,221 B resident per image at 300k images. (Until 2026-11-29 the codes were of
    the vectors themselves, ``PQ{D/8}x4fs``; an index keeps its codec.)

    Raises:
        ConfigError: D not a multiple of 8.
    """
    if dim % 8:
        raise ConfigError(f"the compact layout's FAISS codec needs a width divisible by 8, got D = {dim}")
    return f"PQ{dim // 8}x4fsr"


def default_k_factor(spec: str, dim: int) -> int:
    """FAISS neighbours fetched per query token, as a multiple of the candidate depth, for a new index of ``spec``
    over ``dim``-d tokens (``FaissInfo.k_factor``), by its codec (``fast_scan_pq``):

    - ``RESIDUAL_K_FACTOR`` (2) for 4-bit fast-scan codes of the residuals at 1 bit per dimension (``PQ{D/4}x4fsr``,
      e.g. ``PQ64x4fsr`` at 256-d): the shipped encoder's tokens, two framings (BENCHMARKS.md section 9, run U,
      alternated in one process): at 1M images recall@10 0.9973 at 2 and at 4, p50 24-27 against 31-32 ms; at 100k
      0.9993 against 0.9997, 13.4-13.8 against 17.0-17.4 ms;
    - ``COMPACT_K_FACTOR`` (4) for any other fast-scan PQ of at most 1 bit per dimension (``PQ{M}x4fs[r]`` with
      4 M <= dim: the compact layout, e.g. ``PQ32x4fsr`` at 256-d, whose lists FAISS orders too coarsely: at 300k
      images recall@10 0.787 at k_factor 1, 0.935 at 4 with the SQ4 store; ``PQ64x4fs`` at 1M, k_factor 1: 0.62;
      BENCHMARKS.md section 9 and its history);
    - else 1, FAISS's own similarities (every spec regis chooses by itself: SQ8, or PQ{D/2}x4fs at 2 bits per
      dimension).
    """
    pq = fast_scan_pq(spec_codec(spec))
    if not pq or 4 * pq[0] > dim:
        return 1
    return RESIDUAL_K_FACTOR if pq[1] and 4 * pq[0] == dim else COMPACT_K_FACTOR


def default_depth(spec: str) -> int:
    """The candidate depth k' (neighbours per query token) that regis records for ``spec``: 64 (see
    ``default_nprobe``: depth 32 loses 0.01 of recall@10, 128 gains < 0.001), 192 for a 4-bit fast-scan PQ codec
    (``default_codec``; its coarser similarities order each list less exactly: on 100k 1280-d real tokens recall@10
    0.974 / 0.991 / 0.997 at depth 64 / 128 / 192)."""
    return FAST_SCAN_DEPTH if fast_scan_pq(spec_codec(spec)) else DEFAULT_DEPTH


def new_index(spec: str, dim: int):
    """An empty index for ``spec`` with inner-product metric, accepting explicit ids.

    Index types without native id support (Flat, HNSW) are wrapped in ``IndexIDMap2``.

    Raises:
        ConfigError: FAISS cannot parse ``spec``.
    """
    faiss = _faiss()
    try:
        index = faiss.index_factory(int(dim), spec, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ConfigError(f"FAISS cannot build an index from spec {spec!r}") from exc
    if faiss.try_extract_index_ivf(index) is None:
        index = faiss.IndexIDMap2(index)
    return index


def needs_training(index) -> bool:
    """True when the index must be trained before vectors are added."""
    return not index.is_trained


def hnsw_quantizer(index):
    """The HNSW coarse quantizer of an IVF index ("IVF65536_HNSW32,SQ8"), None for a flat one or a non-IVF index."""
    faiss = _faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return None
    quantizer = faiss.downcast_index(ivf.quantizer)
    return quantizer if isinstance(quantizer, faiss.IndexHNSW) else None


def train(index, vectors: np.ndarray, seed: int = 0) -> None:
    """Train ``index`` on ``vectors`` (n, D) float32 (n >= ``min_training_vectors(index)``).

    A flat-quantizer IVF index trains as FAISS does (spherical k-means over all lists, then its codec). An IVF
    index with an HNSW coarse quantizer gets its centroids from FAISS's two-level clustering
    (``faiss.contrib.clustering.two_level_clustering``: sqrt(nlist) clusters, then each split in proportion to
    its size; spherical, as IVF inner-product training), which costs ~sqrt(nlist) times fewer distance
    computations than one k-means over nlist centroids (FAISS's recipe for 65,536 lists and more, its wiki's
    "Guidelines to choose an index"); the centroids go into the HNSW graph, then the codec trains on the
    residuals (``IndexIVF.train`` skips a quantizer that already holds nlist centroids).
    """
    if hnsw_quantizer(index) is None:
        index.train(vectors)
        return
    from faiss.contrib.clustering import two_level_clustering

    ivf = _faiss().extract_index_ivf(index)
    # a sub-cluster gets centroids in proportion to its points: ~39 each on average (``min_training_vectors``),
    # some a few fewer; FAISS's warning below 39 would fire for those, so its floor is lowered to 16
    centroids, _ = two_level_clustering(vectors, int(round(math.sqrt(ivf.nlist))), ivf.nlist, spherical=True,
                                        seed=seed, min_points_per_centroid=16)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    if not ivf.quantizer.is_trained:  # an HNSW graph over coded centroids ("IVF65536(HNSW32_SQfp16),SQ8")
        ivf.quantizer.train(centroids)
    ivf.quantizer.add(centroids)
    index.train(vectors)


def min_training_vectors(index) -> int:
    """How many vectors training wants: 39 per IVF list (FAISS's own lower bound for k-means), else 0."""
    ivf = _faiss().try_extract_index_ivf(index)
    return 39 * ivf.nlist if ivf is not None else 0


def token_ids(image_ids: np.ndarray, tokens_per_image: int) -> np.ndarray:
    """(n * T,) int64 FAISS ids of the tokens of ``image_ids`` (n,): image_id * T + position."""
    image_ids = np.asarray(image_ids, dtype=np.int64)
    return (image_ids[:, None] * tokens_per_image + np.arange(tokens_per_image)[None, :]).reshape(-1)


def add_tokens(index, image_ids: np.ndarray, tokens: np.ndarray) -> None:
    """Add the tokens of ``image_ids``.

    Args:
        index: a trained index from ``new_index``.
        image_ids: (n,) int64.
        tokens: (n, T, D) float16 or float32.
    """
    n, t, d = tokens.shape
    if n == 0:
        return
    vectors = np.ascontiguousarray(tokens.reshape(n * t, d), dtype=np.float32)
    index.add_with_ids(vectors, token_ids(image_ids, t))


def remove_images(index, image_ids: np.ndarray, tokens_per_image: int) -> int:
    """Remove every token of ``image_ids``; returns the number of vectors removed.

    Raises:
        RuntimeError: the index type cannot remove (e.g. HNSW); callers rebuild instead.
    """
    if len(image_ids) == 0:
        return 0
    faiss = _faiss()
    ids = token_ids(image_ids, tokens_per_image)
    return int(index.remove_ids(faiss.IDSelectorBatch(ids)))


# HNSW search depth of an IVF index's HNSW coarse quantizer (at least nprobe). 128, not 64: at 1M images, nprobe 32,
# 64 missed lists the flat quantizer finds (recall@10 0.9863 -> 0.9900 at the same p50; 256: 0.9900; BENCHMARKS.md
# section 9, run Q, docs/results/million/quantizer-ef-1m-2026-11-29q.txt)
QUANTIZER_EF_SEARCH = 128


def search_params(index, nprobe: int | None = None, ef_search: int | None = None):
    """A per-call ``SearchParameters`` object for ``index`` (None when it has no knobs).

    IVF: ``nprobe`` lists; with an HNSW coarse quantizer also its search depth, max(``QUANTIZER_EF_SEARCH``,
    nprobe), passed per call like nprobe (never set on the shared index)."""
    faiss = _faiss()
    if faiss.try_extract_index_ivf(index) is not None:
        if not nprobe:
            return None
        params = faiss.SearchParametersIVF(nprobe=int(nprobe))
        if hnsw_quantizer(index) is not None:
            quantizer = faiss.SearchParametersHNSW(efSearch=max(QUANTIZER_EF_SEARCH, int(nprobe)))
            params.quantizer_params = quantizer
            params.referenced_objects = [quantizer]  # keeps the SWIG object alive as long as params
        return params
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else index
    if isinstance(inner, faiss.IndexHNSW) and ef_search:
        return faiss.SearchParametersHNSW(efSearch=int(ef_search))
    return None


def search(index, queries: np.ndarray, k: int, nprobe: int | None = None, ef_search: int | None = None,
           threads: int | None = None):
    """k nearest token vectors of each query vector.

    Args:
        index: a token index.
        queries: (q, D) float32.
        k: neighbours per query vector (>= 1).
        nprobe: IVF lists to probe for this call only.
        ef_search: HNSW search depth for this call only.
        threads: FAISS OpenMP threads of the calling thread (OpenMP's ``omp_set_num_threads`` sets the calling
            thread's own count, so concurrent callers do not affect each other); None leaves it as it is.

    Returns:
        scores (q, k) float32 inner products, ids (q, k) int64 token ids; -1 where fewer than k exist.
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if threads is not None:
        _faiss().omp_set_num_threads(int(threads))
    params = search_params(index, nprobe, ef_search)
    if params is None:
        return index.search(queries, int(k))
    return index.search(queries, int(k), params=params)


def write(index, path: Path) -> None:
    """Write the index to ``path`` (callers write into a temporary version directory)."""
    _faiss().write_index(index, str(path))


def read(path: Path):
    """Read an index written by ``write``."""
    return _faiss().read_index(str(path))
