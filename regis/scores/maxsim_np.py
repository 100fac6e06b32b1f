"""``regis.scores.maxsim.maxsim_gemm`` in numpy: the rerank of the torch-free query path (``regis search``;
``Searcher(device=None)``), which then imports no torch. Same chunking and the same GEMM (float16 documents upcast
chunk by chunk, a (m, D) @ (D, c * n) product, max over each document's n tokens, sum over the m query tokens);
equal to the torch form to float32 summation order (tests/test_query_bundle.py).
"""

from __future__ import annotations

import numpy as np

from regis.scores.framings import framing_blocks

CPU_CHUNK_VALUES = 1 << 20  # as regis.scores.maxsim: 4 MiB of float32 upcast per GEMM


def maxsim_terms(sims: np.ndarray) -> np.ndarray:
    """The MaxSim sum from a block of similarities: ``sims`` (m, c, n) float32 (query token, document, document
    token) -> (c,) float32, sum over i of max over j of sims[i, :, j].

    The max runs as n elementwise ``np.maximum`` over (m, c) slices: numpy's ``max(axis=2)`` over a short last
    axis (n = 10-20 tokens) took ~5-7x as long (1.3 against 0.2 ms for (15, 2000, 10) on a Zen 4 core:
    ``python -m bench.rerank_sq4``), the SQ4 rerank's largest cost after its GEMMs (BENCHMARKS.md section 9).

    Raises:
        ValueError: ``sims`` not 3-D, or n = 0.
    """
    if sims.ndim != 3 or sims.shape[2] == 0:
        raise ValueError(f"sims must be (m, c, n) with n >= 1, got {sims.shape}")
    best = sims[:, :, 0].copy()
    for j in range(1, sims.shape[2]):
        np.maximum(best, sims[:, :, j], out=best)
    return best.sum(axis=0, dtype=np.float32)


def maxsim_gemm_np(query: np.ndarray, docs: np.ndarray, chunk_size: int | None = None,
                   framings: int = 1) -> np.ndarray:
    """MaxSim of one query against every document.

    Args:
        query: (m, D) float32 tokens.
        docs: (N, n, D) float tokens (float16 or float32), no padding.
        chunk_size: documents per GEMM (None: as many as hold ``CPU_CHUNK_VALUES`` values).
        framings: > 1: each document's score is its better framing's MaxSim, from each framing's own block only
            (``framing_blocks``; as ``maxsim_gemm``'s).

    Returns:
        (N,) float32 scores.

    Raises:
        ValueError: wrong number of dimensions, mismatched widths, chunk_size < 1, or token counts that do not
            split into ``framings``.
    """
    if query.ndim != 2 or docs.ndim != 3:
        raise ValueError(f"query must be (m, D) and docs (N, n, D), got {query.shape} and {docs.shape}")
    n_docs, n, d = docs.shape
    if query.shape[1] != d:
        raise ValueError(f"token widths differ: query {query.shape[1]}, docs {d}")
    if chunk_size is None:
        chunk_size = max(1, CPU_CHUNK_VALUES // max(1, n * d))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    blocks = framing_blocks(len(query), n, framings)
    query = np.ascontiguousarray(query, dtype=np.float32)
    out = []
    for start in range(0, n_docs, chunk_size):
        chunk = docs[start : start + chunk_size]
        best = None
        for rows, cols in blocks:  # framings scored apart: only each framing's own block is multiplied
            part = chunk[:, cols]
            flat = np.ascontiguousarray(part, dtype=np.float32).reshape(-1, d)
            sims = (query[rows] @ flat.T).reshape(-1, chunk.shape[0], part.shape[1])
            score = maxsim_terms(sims)
            best = score if best is None else np.maximum(best, score)
        out.append(best)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
