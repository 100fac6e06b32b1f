"""The multi-vector triplet loss on MaxSim scores (METHODS.md section 1):

    L = mean over triplets of max(0, alpha + S(Q, D-) - S(Q, D+)),   alpha = 0.2 on the summed score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from regis.errors import ConfigError
from training.losses.miners import MINERS, batch_hard, given_triplets, semi_hard
from training.losses.reducers import reduce_losses
from training.losses.scores import maxsim_matrix, maxsim_pairs


def triplet_margin_losses(pos_scores: torch.Tensor, neg_scores: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """Per-triplet hinge on similarities: ``max(0, margin + S(a, n) - S(a, p))``.

    Args:
        pos_scores: (M,) float S(anchor, positive).
        neg_scores: (M,) float S(anchor, negative).
        margin: alpha >= 0, in units of the summed MaxSim score.

    Returns:
        (M,) float losses, differentiable.

    Raises:
        ConfigError: mismatched shapes or a negative margin.
    """
    if pos_scores.shape != neg_scores.shape:
        raise ConfigError(
            f"positive scores {tuple(pos_scores.shape)} and negative scores {tuple(neg_scores.shape)} differ"
        )
    if margin < 0:
        raise ConfigError(f"margin must be >= 0, got {margin}")
    return torch.relu(margin + neg_scores - pos_scores)


@dataclass(frozen=True)
class LossOutput:
    """A batch loss and what went into it.

    Attributes:
        loss: 0-d float tensor.
        num_triplets: M, triplets used.
        active_fraction: share of triplets with a positive loss.
        pos_score, neg_score: mean S(a, p) and S(a, n) over the triplets (floats).
    """

    loss: torch.Tensor
    num_triplets: int
    active_fraction: float
    pos_score: float
    neg_score: float


def multi_vector_triplet_loss(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    miner: str | None = "batch-hard",
    margin: float = 0.2,
    reducer: str = "mean",
) -> LossOutput:
    """Triplet loss of a batch of multi-vector embeddings.

    Args:
        tokens: (B, T, D) float unit-norm tokens with gradient.
        labels: (B,) int labels.
        miner: "batch-hard" or "semi-hard" on the (B, B) MaxSim matrix; None for a ``RandomTripletSampler``
            batch (B = 3T, triplets given by the layout).
        margin: alpha.
        reducer: see ``training.losses.reducers``.

    Raises:
        ConfigError: unknown miner, or B not a multiple of 3 with ``miner=None``.
    """
    b = tokens.shape[0]
    if miner is None:
        if b % 3:
            raise ConfigError(f"a random-triplet batch has 3T images, got {b}")
        trip = given_triplets(b // 3, tokens.device)
        pos = maxsim_pairs(tokens, trip.anchors, trip.positives)
        neg = maxsim_pairs(tokens, trip.anchors, trip.negatives)
    elif miner in MINERS:
        scores = maxsim_matrix(tokens)
        trip = batch_hard(scores, labels) if miner == "batch-hard" else semi_hard(scores, labels, margin)
        pos, neg = scores[trip.anchors, trip.positives], scores[trip.anchors, trip.negatives]
    else:
        raise ConfigError(f"miner must be one of {MINERS} (or None for random triplets), got {miner!r}")
    losses = triplet_margin_losses(pos, neg, margin)
    return LossOutput(
        loss=reduce_losses(losses, reducer),
        num_triplets=len(trip),
        active_fraction=float((losses > 0).float().mean()) if len(trip) else 0.0,
        pos_score=float(pos.detach().mean()) if len(trip) else float("nan"),
        neg_score=float(neg.detach().mean()) if len(trip) else float("nan"),
    )

