"""Learning-rate schedule: linear warm-up, then cosine decay."""

from __future__ import annotations

import math

import torch

from regis.errors import ConfigError


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """The learning-rate multiplier used at optimiser step ``step`` (0-based).

    ``(step + 1) / warmup_steps`` during warm-up (so step 0 already moves), then
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * t)) / 2`` with t going from 0 at the end of warm-up to 1 at
    ``total_steps``.

    Raises:
        ConfigError: total_steps < 1, warmup_steps outside [0, total_steps], min_ratio outside [0, 1].
    """
    if total_steps < 1 or not 0 <= warmup_steps <= total_steps or not 0 <= min_ratio <= 1:
        raise ConfigError(f"bad schedule: total {total_steps}, warm-up {warmup_steps}, min ratio {min_ratio}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def build_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying ``warmup_cosine`` to every parameter group; call ``step()`` after each optimiser step."""
    warmup_cosine(0, warmup_steps, total_steps, min_ratio)  # validate now, not at the first step

    def factor(step: int) -> float:
        return warmup_cosine(step, warmup_steps, total_steps, min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
