"""Score functions for training: MaxSim between the token sets of a batch (METHODS.md section 1).

Higher is more similar. Row ``a`` of a score matrix is image ``a`` as the query: ``S[a, j] = S(E(a), E(j))``,
so a triplet (a, p, n) is scored with the anchor as the query on both sides.
"""

from __future__ import annotations

import torch

from regis.scores.maxsim import maxsim_paired, maxsim_scores


def maxsim_matrix(tokens: torch.Tensor) -> torch.Tensor:
    """All-pairs MaxSim within a batch.

    Args:
        tokens: (B, T, D) float unit-norm tokens (``RegisEncoder.forward``).

    Returns:
        (B, B) float, ``S[a, j] = sum_i max_l tokens[a, i] . tokens[j, l]``; differentiable. The diagonal is T.
    """
    return maxsim_scores(tokens, tokens, chunk_size=max(1, tokens.shape[0]))


def maxsim_pairs(tokens: torch.Tensor, queries: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """MaxSim of selected (query, document) pairs of a batch.

    Args:
        tokens: (B, T, D) float tokens.
        queries, docs: (M,) int64 indices into the batch.

    Returns:
        (M,) float, ``S(tokens[queries[m]], tokens[docs[m]])``; differentiable.
    """
    return maxsim_paired(tokens[queries], tokens[docs])
