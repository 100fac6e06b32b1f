"""Compressed token store: FAISS quantiser codes of every stored token, used for the rerank.

The float16 segments stay the source of truth (exact mode, FAISS rebuilds); a version built with a compressed
token store also holds

    versions/v000003/codec.faiss   the trained FAISS codec (a standalone-codec index, ``sa_encode``/``sa_decode``)
    versions/v000003/codes.npy     uint8 (next_id, T, code_size): the codes of image id i in row i (zeros if dead)

and the ANN search reranks its candidates with MaxSim over the decoded tokens (``Searcher``), so a query
touches ``T * code_size`` bytes per candidate instead of ``T * D * 2``.

Specs are FAISS ``index_factory`` strings of standalone codecs, e.g. ``PQ96`` (product quantiser, 96 sub-vectors
of 8 bits: 96 bytes per token), ``RR384,PQ96`` (after a random rotation that spreads the variance evenly over
the sub-vectors), ``OPQ96,PQ96`` (a learned rotation), ``IVF256,PQ96`` (PQ of the residual to the nearest of
256 centroids; the code holds the centroid number too), ``SQ8`` / ``SQ4`` (scalar). ``float16`` means no codes
(the segments are read). Source: FAISS wiki, "Vector codecs"
(standalone codec API ``sa_encode`` / ``sa_decode`` / ``sa_code_size``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from regis.errors import ConfigError, IndexFormatError
from regis.indexes.npy import load_npy
from regis.scores.framings import framing_blocks
from regis.scores.maxsim_np import maxsim_terms

FLOAT16 = "float16"
CODEC_FILE = "codec.faiss"
CODES_FILE = "codes.npy"
TRAIN_IMAGES = 25_000  # images sampled to train a codec (x T token vectors)


def _faiss():
    import faiss

    return faiss


def new_codec(spec: str, dim: int):
    """An untrained standalone codec for ``spec`` (an ``index_factory`` string) over ``dim``-d vectors.

    Raises:
        ConfigError: FAISS cannot parse ``spec``, or it is not a standalone codec (e.g. an IVF or HNSW index).
    """
    if spec == FLOAT16:
        raise ConfigError("float16 is the uncompressed store: it has no codec")
    faiss = _faiss()
    try:
        codec = faiss.index_factory(int(dim), spec, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ConfigError(f"FAISS cannot build a token codec from spec {spec!r}") from exc
    if "HNSW" in spec or "IDMap" in spec or "Refine" in spec:
        raise ConfigError(f"token store spec {spec!r} is a search index, not a codec; use e.g. PQ96 or SQ8")
    return codec


PQ_ALIAS = "pq"  # random rotation + PQ with D/4 bytes per token (slow to train: minutes at 100k images)
DEFAULT_STORE = "SQ4"  # the token store of new indexes (``default_store``)
DEFAULT_REFINE = 16  # new compressed stores: candidates re-scored on float16 >= refine x k (``default_store``)
# ... and >= this share of the query's candidates (``default_store``): the rows follow the candidate count
DEFAULT_REFINE_SHARE = 0.4


def default_store(dim: int) -> str:
    """The token store regis gives a new index of ``dim``-d tokens: ``SQ4``, a 4-bit scalar quantiser (D / 2
    bytes per token, trained in seconds on any number of tokens), used to rank the candidates, whose best
    ``max(refine x k, refine_share x candidates)`` are then re-scored exactly on the float16 segments
    (``regis.retrieve.searcher``; ``refine`` = ``DEFAULT_REFINE`` = 16 and ``refine_share`` =
    ``DEFAULT_REFINE_SHARE`` = 0.4, recorded in the manifest). An index keeps the store and refine rule it was
    written with (a float16 index written before stays float16; one written with refine 8 keeps 8). Refine >= 8: on
    clustered real-photo tokens (~120 close images per photo, ``tests/perf/test_compact_store.py``) SQ4's ordering
    put some of the exact top 10 below the 40th candidate (recall@10 0.971), below the 80th none (1.000). The share:
    at a million images a query has ~860 candidates and SQ4's ordering of so many close images put some of the exact
    top 10 below the 80th (recall@10 0.967), below the 320th almost none (0.994). Refine 16: at 1M the first round
    (~176 candidates) re-scored max(80, 0.4 x 176) = 80 rows; 160 raise recall@10 from 0.984 to 0.994 for ~2 ms of
    p50 (18.5 ms), with no loss at 100k (0.9993) and 300k (0.993 -> 0.995), p50 warm unchanged there
    (BENCHMARKS.md section 9). More rows re-scored exactly cannot lower recall: the re-scored set only grows.

    Why (BENCHMARKS.md section 9): at a million images of 256-d tokens the float16 tokens (5 KB per image) cannot
    stay resident within 4 KB per image, and need not: the re-scoring reads its rows from disk (``python -m
    bench.million``: at 10k-100k images, 80 rows per query, p50 was the same with those rows evicted from the page
    cache as warm, and recall@10 >= 0.998). SQ8 codes (D bytes per token) would not fit beside SQ8 FAISS codes at
    256-d; SQ4 against SQ8 or float16 ranking was not compared at scale, only on the test's clustered photos.
    """
    return DEFAULT_STORE


COMPACT = "compact"  # the compact layout's store, sized by the collection (``compact_store``)
COMPACT_STORE_NLIST = 1024  # IVF lists of the compact store's residual PQ once there are tokens to train them


def compact_store(num_vectors: int, dim: int) -> str:
    """The compact layout's token store for ``num_vectors`` live token vectors of ``dim``-d: ``IVF1024,PQ{D/4}``
    (the residual to one of 1,024 centroids, D / 4 bytes per token + 2 for the list: 0.9263 recall@10 at 300k
    images, BENCHMARKS.md section 9) once there are 39 training vectors per list (4k images of 10 tokens), before
    that the plain ``PQ{D/4}`` (0.8547 there), and under the 256 vectors its 8-bit codebooks need (25 images of 10
    tokens) ``SQ4``. The writer re-encodes the store when the spec changes.

    Raises:
        ConfigError: D not a multiple of 4.
    """
    if dim % 4:
        raise ConfigError(f"the compact token store needs a width divisible by 4, got D = {dim}")
    pq = f"PQ{dim // 4}"
    if num_vectors < 256:
        return DEFAULT_STORE
    return f"IVF{COMPACT_STORE_NLIST},{pq}" if num_vectors >= 39 * COMPACT_STORE_NLIST else pq


def resolve_spec(spec: str, dim: int) -> str:
    """``pq`` -> ``RR{D},PQ{D/4}`` (96 bytes per 384-d token: 960 bytes per 10-token image; BENCHMARKS.md:
    recall@10 0.995 vs 0.997 for float16 at 100k images); any other spec is returned as given.

    Raises:
        ConfigError: ``pq`` with D not a multiple of 4.
    """
    if spec != PQ_ALIAS:
        return spec
    if dim % 4:
        raise ConfigError(f"token store 'pq' needs a width divisible by 4, got D = {dim}")
    return f"RR{dim},PQ{dim // 4}"


def check_spec(spec: str, dim: int) -> str:
    """Validate a token store spec (``float16``, ``pq``, ``compact`` or a codec spec); returns it resolved
    (``resolve_spec``; ``compact`` stays ``compact``: its spec follows the collection, ``compact_store``).

    Raises:
        ConfigError: as ``new_codec`` / ``compact_store``.
    """
    if spec == COMPACT:
        compact_store(0, dim)
        return spec
    spec = resolve_spec(spec, dim)
    if spec != FLOAT16:
        new_codec(spec, dim)
    return spec


PQ_NITER = 10  # k-means iterations per PQ sub-quantiser (FAISS's default is 25)
PQ_MAX_POINTS_PER_CENTROID = 64  # k-means sample per sub-quantiser: 64 x 256 = 16,384 vectors (FAISS: 256 x 256)


def _set_pq_training(codec, niter: int, max_points_per_centroid: int) -> None:
    """Cheaper k-means for the product quantiser inside ``codec`` (FAISS's defaults take minutes for PQ96 on
    two CPU cores: 96 sub-quantisers x 25 iterations x 65,536 points), and no polysemous training for a residual
    PQ (``IVF1024,PQ64``: ``index_factory`` turns it on; it re-orders each sub-quantiser's centroids so that
    Hamming distances between codes mean something, which the store never uses: it decodes. At 2,600 images of
    256-d tokens it took 55 of the 56 s of training ``IVF64,PQ64``)."""
    faiss = _faiss()
    inner = faiss.downcast_index(faiss.downcast_index(codec.index) if isinstance(codec, faiss.IndexPreTransform)
                                 else codec)
    pq = getattr(inner, "pq", None)
    if pq is not None:
        pq.cp.niter = int(niter)
        pq.cp.max_points_per_centroid = int(max_points_per_centroid)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False


def train_codec(spec: str, vectors: np.ndarray, niter: int = PQ_NITER,
                max_points_per_centroid: int = PQ_MAX_POINTS_PER_CENTROID):
    """Train a codec on ``vectors`` (n, D) float32 token vectors.

    Args:
        spec: codec spec (see module docstring).
        vectors: (n, D) float32 training vectors.
        niter, max_points_per_centroid: k-means settings of a product quantiser's sub-quantisers.

    Raises:
        ConfigError: too few vectors for the codec (a PQ with 8-bit codes needs >= 256 vectors, and wants
            >= 256 x 39).
    """
    codec = new_codec(spec, vectors.shape[1])
    _set_pq_training(codec, niter, max_points_per_centroid)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if not codec.is_trained:
        try:
            codec.train(vectors)
        except RuntimeError as exc:
            raise ConfigError(f"cannot train token codec {spec!r} on {len(vectors)} vectors: {exc}") from exc
    return codec


def code_size(codec) -> int:
    """Bytes per token vector."""
    return int(codec.sa_code_size())


def encode(codec, tokens: np.ndarray) -> np.ndarray:
    """(n, T, D) float tokens -> (n, T, code_size) uint8 codes."""
    n, t, d = tokens.shape
    if n == 0:
        return np.zeros((0, t, code_size(codec)), np.uint8)
    flat = np.ascontiguousarray(tokens.reshape(n * t, d), dtype=np.float32)
    return codec.sa_encode(flat).reshape(n, t, -1)


def decode(codec, codes: np.ndarray) -> np.ndarray:
    """(n, T, code_size) uint8 codes -> (n, T, D) float32 reconstructed tokens (not re-normalised)."""
    n, t, c = codes.shape
    if n == 0:
        return np.zeros((0, t, codec.d), np.float32)
    return codec.sa_decode(np.ascontiguousarray(codes.reshape(n * t, c))).reshape(n, t, -1)


def write_codec(codec, path: Path) -> None:
    """Write a trained codec."""
    _faiss().write_index(codec, str(path))


def read_codec(path: Path):
    """Read a codec written by ``write_codec``.

    Raises:
        IndexFormatError: missing or unreadable.
    """
    if not Path(path).is_file():
        raise IndexFormatError(f"token codec {path} is missing")
    try:
        return _faiss().read_index(str(path))
    except RuntimeError as exc:
        raise IndexFormatError(f"token codec {path} cannot be read by FAISS") from exc


# image tokens of one framing scored per step by ``sq4_maxsim``: its float32 nibble copies (2 MiB each at 256-d) stay
# in a core's cache. 4,096 images per step (21 MiB) took ~1.7x as long for 3,400 candidates of 20 tokens (25.1 against
# 15.1 ms on a Zen 4 core; 256-512 images of 10 tokens were the fastest, one framing and two:
# ``python -m bench.rerank_sq4``, docs/results/million/rerank-sq4-2026-11-29t.txt, BENCHMARKS.md section 9, run T)
SQ4_CHUNK_TOKENS = 4096
TOKEN_SIMS_CHUNK = 32_768  # neighbour tokens decoded per step by ``CodeStore.token_sims`` (32 MiB float32 at 256-d)


def sq4_params(codec) -> tuple[np.ndarray, np.ndarray] | None:
    """(vmin (D,), vdiff (D,)) float32 of a plain 4-bit scalar quantiser (FAISS ``SQ4``: ``QT_4bit``, one range
    per dimension), None for any other codec. Its decoding is ``x_d = vmin_d + (c_d + 0.5) / 15 * vdiff_d``, with
    dimension 2j in the low nibble of byte j and 2j + 1 in the high one (FAISS ``Codec4bit``)."""
    faiss = _faiss()
    index = faiss.downcast_index(codec)
    if not isinstance(index, faiss.IndexScalarQuantizer) or index.sq.qtype != faiss.ScalarQuantizer.QT_4bit:
        return None
    trained = faiss.vector_to_array(index.sq.trained).astype(np.float32)
    d = index.d
    if len(trained) != 2 * d or d % 2:
        return None
    return trained[:d], trained[d:]


def sq4_terms(query: np.ndarray, vmin: np.ndarray, vdiff: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The query side of ``q . x = q . (vmin + vdiff / 30) + sum_d (q_d vdiff_d / 15) c_d`` (``sq4_maxsim``):
    the weights of the low nibbles (m, D / 2) and of the high ones (m, D / 2), and the constant (m,), float32."""
    scaled = query * (vdiff / 15.0)
    base = (query @ (vmin + vdiff / 30.0)).astype(np.float32)
    return np.ascontiguousarray(scaled[:, 0::2]), np.ascontiguousarray(scaled[:, 1::2]), base


def _gemm_nt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (m, K) @ b (n, K).T in numpy (float32)."""
    return a @ b.T


def sq4_maxsim(query: np.ndarray, codes: np.ndarray, vmin: np.ndarray, vdiff: np.ndarray,
               chunk_images: int | None = None, gemm=_gemm_nt, framings: int = 1) -> np.ndarray:
    """MaxSim of ``query`` against SQ4-coded images without decoding them to float32 tokens first.

    ``q . x = q . (vmin + vdiff / 30) + sum_d (q_d vdiff_d / 15) c_d``: two GEMMs over the low and the high nibbles
    (the codes as small integers) replace FAISS's per-component ``sa_decode`` and the GEMM over its output; equal
    to MaxSim of the decoded tokens to float32 summation order (tests/test_refine_rule.py).

    Args:
        query: (m, D) float32 tokens.
        codes: (n, T, D / 2) uint8 SQ4 codes.
        vmin, vdiff: (D,) float32, from ``sq4_params``.
        chunk_images: images per step (None: as many as hold ``SQ4_CHUNK_TOKENS`` tokens of one framing).
        gemm: ``gemm(a (m, K), b (n, K)) -> a @ b.T`` float32 (numpy's by default; the searcher passes torch's,
            which keeps to the threads it was given where numpy's BLAS may spread a small product over busy cores).
        framings: > 1: each image's score is its better framing's MaxSim, from each framing's own block only
            (``regis.scores.framings.framing_blocks``; as ``regis.scores.maxsim.maxsim_gemm``'s).

    Returns:
        (n,) float32 scores.

    Raises:
        ValueError: token counts that do not split into ``framings``, or chunk_images < 1.
    """
    n, t, half = codes.shape
    query = np.asarray(query, dtype=np.float32)
    blocks = framing_blocks(len(query), t, framings)
    if chunk_images is None:
        chunk_images = max(1, SQ4_CHUNK_TOKENS // max(1, t // framings))
    if chunk_images < 1:
        raise ValueError(f"chunk_images must be >= 1, got {chunk_images}")
    even, odd, base = sq4_terms(query, vmin, vdiff)
    base = base[:, None]  # (m, 1)
    out = np.empty(n, dtype=np.float32)
    for start in range(0, n, chunk_images):
        chunk = codes[start : start + chunk_images]
        best = None
        for rows, cols in blocks:  # framings scored apart: only each framing's own block is multiplied
            flat = np.ascontiguousarray(chunk[:, cols]).reshape(-1, half)
            sims = gemm(even[rows], (flat & 15).astype(np.float32))
            sims += gemm(odd[rows], (flat >> 4).astype(np.float32))
            sims += base[rows]
            score = maxsim_terms(sims.reshape(rows.stop - rows.start, len(chunk), -1))
            best = score if best is None else np.maximum(best, score)
        out[start : start + chunk_images] = best
    return out


def take_sorted(array: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``array[ids]`` for a memory-mapped ``array`` (rows on axis 0), read in ascending row order (sequential reads
    from the map) and returned in the order of ``ids`` (n,) int64 (valid rows; the caller checks)."""
    order = np.argsort(ids, kind="stable")
    out = np.empty((len(ids), *array.shape[1:]), array.dtype)
    out[order] = array[ids[order]]
    return out


class CodeStore:
    """Read access to the compressed tokens of one index version.

    Args:
        version_dir: the version directory holding ``codec.faiss`` and ``codes.npy``.
        tokens_per_image, dim: T and D.

    Raises:
        IndexFormatError: a file is missing, or the codes do not match the codec, T or D.
    """

    def __init__(self, version_dir: Path, tokens_per_image: int, dim: int):
        self.codec = read_codec(Path(version_dir) / CODEC_FILE)
        try:
            self.codes = load_npy(Path(version_dir) / CODES_FILE, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{Path(version_dir) / CODES_FILE} is missing or corrupt") from exc
        cs = code_size(self.codec)
        if self.codec.d != dim or self.codes.ndim != 3 or self.codes.shape[1:] != (tokens_per_image, cs):
            raise IndexFormatError(
                f"token codes {self.codes.shape} do not fit T = {tokens_per_image}, D = {dim}, code size {cs}"
            )
        self.tokens_per_image = tokens_per_image
        self.dim = dim
        self.code_size = cs
        self.sq4 = sq4_params(self.codec)  # (vmin, vdiff) of a plain SQ4 codec: ``maxsim`` skips the decoding

    def get_codes(self, ids: np.ndarray) -> np.ndarray:
        """Codes of ``ids`` (n,) int64 (live ids; the caller checks): (n, T, code_size) uint8."""
        return take_sorted(self.codes, np.asarray(ids, dtype=np.int64))

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Decoded tokens of ``ids`` (n,) int64 (live ids; the caller checks): (n, T, D) float32."""
        return decode(self.codec, self.get_codes(ids))

    def maxsim(self, query: np.ndarray, ids: np.ndarray, gemm=_gemm_nt, framings: int = 1) -> np.ndarray | None:
        """MaxSim of ``query`` (m, D) float32 against the coded tokens of ``ids`` (n,): (n,) float32, computed on
        the codes (``sq4_maxsim``, with ``gemm`` and ``framings``); None when the codec is not a plain SQ4 (the
        caller decodes, ``get``)."""
        if self.sq4 is None:
            return None
        return sq4_maxsim(query, self.get_codes(ids), *self.sq4, gemm=gemm, framings=framings)

    def token_sims(self, query: np.ndarray, token_ids: np.ndarray, chunk_tokens: int = TOKEN_SIMS_CHUNK) -> np.ndarray:
        """Similarity on the codes of each query vector to its own neighbour tokens (the token re-ranking of
        ``FaissInfo.k_factor``).

        Args:
            query: (m, D) float32 query token vectors.
            token_ids: (m, f) int64 FAISS token ids (image id x T + position, ``faiss_index.token_ids``) of row i's
                neighbours; -1 where FAISS found none.
            chunk_tokens: neighbour tokens decoded per step (bounds the float32 temporaries: a batch of queries
                passes thousands of rows at once).

        Returns:
            (m, f) float32 inner products of query row i with the coded tokens of row i (SQ4: on the codes, as
            ``sq4_maxsim``; other codecs: decoded); -inf where the id is -1.
        """
        query = np.asarray(query, dtype=np.float32)
        m, f = token_ids.shape
        out = np.empty((m, f), np.float32)
        step = max(1, chunk_tokens // max(f, 1))
        for start in range(0, m, step):
            rows = slice(start, start + step)
            out[rows] = self._token_sims(query[rows], token_ids[rows])
        return out

    def _token_sims(self, query: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        """``token_sims`` of one chunk of rows: query (r, D), token_ids (r, f) -> (r, f) float32."""
        m, f = token_ids.shape
        valid = token_ids >= 0
        flat = np.where(valid, token_ids, 0).reshape(-1)
        rows = take_sorted(self.codes.reshape(-1, self.code_size), flat).reshape(m, f, self.code_size)
        if self.sq4 is not None:
            even, odd, base = sq4_terms(query, *self.sq4)
            sims = np.einsum("mfh,mh->mf", (rows & 15).astype(np.float32), even)
            sims += np.einsum("mfh,mh->mf", (rows >> 4).astype(np.float32), odd)
            sims += base[:, None]
        else:
            decoded = decode(self.codec, rows)  # (m, f, D)
            sims = np.einsum("mfd,md->mf", decoded, query)
        return np.where(valid, sims, -np.inf).astype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the codes array (next_id x T x code_size)."""
        return int(self.codes.nbytes)
