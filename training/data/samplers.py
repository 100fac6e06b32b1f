"""Batch samplers for triplet training: random triplets, and P x K class-balanced batches (METHODS.md section 1).

Every batch is a pure function of ``(seed, step, micro)``: its numpy generator is seeded with that triple.
Resuming at a step therefore draws exactly the batches the interrupted run would have drawn, whatever the
DataLoader prefetched, and the sampler's whole state is ``{"seed", "next_step"}``. Each drawn image also gets
an augmentation seed (see ``training.data.images.TransformedImages``), so the augmentations repeat too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from regis.errors import ConfigError

Batch = list[tuple[int, int]]  # (image index, augmentation seed)


def _class_index(labels: np.ndarray) -> dict[int, np.ndarray]:
    labels = np.asarray(labels, dtype=np.int64)
    return {int(c): np.flatnonzero(labels == c) for c in np.unique(labels)}


class _SeededSampler:
    def __init__(self, labels: np.ndarray, seed: int):
        self.by_class = _class_index(labels)
        self.seed = int(seed)
        # Classes that can give an anchor and a distinct positive.
        self.pos_classes = np.array(sorted(c for c, idx in self.by_class.items() if idx.size >= 2), dtype=np.int64)

    def rng(self, step: int, micro: int = 0) -> np.random.Generator:
        """The generator of batch ``(step, micro)``."""
        return np.random.default_rng([self.seed, int(step), int(micro)])

    def _with_seeds(self, rng: np.random.Generator, indices: list[int]) -> Batch:
        seeds = rng.integers(0, 2**62, size=len(indices))
        return [(int(i), int(s)) for i, s in zip(indices, seeds, strict=True)]

    def batch(self, step: int, micro: int = 0) -> Batch:
        """The batch of optimiser step ``step``, micro-batch ``micro`` (gradient accumulation)."""
        raise NotImplementedError


class RandomTripletSampler(_SeededSampler):
    """Random triplets: a random class (with >= 2 images), anchor != positive from it, a negative from a random
    other class.

    A batch of T triplets is laid out ``[anchors (T), positives (T), negatives (T)]``: 3T images, triplet t is
    (t, T + t, 2T + t) (``training.losses.miners.given_triplets``).

    Args:
        labels: (N,) int class ids of the training images.
        triplets: T, triplets per batch (>= 1).
        seed: base seed.

    Raises:
        ConfigError: T < 1, no class with 2 images, or fewer than 2 classes.
    """

    def __init__(self, labels: np.ndarray, triplets: int, seed: int = 0):
        super().__init__(labels, seed)
        if triplets < 1:
            raise ConfigError(f"triplets per batch must be >= 1, got {triplets}")
        if self.pos_classes.size < 1 or len(self.by_class) < 2:
            raise ConfigError(
                f"random triplets need >= 2 classes and a class with >= 2 images; the training set has "
                f"{len(self.by_class)} classes, {self.pos_classes.size} with >= 2 images"
            )
        self.triplets = triplets
        self.classes = np.array(sorted(self.by_class), dtype=np.int64)

    @property
    def batch_size(self) -> int:
        """Images per batch (3T)."""
        return 3 * self.triplets

    def batch(self, step: int, micro: int = 0) -> Batch:
        rng = self.rng(step, micro)
        anchors, positives, negatives = [], [], []
        for _ in range(self.triplets):
            c = int(rng.choice(self.pos_classes))
            a, p = rng.choice(self.by_class[c], size=2, replace=False)
            others = self.classes[self.classes != c]
            n = rng.choice(self.by_class[int(rng.choice(others))])
            anchors.append(int(a))
            positives.append(int(p))
            negatives.append(int(n))
        return self._with_seeds(rng, anchors + positives + negatives)


class PKSampler(_SeededSampler):
    """P x K class-balanced batches: P distinct classes (with >= 2 images each), K images of each.

    K images are drawn without replacement when the class has >= K images, else with replacement (a repeated
    image is still a distinct augmented view). Batch layout: class-major, ``[c1 x K, c2 x K, ...]``.

    Args:
        labels: (N,) int class ids.
        p: classes per batch (>= 2).
        k: images per class (>= 2).
        seed: base seed.

    Raises:
        ConfigError: P < 2, K < 2, or fewer than P classes with >= 2 images.
    """

    def __init__(self, labels: np.ndarray, p: int, k: int, seed: int = 0):
        super().__init__(labels, seed)
        if p < 2 or k < 2:
            raise ConfigError(f"P x K sampling needs P >= 2 and K >= 2, got P = {p}, K = {k}")
        if self.pos_classes.size < p:
            raise ConfigError(
                f"P = {p} classes per batch, but the training set has only {self.pos_classes.size} classes with >= 2 "
                "images; lower --p"
            )
        self.p, self.k = p, k

    @property
    def batch_size(self) -> int:
        """Images per batch (P K)."""
        return self.p * self.k

    def batch(self, step: int, micro: int = 0) -> Batch:
        rng = self.rng(step, micro)
        out: list[int] = []
        for c in rng.choice(self.pos_classes, size=self.p, replace=False):
            idx = self.by_class[int(c)]
            out.extend(int(i) for i in rng.choice(idx, size=self.k, replace=idx.size < self.k))
        return self._with_seeds(rng, out)


class StepBatches:
    """The batch plan of a run, for a DataLoader's ``batch_sampler``: micro-batches of steps
    ``start_step .. total_steps - 1`` in order, ``accum`` micro-batches per step.

    Args:
        sampler: a ``RandomTripletSampler`` or ``PKSampler``.
        start_step: first step (0-based) to draw.
        total_steps: one past the last step.
        accum: micro-batches per optimiser step (gradient accumulation).
    """

    def __init__(self, sampler: _SeededSampler, start_step: int, total_steps: int, accum: int = 1):
        self.sampler, self.start_step, self.total_steps, self.accum = sampler, start_step, total_steps, accum

    def __iter__(self) -> Iterator[Batch]:
        for step in range(self.start_step, self.total_steps):
            for micro in range(self.accum):
                yield self.sampler.batch(step, micro)

    def __len__(self) -> int:
        return max(0, self.total_steps - self.start_step) * self.accum

    def state_dict(self, next_step: int) -> dict:
        """What a checkpoint stores to resume the sampler at ``next_step``."""
        return {"seed": self.sampler.seed, "next_step": int(next_step)}
