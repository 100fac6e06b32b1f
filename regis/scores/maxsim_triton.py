"""A fused MaxSim kernel in Triton: one pass computes q . d for a block of documents, the max over each
document's tokens and the sum over the query tokens, without writing the (N x n x m) similarity tensor.

Status: correctness is checked on the CPU with Triton's interpreter (``TRITON_INTERPRET=1``,
``tests/perf/test_maxsim_triton.py``). Its **speed is unmeasured**: no GPU was available when it was written
(BENCHMARKS.md, "Targets"). ``maxsim_gemm`` stays the path regis uses; nothing imports this module unless asked.

Layout: documents are (N, n, D) with n <= ``BLOCK_T`` (16) tokens each; queries (m, D) with m <= ``BLOCK_Q``
(16). Each program scores ``BLOCK_DOCS`` documents: it loads the query (padded to BLOCK_Q rows) and the
documents' tokens (padded to BLOCK_T per document, so BLOCK_DOCS x BLOCK_T rows), accumulates the dot
products over D in chunks of ``BLOCK_K``, masks padded document tokens with -inf and padded query tokens
with 0, and reduces max-then-sum. Source of the formula: ColBERT (Khattab & Zaharia, 2020), METHODS.md 1.
"""

from __future__ import annotations

import torch

BLOCK_Q = 16
BLOCK_T = 16
BLOCK_DOCS = 8
BLOCK_K = 64


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def maxsim_kernel(q_ptr, d_ptr, out_ptr, n_docs, m, n, dim,
                      BLOCK_Q: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DOCS: tl.constexpr,
                      BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        rows_q = tl.arange(0, BLOCK_Q)
        # document token rows of this block: doc index * BLOCK_T + token index
        r = tl.arange(0, BLOCK_DOCS * BLOCK_T)
        doc = pid * BLOCK_DOCS + r // BLOCK_T
        tok = r % BLOCK_T
        row_ok = (doc < n_docs) & (tok < n)
        acc = tl.zeros((BLOCK_Q, BLOCK_DOCS * BLOCK_T), dtype=tl.float32)
        for k0 in range(0, dim, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            q = tl.load(q_ptr + rows_q[:, None] * dim + ks[None, :],
                        mask=(rows_q[:, None] < m) & (ks[None, :] < dim), other=0.0)
            d = tl.load(d_ptr + (doc * n + tok)[:, None] * dim + ks[None, :],
                        mask=row_ok[:, None] & (ks[None, :] < dim), other=0.0)
            acc += tl.dot(q.to(tl.float32), tl.trans(d.to(tl.float32)))
        acc = tl.where(row_ok[None, :], acc, float("-inf"))
        best = tl.max(tl.reshape(acc, (BLOCK_Q, BLOCK_DOCS, BLOCK_T)), axis=2)  # (BLOCK_Q, BLOCK_DOCS)
        best = tl.where((tl.arange(0, BLOCK_Q) < m)[:, None], best, 0.0)
        score = tl.sum(best, axis=0)
        docs = pid * BLOCK_DOCS + tl.arange(0, BLOCK_DOCS)
        tl.store(out_ptr + docs, score, mask=docs < n_docs)

    return maxsim_kernel


def maxsim_triton(query: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """MaxSim of one query against every document with the fused kernel.

    Args:
        query: (m, D) float tokens, m <= 16.
        docs: (N, n, D) float16/float32 tokens, n <= 16, on the same device (CUDA, or CPU under
            ``TRITON_INTERPRET=1``).

    Returns:
        (N,) float32 scores, equal to ``maxsim_gemm(query.float(), docs)`` up to float summation order.

    Raises:
        ValueError: shapes out of range or mismatched widths.
        ImportError: Triton is not installed.
    """
    if query.ndim != 2 or docs.ndim != 3 or query.shape[1] != docs.shape[2]:
        raise ValueError(f"expected query (m, D) and docs (N, n, D), got {tuple(query.shape)}, {tuple(docs.shape)}")
    m, dim = query.shape
    n_docs, n, _ = docs.shape
    if not 1 <= m <= BLOCK_Q or not 1 <= n <= BLOCK_T:
        raise ValueError(f"the kernel takes at most {BLOCK_Q} query and {BLOCK_T} document tokens, got {m}, {n}")
    out = torch.empty(n_docs, dtype=torch.float32, device=docs.device)
    if n_docs == 0:
        return out
    grid = ((n_docs + BLOCK_DOCS - 1) // BLOCK_DOCS,)
    _kernel()[grid](query.contiguous(), docs.contiguous(), out, n_docs, m, n, dim,
                    BLOCK_Q=BLOCK_Q, BLOCK_T=BLOCK_T, BLOCK_DOCS=BLOCK_DOCS, BLOCK_K=BLOCK_K)
    return out
