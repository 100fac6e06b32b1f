"""Epochs over the training queries D_Q (METHODS.md section 2): each epoch a seeded permutation of D_Q, cut into
micro-batches of B queries; the last, partial batch of an epoch is dropped.

Every batch is a pure function of ``(seed, step, micro)``, as for the triplet samplers
(``training.data.samplers``), so a resumed run draws the batches the interrupted one would have drawn; each
query also gets the seed of its augmented views (``training.dmcac.views.MultiViewImages``).
"""

from __future__ import annotations

import numpy as np

from regis.errors import ConfigError


class QueryEpochSampler:
    """Batches of queries, epoch by epoch.

    Args:
        query_indices: (|D_Q|,) int64 positions of the queries in the training images.
        batch_size: B, queries per micro-batch.
        accum: micro-batches per optimiser step.
        seed: base seed.

    Attributes:
        steps_per_epoch: floor(|D_Q| / (B x accum)) optimiser steps.

    Raises:
        ConfigError: B or accum < 1, or too few queries for one step.
    """

    def __init__(self, query_indices: np.ndarray, batch_size: int, accum: int = 1, seed: int = 0):
        if batch_size < 1 or accum < 1:
            raise ConfigError(f"batch size and accumulation steps must be >= 1, got {batch_size}, {accum}")
        self.queries = np.asarray(query_indices, dtype=np.int64)
        self.batch_size, self.accum, self.seed = batch_size, accum, int(seed)
        self.steps_per_epoch = len(self.queries) // (batch_size * accum)
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"{len(self.queries)} training queries cannot fill one step of {batch_size} queries x {accum} "
                "micro-batches; lower --batch-size"
            )

    def epoch_of(self, step: int) -> int:
        """The epoch (0-based) that optimiser step ``step`` (0-based) belongs to."""
        return step // self.steps_per_epoch

    def batch(self, step: int, micro: int = 0) -> list[tuple[int, int]]:
        """The queries of step ``step``, micro-batch ``micro``: ``[(query index, view seed), ...]`` (B items)."""
        epoch, pos = divmod(int(step), self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.queries)
        first = (pos * self.accum + micro) * self.batch_size
        chosen = order[first : first + self.batch_size]
        seeds = np.random.default_rng([self.seed, int(step), int(micro), 1]).integers(0, 2**62, size=len(chosen))
        return [(int(i), int(s)) for i, s in zip(chosen, seeds, strict=True)]
