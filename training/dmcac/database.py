"""The database cache Z_D and retrieval inside the training loop (METHODS.md section 2).

Z_D = phi(D_D) is computed under no_grad with the evaluation transform, kept in a FAISS inner-product
index, and refreshed every r epochs (at epochs 0, r, 2r, ...). It never receives gradient. Each of a
query's A views retrieves its top-k database items; S_union is the union of the A neighbour sets
(k <= T <= A k), padded to A k with a mask so queries batch together. Full retrieval (FR) uses the whole
database as the context instead. With the multi-vector option the cache also holds every item's tokens and
neighbours are found by exact MaxSim (``search_maxsim``).
"""

from __future__ import annotations

import numpy as np
import torch

from regis.errors import ConfigError


def refresh_due(epoch: int, every: int) -> bool:
    """True at epochs 0, r, 2r, ... (r = ``every`` >= 1).

    Raises:
        ConfigError: every < 1.
    """
    if every < 1:
        raise ConfigError(f"the database refresh period must be >= 1 epoch, got {every}")
    return epoch % every == 0


class DatabaseCache:
    """Z_D: the database embeddings, without gradient, in a FAISS index.

    Args:
        dataset_indices: (N_D,) int64 positions of the database items in the training dataset (sorted).
        labels: (N_D,) int class labels of the database items.
        faiss_spec: FAISS factory spec, inner product ("Flat" = IndexFlatIP; e.g. "HNSW32" for approximate;
            an index that needs training, such as "IVF64,Flat", is trained on Z_D at each refresh).
        device: where ``embeddings`` and ``tokens`` are kept (the encoder's device, to gather contexts there);
            the FAISS index always lives on the CPU.

    Attributes:
        embeddings: (N_D, F) float32 on ``device``, requires_grad False (after ``update``).
        tokens: (N_D, m, F) float32 multi-vector tokens, when given to ``update`` (the MaxSim option).
        refreshed_at: the epochs at which ``update`` was called.
    """

    def __init__(self, dataset_indices: np.ndarray, labels: np.ndarray, faiss_spec: str = "Flat",
                 device: str | torch.device = "cpu"):
        self.dataset_indices = np.asarray(dataset_indices, dtype=np.int64)
        if len(self.dataset_indices) == 0:
            raise ConfigError("the database D_D is empty")
        if np.any(np.diff(self.dataset_indices) <= 0):
            raise ConfigError("database indices must be sorted and unique")
        self.labels = np.asarray(labels)
        self.faiss_spec = faiss_spec
        self.device = torch.device(device)
        self.embeddings: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self.refreshed_at: list[int] = []
        self._index = None

    def __len__(self) -> int:
        return len(self.dataset_indices)

    def update(self, embeddings: torch.Tensor, epoch: int, tokens: torch.Tensor | None = None) -> None:
        """Replace Z_D and rebuild the FAISS index.

        Args:
            embeddings: (N_D, F) float unit-norm embeddings (detached, copied as float32 to ``device`` here; a
                copy, so inference-mode tensors are fine).
            epoch: the epoch of this refresh (recorded).
            tokens: optional (N_D, m, F) tokens for multi-vector similarities.

        Raises:
            ConfigError: wrong number of rows, or a FAISS spec that cannot be built.
        """
        import faiss

        if embeddings.shape[0] != len(self) or (tokens is not None and tokens.shape[0] != len(self)):
            raise ConfigError(f"expected {len(self)} database embeddings, got {embeddings.shape[0]}")
        self.embeddings = embeddings.detach().to(self.device, torch.float32, copy=True).contiguous()
        self.tokens = tokens.detach().to(self.device, torch.float32, copy=True).contiguous() if tokens is not None \
            else None
        x = np.ascontiguousarray(self.embeddings.cpu().numpy())
        try:
            index = faiss.index_factory(x.shape[1], self.faiss_spec, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:
            raise ConfigError(f"cannot build FAISS index {self.faiss_spec!r}: {exc}") from exc
        if not index.is_trained:
            index.train(x)
        index.add(x)
        self._index = index
        self.refreshed_at.append(int(epoch))

    @property
    def filled(self) -> bool:
        """Whether ``update`` (or ``load_state_dict``) has filled the cache."""
        return self._index is not None

    def state_dict(self) -> dict:
        """Z_D (and tokens) on the CPU plus the refresh epochs, for a checkpoint (the FAISS index is rebuilt)."""
        return {
            "embeddings": None if self.embeddings is None else self.embeddings.cpu(),
            "tokens": None if self.tokens is None else self.tokens.cpu(),
            "refreshed_at": list(self.refreshed_at),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output: the same Z_D, tokens and refresh history, the index rebuilt from them."""
        self.refreshed_at = []
        if state["embeddings"] is not None:
            self.update(state["embeddings"], 0, state["tokens"])
        self.refreshed_at = [int(e) for e in state["refreshed_at"]]

    def positions_of(self, dataset_indices: np.ndarray) -> np.ndarray:
        """Database positions of dataset items; -1 for items not in the database."""
        dataset_indices = np.asarray(dataset_indices, dtype=np.int64)
        pos = np.searchsorted(self.dataset_indices, dataset_indices)
        pos = np.clip(pos, 0, len(self) - 1)
        return np.where(self.dataset_indices[pos] == dataset_indices, pos, -1)

    def search(self, queries: torch.Tensor, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
        """Top-k database positions of each query vector, never the query's own item.

        Args:
            queries: (n, F) float embeddings (detached here: retrieval is not differentiable).
            k: neighbours wanted; capped at the database size (minus one when excluding).
            exclude: (n,) int64 dataset index of each query's own item, or -1 / None for none.

        Returns:
            (n, k') int64 database positions, best first, k' = min(k, available).

        Raises:
            ConfigError: the cache was never filled, or k < 1.
        """
        if self._index is None:
            raise ConfigError("the database cache is empty: call update() first")
        x = np.ascontiguousarray(queries.detach().float().cpu().numpy())
        own, k_eff = self._own_and_k(len(x), k, exclude)
        fetch = min(k_eff + 1, len(self))
        _, ids = self._index.search(x, fetch)
        out = np.full((len(x), k_eff), -1, dtype=np.int64)  # -1: an approximate index found fewer
        for row in range(len(x)):
            keep = ids[row][(ids[row] >= 0) & (ids[row] != own[row])][:k_eff]
            out[row, : len(keep)] = keep
        return out

    def search_maxsim(self, query_tokens: torch.Tensor, k: int, exclude: np.ndarray | None = None,
                      chunk: int = 1024) -> np.ndarray:
        """Exact top-k database positions by MaxSim S(q, d) = sum_i max_j q_i . d_j (METHODS.md section 1), never
        the query's own item; the multi-vector option's retrieval.

        Args:
            query_tokens: (n, m, F) float tokens (detached here).
            k: neighbours wanted; capped as in ``search``.
            exclude: (n,) int64 dataset index of each query's own item, or -1 / None.
            chunk: database items scored at once (memory: n x chunk x m x n_tokens floats).

        Returns:
            (n, k') int64 database positions, best first (ties: the lower position).

        Raises:
            ConfigError: the cache holds no tokens, or as ``search``.
        """
        if self.tokens is None:
            raise ConfigError("the database cache holds no tokens: pass tokens to update() for MaxSim retrieval")
        own, k_eff = self._own_and_k(len(query_tokens), k, exclude)
        q = query_tokens.detach().to(self.tokens.device, torch.float32)
        scores = torch.cat([
            torch.einsum("qmf,dnf->qdmn", q, self.tokens[i : i + chunk]).amax(-1).sum(-1)
            for i in range(0, len(self), chunk)
        ], dim=1)  # (n, N_D)
        rows = torch.from_numpy(np.flatnonzero(own >= 0)).to(scores.device)
        if len(rows):
            scores[rows, torch.from_numpy(own[own >= 0]).to(scores.device)] = float("-inf")
        # stable descending order: equal scores keep the lower position first
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k_eff]
        return order.cpu().numpy().astype(np.int64)

    def _own_and_k(self, n: int, k: int, exclude: np.ndarray | None) -> tuple[np.ndarray, int]:
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        own = self.positions_of(exclude) if exclude is not None else np.full(n, -1)
        if len(own) != n:
            raise ConfigError(f"exclude has {len(own)} entries for {n} queries")
        k_eff = min(k, len(self) - (1 if (own >= 0).any() else 0))
        if k_eff < 1:
            raise ConfigError("the database has no item besides the query itself")
        return own, k_eff


def union_context(neighbours: np.ndarray, pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """S_union of each query: the union of its A views' neighbour sets, padded with a mask.

    Args:
        neighbours: (B, A, k) int64 database positions (-1 = none).
        pad_to: width of the padded output (default A * k).

    Returns:
        context (B, pad_to) int64 positions (padding = 0) and mask (B, pad_to) bool (True = real); each row's
        real positions are the sorted unique union, T = mask.sum(1) with k <= T <= A k.

    Raises:
        ConfigError: a union wider than ``pad_to``.
    """
    b, a, k = neighbours.shape
    width = pad_to or a * k
    context = np.zeros((b, width), dtype=np.int64)
    mask = np.zeros((b, width), dtype=bool)
    for row in range(b):
        union = np.unique(neighbours[row][neighbours[row] >= 0])
        if len(union) > width:
            raise ConfigError(f"a union of {len(union)} neighbours does not fit pad_to = {width}")
        context[row, : len(union)] = union
        mask[row, : len(union)] = True
    return context, mask


def full_context(n_database: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Full retrieval (FR): every database item is in every query's context.

    Returns:
        context (B, N_D) int64 and mask (B, N_D) all True.
    """
    ctx = np.broadcast_to(np.arange(n_database, dtype=np.int64), (batch, n_database)).copy()
    return ctx, np.ones((batch, n_database), dtype=bool)
