"""The training query set D_Q and database set D_D (METHODS.md section 2)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from regis.errors import ConfigError

SplitMode = Literal["stratified", "overlap"]


def query_database_split(
    labels: np.ndarray, mode: SplitMode = "stratified", seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split training items into queries and database.

    Args:
        labels: (n,) int class labels of the training split.
        mode: "stratified" (default [rec]): per class, a random half of the items are queries and the rest
            the database, so every class is in both (a class needs >= 2 items); "overlap": D_Q = D_D = all
            items, and retrieval must exclude the query itself from its neighbours.
        seed: RNG seed of the stratified shuffle.

    Returns:
        (query_indices, database_indices), int64 positions into ``labels``, each sorted.

    Raises:
        ConfigError: unknown mode, or a class with fewer than 2 items in stratified mode.
    """
    labels = np.asarray(labels)
    if mode == "overlap":
        all_idx = np.arange(len(labels), dtype=np.int64)
        return all_idx, all_idx.copy()
    if mode != "stratified":
        raise ConfigError(f"split mode must be 'stratified' or 'overlap', got {mode!r}")
    rng = np.random.default_rng(seed)
    queries, database = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) < 2:
            raise ConfigError(f"class {c} has {len(idx)} training item(s); a stratified split needs >= 2 per class")
        idx = rng.permutation(idx)
        half = len(idx) // 2
        queries.append(idx[:half])
        database.append(idx[half:])
    return np.sort(np.concatenate(queries)).astype(np.int64), np.sort(np.concatenate(database)).astype(np.int64)
