"""The DMCAC objective: L = b_frob L_frob + b_ce L_ce + b_cac L_cac, mean over the queries of a batch
(METHODS.md section 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from regis.errors import ConfigError
from training.dmcac.divergence import frobenius_loss, masked_softmax
from training.dmcac.heads import CrossAttentionClassifier

Similarity = Literal["cls", "maxsim"]


@dataclass(frozen=True)
class Betas:
    """Loss weights (default (1, 1, 1)); (1, 1, 0) = without CAC, (0, 1, 1) = without L_frob."""

    frob: float = 1.0
    ce: float = 1.0
    cac: float = 1.0

    def __post_init__(self):
        if min(self.frob, self.ce, self.cac) < 0 or self.frob + self.ce + self.cac == 0:
            raise ConfigError(f"betas must be >= 0 and not all 0, got {self}")


def view_similarities(
    views: torch.Tensor, context: torch.Tensor, kind: Similarity = "cls"
) -> torch.Tensor:
    """P: similarity of every view to every context item.

    Args:
        views: (B, A, F) global embeddings ("cls") or (B, A, m, F) tokens ("maxsim").
        context: (B, T, F) or (B, T, n, F), matching ``views``.
        kind: "cls" = dot products of the global embeddings (METHODS.md); "maxsim" = the late-interaction
            score of each view's tokens against each context item's tokens, divided by m so that it stays in
            [-1, 1] like a cosine (the multi-vector option).

    Returns:
        (B, A, T) float.
    """
    if kind == "cls":
        return torch.einsum("baf,btf->bat", views, context)
    if kind == "maxsim":
        sims = torch.einsum("bamf,btnf->batmn", views, context)
        return sims.amax(dim=-1).mean(dim=-1)
    raise ConfigError(f"similarity must be 'cls' or 'maxsim', got {kind!r}")


class DMCACLoss(nn.Module):
    """The DMCAC loss with its two training-only heads (CAC and the linear CE head).

    Args:
        dim: F, the embedding width.
        num_classes: C_train.
        betas: loss weights.
        tau: softmax temperature of the similarity distributions (default 1).
        similarity: "cls" or "maxsim" (see ``view_similarities``).
    """

    def __init__(self, dim: int, num_classes: int, betas: Betas = Betas(), tau: float = 1.0,
                 similarity: Similarity = "cls"):
        super().__init__()
        if tau <= 0:
            raise ConfigError(f"tau must be > 0, got {tau}")
        self.betas = betas
        self.tau = tau
        self.similarity = similarity
        self.cac = CrossAttentionClassifier(dim, num_classes)
        self.ce_head = nn.Linear(dim, num_classes)

    @property
    def needs_context(self) -> bool:
        """Whether a term uses the retrieved context (L_frob or L_cac); plain CE (betas (0, 1, 0)) does not."""
        return bool(self.betas.frob or self.betas.cac)

    def forward(
        self,
        view_emb: torch.Tensor,
        context_emb: torch.Tensor | None,
        mask: torch.Tensor | None,
        labels: torch.Tensor,
        view_tokens: torch.Tensor | None = None,
        context_tokens: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Compute the loss of a batch of queries.

        Args:
            view_emb: (B, A, F) unit-norm embeddings of the A views (view 0 = the original), with gradient.
            context_emb: (B, T, F) the retrieved database embeddings Z_S (no gradient), padded; may be None when
                ``needs_context`` is False.
            mask: (B, T) bool, True = real context entry (each row needs one).
            labels: (B,) int64 training-class labels of the queries, in [0, C_train).
            view_tokens, context_tokens: (B, A, m, F) and (B, T, n, F), needed when similarity = "maxsim".

        Returns:
            {"loss", "frob", "ce", "cac"}: scalars (means over the batch); a term whose beta is 0 is 0.

        Raises:
            ConfigError: a needed input is missing.
        """
        zero = view_emb.new_zeros(())
        frob = zero
        if self.betas.frob:
            if context_emb is None or mask is None:
                raise ConfigError("L_frob needs the retrieved context and its mask")
            if self.similarity == "maxsim":
                if view_tokens is None or context_tokens is None:
                    raise ConfigError("similarity 'maxsim' needs view_tokens and context_tokens")
                p = view_similarities(view_tokens, context_tokens, "maxsim")
            else:
                p = view_similarities(view_emb, context_emb, "cls")
            frob = frobenius_loss(masked_softmax(p, mask[:, None, :], self.tau)).mean()
        z = view_emb[:, 0]
        ce = F.cross_entropy(self.ce_head(z), labels) if self.betas.ce else zero
        cac = zero
        if self.betas.cac:
            if context_emb is None or mask is None:
                raise ConfigError("L_cac needs the retrieved context and its mask")
            cac = F.cross_entropy(self.cac(z, context_emb, mask), labels)
        loss = self.betas.frob * frob + self.betas.ce * ce + self.betas.cac * cac
        return {"loss": loss, "frob": frob.detach(), "ce": ce.detach(), "cac": cac.detach()}
