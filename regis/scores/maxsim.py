"""ColBERT-style late-interaction (MaxSim) scoring.

    S(Q, D) = sum_{i=1..m} max_{j=1..n} q_i . d_j            (METHODS.md section 1)

Any query token may match any document token; S is asymmetric. With unit-norm tokens S lies in [-m, m] and
S(Q, Q) = m. An image of two framings ("center-crop+aspect", ``framing_score`` "best") scores
max_f S(Q_f, D_f): each framing's query tokens against the image's tokens of the same framing
(``regis.scores.framings.framing_blocks``: only those blocks are multiplied).
Padded document tokens are masked with -inf before the max (never 0: a query token whose
similarities are all negative would otherwise score 0 against the padding). Padded query tokens contribute 0
to the sum.
"""

from __future__ import annotations

import torch

from regis.scores.framings import framing_blocks


def _check_tokens(name: str, x: torch.Tensor, ndim: int) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")


def _check_chunked(name: str, queries: torch.Tensor, ndim: int, docs: torch.Tensor, chunk_size: int) -> None:
    """Shapes of the all-pairs scorers: queries with ``ndim`` dims, 3-D docs of the same width, chunk_size >= 1."""
    _check_tokens(name, queries, ndim)
    _check_tokens("docs", docs, 3)
    if queries.shape[-1] != docs.shape[-1]:
        raise ValueError(f"token widths differ: {name} {queries.shape[-1]}, docs {docs.shape[-1]}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def maxsim_paired(
    queries: torch.Tensor,
    docs: torch.Tensor,
    doc_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MaxSim of query ``b`` against document ``b`` for every ``b`` (the training-time pairing).

    Args:
        queries: (B, m, D) float tokens.
        docs: (B, n, D) float tokens, same dtype and device.
        doc_mask: optional (B, n) bool, True where a document token is real; padded tokens get -inf.
        query_mask: optional (B, m) bool, True where a query token is real; padded tokens add 0.

    Returns:
        (B,) scores in the dtype of the inputs. Differentiable (gradients flow through the selected maxima).

    Raises:
        ValueError: wrong number of dimensions or mismatched batch / width.
    """
    _check_tokens("queries", queries, 3)
    _check_tokens("docs", docs, 3)
    if queries.shape[0] != docs.shape[0] or queries.shape[2] != docs.shape[2]:
        raise ValueError(f"queries {tuple(queries.shape)} and docs {tuple(docs.shape)} do not pair up")
    sims = torch.einsum("bmd,bnd->bmn", queries, docs)
    if doc_mask is not None:
        sims = sims.masked_fill(~doc_mask[:, None, :], float("-inf"))
    best = sims.amax(dim=-1)
    if query_mask is not None:
        best = best.masked_fill(~query_mask, 0.0)
    return best.sum(dim=-1)


def maxsim_scores(
    queries: torch.Tensor,
    docs: torch.Tensor,
    doc_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """MaxSim of every query against every document (the retrieval-time all-pairs form).

    Args:
        queries: (Q, m, D) or (m, D) float tokens.
        docs: (N, n, D) float tokens (float16 documents are upcast to the query dtype chunk by chunk).
        doc_mask: optional (N, n) bool, True where a document token is real.
        query_mask: optional (Q, m) bool, True where a query token is real.
        chunk_size: documents scored per step; bounds the (Q, chunk, m, n) intermediate.

    Returns:
        (Q, N) scores, or (N,) when ``queries`` was 2-D; dtype of ``queries``.

    Raises:
        ValueError: wrong number of dimensions, mismatched widths, or chunk_size < 1.
    """
    single = queries.ndim == 2
    if single:
        queries = queries[None]
        if query_mask is not None and query_mask.ndim == 1:
            query_mask = query_mask[None]
    _check_chunked("queries", queries, 3, docs, chunk_size)
    out = []
    for start in range(0, docs.shape[0], chunk_size):
        chunk = docs[start : start + chunk_size].to(device=queries.device, dtype=queries.dtype)
        sims = torch.einsum("qmd,knd->qkmn", queries, chunk)
        if doc_mask is not None:
            mask = doc_mask[start : start + chunk_size].to(queries.device)
            sims = sims.masked_fill(~mask[None, :, None, :], float("-inf"))
        best = sims.amax(dim=-1)  # (Q, chunk, m)
        if query_mask is not None:
            best = best.masked_fill(~query_mask.to(queries.device)[:, None, :], 0.0)
        out.append(best.sum(dim=-1))
    scores = torch.cat(out, dim=1) if out else queries.new_zeros((queries.shape[0], 0))
    return scores[0] if single else scores


# Values (documents x tokens x width) upcast and multiplied per GEMM on a CPU: 4 MiB of float32, so the upcast
# chunk is still in cache when the GEMM reads it. With 8,192 documents per chunk (52 MB at 10 x 1280) the rerank
# of ~1,000 candidates took about twice as long on the 2-core AMD EPYC VM (`python -m bench.rerank`,
# BENCHMARKS.md section 6).
CPU_CHUNK_VALUES = 1 << 20
DEVICE_CHUNK_DOCS = 8192


def gemm_chunk_docs(docs: torch.Tensor) -> int:
    """Documents per GEMM of ``maxsim_gemm`` for (N, n, D) ``docs``: on a CPU as many as hold
    ``CPU_CHUNK_VALUES`` values (at least 1), elsewhere ``DEVICE_CHUNK_DOCS``."""
    if docs.device.type != "cpu":
        return DEVICE_CHUNK_DOCS
    return max(1, CPU_CHUNK_VALUES // max(1, docs.shape[1] * docs.shape[2]))


def maxsim_gemm(query: torch.Tensor, docs: torch.Tensor, chunk_size: int | None = None,
                framings: int = 1) -> torch.Tensor:
    """MaxSim of one query against every document, as one matrix product per chunk (the rerank fast path).

    Same scores as ``maxsim_scores(query, docs)`` up to float summation order, without the 4-D einsum: the
    documents' tokens are flattened to (N * n, D), the query's (m, D) multiplied by their transpose and reduced
    with a max over each document's n tokens and a sum over the m query tokens. On a CPU this is one BLAS GEMM;
    float16 or bfloat16 documents are upcast to the query's dtype chunk by chunk (CPUs have no fast float16 GEMM).

    Args:
        query: (m, D) float tokens (float32 on CPU).
        docs: (N, n, D) float tokens, any float dtype, same device; no padding.
        chunk_size: documents per GEMM; bounds the upcast copy to chunk_size x n x D values (None:
            ``gemm_chunk_docs(docs)``, cache-sized on a CPU).
        framings: > 1: the query's and the documents' tokens are that many framings' blocks, one after the other
            (``EncoderConfig.score_framings``, "center-crop+aspect" with ``framing_score`` "best"); a document's
            score is its better framing's MaxSim: max over framings f of sum_{i in f} max_{j in f} q_i . d_j, each
            framing's query tokens against the document's tokens of the same framing, the only blocks multiplied
            (``framing_blocks``).

    Returns:
        (N,) scores in the dtype of ``query``.

    Raises:
        ValueError: wrong number of dimensions, mismatched widths, chunk_size < 1, or token counts that do not
            split into ``framings``.
    """
    if chunk_size is None:
        chunk_size = gemm_chunk_docs(docs)
    _check_chunked("query", query, 2, docs, chunk_size)
    n_docs, n, d = docs.shape
    blocks = framing_blocks(query.shape[0], n, framings)
    out = []
    for start in range(0, n_docs, chunk_size):
        chunk = docs[start : start + chunk_size]
        best = None
        for rows, cols in blocks:  # framings scored apart: only each framing's own block is multiplied
            part = chunk[:, cols]
            flat = part.reshape(-1, d).to(dtype=query.dtype)
            # (m, D) @ (D, c * n), not (c * n, D) @ (D, m): the same product, but MKL ran the wide form ~3x faster on
            # the AMD EPYC VM (300 candidates: 1.9 vs 6.3 ms; `python -m bench.rerank`)
            score = (query[rows] @ flat.T).view(-1, chunk.shape[0], part.shape[1]).amax(dim=2).sum(dim=0)
            best = score if best is None else torch.maximum(best, score)
        out.append(best)
    return torch.cat(out) if out else query.new_zeros((0,))
