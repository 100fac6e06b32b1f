"""Similarity distributions and the divergence loss L_frob (METHODS.md section 2).

P = Z_A Z_S^T (A x T) -> P'_i = softmax(P_i / tau) over the context S (padded entries masked out);
L_ij = JS(P'_i, P'_j) = 0.5 KL(P'_i || M) + 0.5 KL(P'_j || M), M = (P'_i + P'_j) / 2, natural log,
0 log 0 = 0, so 0 <= L_ij <= ln 2; L_frob = sqrt(sum_{i=2..A} sum_{j<i} L_ij^2) (strict lower triangle).
"""

from __future__ import annotations

import torch


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None, tau: float = 1.0) -> torch.Tensor:
    """softmax(logits / tau) over the last dim, with masked-out entries exactly 0.

    Args:
        logits: (..., T) float.
        mask: (..., T) bool (True = real entry), broadcastable to ``logits``; None = all real.
        tau: temperature > 0.

    Returns:
        (..., T) probabilities summing to 1 over the real entries.

    Raises:
        ValueError: tau <= 0.
    """
    if tau <= 0:
        raise ValueError(f"temperature tau must be > 0, got {tau}")
    x = logits / tau
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    return torch.softmax(x, dim=-1)


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence between distributions on the last dim (natural log, 0 log 0 = 0).

    Args:
        p, q: (..., T) probabilities (broadcastable).

    Returns:
        (...) values in [0, ln 2].
    """
    m = 0.5 * (p + q)
    return 0.5 * _kl_terms(p, m).sum(-1) + 0.5 * _kl_terms(q, m).sum(-1)


def _kl_terms(p: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """p * log(p / m) elementwise, 0 where p = 0, with finite gradients there (masked entries have p = m = 0;
    a plain xlogy would back-propagate 0 * inf = NaN)."""
    live = p > 0
    p_safe = torch.where(live, p, torch.ones_like(p))
    m_safe = torch.where(live, m, torch.ones_like(m))
    return torch.where(live, p_safe * (p_safe.log() - m_safe.log()), torch.zeros_like(p))


def pairwise_js(dists: torch.Tensor) -> torch.Tensor:
    """L_ij = JS(P'_i, P'_j) for every pair of views.

    Args:
        dists: (B, A, T) probabilities, one distribution per view.

    Returns:
        (B, A, A) symmetric, zero diagonal.
    """
    return js_divergence(dists[:, :, None, :], dists[:, None, :, :])


def frobenius_loss(dists: torch.Tensor) -> torch.Tensor:
    """L_frob = sqrt(sum over the strict lower triangle of L_ij^2), per query.

    Args:
        dists: (B, A, T) probabilities, A >= 2.

    Returns:
        (B,) float; exactly 0 (with zero gradient) when all views' distributions are identical.

    Raises:
        ValueError: fewer than 2 views.
    """
    a = dists.shape[1]
    if a < 2:
        raise ValueError(f"L_frob needs A >= 2 views, got {a}")
    lower = torch.tril(torch.ones(a, a, dtype=torch.bool, device=dists.device), diagonal=-1)
    sq = (pairwise_js(dists) ** 2)[:, lower].sum(-1)
    # sqrt has an infinite derivative at 0: take it only where the sum is positive
    positive = sq > 0
    return torch.where(positive, sq.clamp_min(1e-30).sqrt(), torch.zeros_like(sq))
