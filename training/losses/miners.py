"""Triplet miners: which (anchor, positive, negative) triplets of a batch the loss uses (METHODS.md section 1).

Scores are similarities (higher = closer), ``scores[a, j]`` with the anchor ``a`` as the query. The positive
of an anchor is any other position of the batch with the same label (the same image drawn twice counts: it
is a different augmented view); the anchor itself never is. Selection runs without gradient; the loss then
takes its gradient through the selected scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from regis.errors import ConfigError

MINERS = ("batch-hard", "semi-hard")


@dataclass(frozen=True)
class Triplets:
    """Index triplets into a batch: three (M,) int64 tensors."""

    anchors: torch.Tensor
    positives: torch.Tensor
    negatives: torch.Tensor

    def __len__(self) -> int:
        return int(self.anchors.numel())


def given_triplets(num_triplets: int, device: torch.device | str = "cpu") -> Triplets:
    """The triplets of a ``RandomTripletSampler`` batch laid out [anchors, positives, negatives]:
    triplet t is (t, T + t, 2T + t).

    Raises:
        ConfigError: ``num_triplets`` < 1.
    """
    if num_triplets < 1:
        raise ConfigError(f"need at least 1 triplet, got {num_triplets}")
    t = torch.arange(num_triplets, device=device)
    return Triplets(t, t + num_triplets, t + 2 * num_triplets)


def _masks(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if labels.ndim != 1:
        raise ConfigError(f"labels must be (B,), got shape {tuple(labels.shape)}")
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def _check(scores: torch.Tensor, labels: torch.Tensor) -> None:
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] != labels.shape[0]:
        raise ConfigError(f"scores must be (B, B) for B = {labels.shape[0]} labels, got {tuple(scores.shape)}")


@torch.no_grad()
def batch_hard(scores: torch.Tensor, labels: torch.Tensor) -> Triplets:
    """Batch-hard mining (Hermans et al. 2017): for every anchor, its hardest positive (lowest score) and its
    hardest negative (highest score). Anchors without a positive or a negative are dropped. Ties: first index.

    Args:
        scores: (B, B) float similarities, row = anchor.
        labels: (B,) int labels.

    Returns:
        One triplet per usable anchor, anchors in increasing order.
    """
    _check(scores, labels)
    pos, neg = _masks(labels)
    s = scores.detach().float()
    hardest_pos = s.masked_fill(~pos, float("inf")).argmin(dim=1)
    hardest_neg = s.masked_fill(~neg, float("-inf")).argmax(dim=1)
    keep = pos.any(dim=1) & neg.any(dim=1)
    anchors = torch.nonzero(keep).flatten()
    return Triplets(anchors, hardest_pos[anchors], hardest_neg[anchors])


@torch.no_grad()
def semi_hard(scores: torch.Tensor, labels: torch.Tensor, margin: float) -> Triplets:
    """Semi-hard mining (Schroff et al. 2015, as in TensorFlow Addons' triplet_semihard_loss), in similarities:
    for every positive pair (a, p), the hardest negative that is still less similar than the positive,
    ``argmax { S(a, n) : S(a, n) < S(a, p) }``; when there is none, the least similar negative. Pairs whose
    anchor has no negative are dropped. Only negatives with ``S(a, n) > S(a, p) - margin`` give a non-zero loss.

    Args:
        scores: (B, B) float similarities, row = anchor.
        labels: (B,) int labels.
        margin: alpha (not used for the choice; kept in the signature for miners that need it).

    Returns:
        One triplet per positive pair, ordered by (anchor, positive).
    """
    _check(scores, labels)
    pos, neg = _masks(labels)
    s = scores.detach().float()
    a, p = torch.nonzero(pos & neg.any(dim=1, keepdim=True), as_tuple=True)
    s_an = s[a]  # (M, B): every candidate negative of each pair's anchor
    s_ap = s[a, p][:, None]
    neg_rows = neg[a]
    semi = neg_rows & (s_an < s_ap)
    hardest_semi = s_an.masked_fill(~semi, float("-inf")).argmax(dim=1)
    easiest = s_an.masked_fill(~neg_rows, float("inf")).argmin(dim=1)
    n = torch.where(semi.any(dim=1), hardest_semi, easiest)
    return Triplets(a, p, n)
