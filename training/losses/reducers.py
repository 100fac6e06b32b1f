"""Reducers: per-triplet losses -> the batch loss."""

from __future__ import annotations

import torch

from regis.errors import ConfigError

REDUCERS = ("mean", "mean-nonzero")


def reduce_losses(losses: torch.Tensor, reducer: str = "mean") -> torch.Tensor:
    """Reduce (M,) per-triplet losses to a scalar.

    Args:
        losses: (M,) float, >= 0.
        reducer: "mean" (METHODS.md section 1: mean over triplets) or "mean-nonzero" (mean over the triplets
            with a positive loss, as pytorch-metric-learning's AvgNonZeroReducer).

    Returns:
        0-d float tensor; 0 (still attached to the graph when possible) when there is nothing to average.

    Raises:
        ConfigError: unknown reducer.
    """
    if reducer not in REDUCERS:
        raise ConfigError(f"reducer must be one of {REDUCERS}, got {reducer!r}")
    if reducer == "mean-nonzero":
        losses = losses[losses > 0]
    if losses.numel() == 0:
        return losses.sum()
    return losses.mean()
