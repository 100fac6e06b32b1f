"""The training loss of the token head: InfoNCE over MaxSim scores, plus the KoLeo regulariser (SSCD recipe, Pizzi
et al., CVPR 2022, with late interaction as the similarity; issue 22).

For a batch of B edited views (queries, m tokens each) and the clean images of their B instances (gallery, T
tokens each), all unit-norm:

    s(q, g) = (1 / m) sum_i max_j q_i . g_j                                      MaxSim per query token, in [-1, 1]
    L_nce   = mean_b  -log softmax_n( s(q_b, g_n) / tau )[b]                      the view's own instance is the class
    L_koleo = -mean_b log min_{n != b} || z_b - z_n ||                            z: the gallery's token 0 (global)
    L       = L_nce + lambda L_koleo

Gallery items that are also right answers for a query (another region of its photo that shows the view: the
``positive_mask``) are left out of its softmax (logit -inf), so they are neither pulled nor pushed; other regions
of the same photo that do not show it stay as negatives: the tiles case.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def maxsim_matrix(queries: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
    """(B, m, D) x (N, T, D) unit-norm -> (B, N) float: MaxSim divided by m (METHODS.md section 1, per token)."""
    sims = torch.einsum("bmd,ntd->bnmt", queries, gallery)
    return sims.amax(-1).mean(-1)


def info_nce(scores: torch.Tensor, tau: float, ignore: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``scores`` (B, N) / tau with target n = b (the diagonal; N >= B).

    ``ignore``: (B, N) bool, logits set to -inf (never on the diagonal)."""
    logits = scores / tau
    if ignore is not None:
        logits = logits.masked_fill(ignore, float("-inf"))
    target = torch.arange(scores.shape[0], device=scores.device)
    return F.cross_entropy(logits, target)


def koleo(z: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KoLeo entropy estimator (Sablayrolles et al., ICLR 2019): -mean log of each row's distance to its nearest
    other row. z: (B, D) unit-norm, B >= 2."""
    with torch.no_grad():
        sims = z @ z.T
        sims.fill_diagonal_(-2.0)
        nearest = sims.argmax(dim=1)
    dist = (z - z[nearest]).norm(dim=1)
    return -torch.log(dist + eps).mean()


def head_loss(q: torch.Tensor, g: torch.Tensor, tau: float = 0.05, koleo_weight: float = 0.0,
              ignore: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """``L`` of the module docstring for projected, unit-norm query tokens q (B, m, D) and gallery tokens g
    (B, T, D); returns the loss and its parts (floats, for the log)."""
    scores = maxsim_matrix(q, g)
    nce = info_nce(scores, tau, ignore)
    loss = nce
    parts = {"nce": float(nce.detach())}
    if koleo_weight:
        kl = koleo(g[:, 0])
        loss = loss + koleo_weight * kl
        parts["koleo"] = float(kl.detach())
    with torch.no_grad():
        masked = scores.masked_fill(ignore, float("-inf")) if ignore is not None else scores
        parts["batch_r1"] = float((masked.argmax(1) == torch.arange(len(scores), device=scores.device)).float().mean())
    return loss, parts
