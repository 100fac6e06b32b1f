"""The DMCAC recipe for the shared training loop (METHODS.md section 2).

Per run: the training images (optionally a seeded per-class subset) are split into queries D_Q and a database
D_D (``split``); class ids are renumbered 0..C_train-1 for the two heads. Z_D = phi(D_D) is computed with the
evaluation transform under no_grad at epoch 0 and after every r-th epoch (``after_step``), and saved in the
checkpoint, so a resumed run uses the very cache the interrupted one had.

Per step: B queries x A views through the encoder (with gradient); each view retrieves its top-k in Z_D
(FAISS on token 0, or exact MaxSim with ``similarity="maxsim"``), the query never being its own neighbour;
S_union padded with a mask, or the whole Z_D in full-retrieval mode; then ``DMCACLoss``. Plain CE
(betas (0, 1, 0)) skips the database entirely.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch

from training.config import DMCACConfig
from training.data.base import RetrievalDataset
from training.data.images import LabeledImages
from training.dmcac.database import DatabaseCache, refresh_due, union_context
from training.dmcac.loss import Betas, DMCACLoss
from training.dmcac.sampler import QueryEpochSampler
from training.dmcac.split import query_database_split
from training.engine.recipe import MicroStep, Recipe


def per_class_subset(labels: np.ndarray, per_class: int | None, seed: int) -> np.ndarray:
    """Sorted positions of a seeded random subset of at most ``per_class`` items of every class (all if None)."""
    labels = np.asarray(labels)
    if per_class is None:
        return np.arange(len(labels), dtype=np.int64)
    rng = np.random.default_rng([seed, 7])
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep)).astype(np.int64)


class DMCACRecipe(Recipe):
    """Database-conditioned training: queries against a cached, periodically refreshed database.

    Args:
        config: the run's ``DMCACConfig``.
        dataset: the dataset (its ``train`` split is used; evaluation classes stay disjoint).

    Raises:
        ConfigError: a class too small for the split, too few queries for one step, or bad settings.
    """

    name = "dmcac"
    loss_label = "DMCAC loss (mean over log interval)"

    def __init__(self, config: DMCACConfig, dataset: RetrievalDataset):
        self.config = config
        keep = per_class_subset(dataset.train.labels, config.max_train_per_class, config.seed)
        self.images: LabeledImages = dataset.train if len(keep) == len(dataset.train) else dataset.train.subset(keep)
        self.class_ids, self.labels = np.unique(self.images.labels, return_inverse=True)
        self.labels = self.labels.astype(np.int64)
        self.queries, database = query_database_split(self.labels, config.split, config.seed)
        self.sampler = QueryEpochSampler(self.queries, config.batch_size, config.accum_steps, config.seed)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = config.epochs * self.steps_per_epoch
        self.database = database
        self.betas = Betas(*config.betas)
        self.cache: DatabaseCache | None = None
        self._refreshes: list[dict] = []

    def bind(self, encoder, device, bf16, num_workers) -> None:
        super().bind(encoder, device, bf16, num_workers)
        c = self.config
        self.heads = DMCACLoss(encoder.config.dim, len(self.class_ids), self.betas, c.tau, c.similarity).to(device)
        if self.heads.needs_context:
            self.cache = DatabaseCache(self.database, self.labels[self.database], c.faiss_index, device)
            self._cache_labels = torch.from_numpy(self.labels[self.database]).to(device)

    def describe(self) -> dict:
        return {
            "train_images_used": len(self.images),
            "num_classes": len(self.class_ids),
            "class_ids": [int(c) for c in self.class_ids],
            "queries": len(self.queries),
            "database": len(self.database),
            "overlap": bool(np.intersect1d(self.queries, self.database).size),
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "images_per_step": self.config.batch_size * self.config.views * self.config.accum_steps,
            "uses_database": self.cache is not None,
        }

    def batches(self, start: int, stop: int) -> Iterator:
        from torch.utils.data import DataLoader

        from regis.models.transforms import eval_transform
        from training.data.samplers import StepBatches
        from training.dmcac.views import MultiViewImages, augmented_view_transform

        enc = self.encoder.config
        data = MultiViewImages(self.images, self.labels, self.config.views, eval_transform(enc),
                               augmented_view_transform(enc))
        loader = DataLoader(
            data, batch_sampler=StepBatches(self.sampler, start, stop, self.config.accum_steps),
            num_workers=self.num_workers, pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(self.config.seed),
        )
        return iter(loader)

    def micro_step(self, batch) -> MicroStep:
        views, labels, index = batch
        b, a = views.shape[:2]
        views, labels = views.to(self.device, non_blocking=True), labels.to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            tokens = self.encoder(views.flatten(0, 1))
        tokens = tokens.float().reshape(b, a, tokens.shape[1], tokens.shape[2])  # (B, A, m, F)
        emb = tokens[:, :, 0]
        stats: dict[str, float] = {}
        context = mask = context_tokens = None
        if self.cache is not None:
            context, mask, context_tokens, positions = self.context(emb, tokens, index.numpy())
            stats["context_size"] = float(mask.sum(1).float().mean())
            same = (self._cache_labels[positions] == labels[:, None]) & mask
            stats["context_same_class"] = float(same.sum() / mask.sum())
        maxsim = self.config.similarity == "maxsim"
        out = self.heads(emb, context, mask, labels, tokens if maxsim else None, context_tokens)
        stats = {"loss": float(out["loss"].detach()), "frob": float(out["frob"]), "ce": float(out["ce"]),
                 "cac": float(out["cac"]), **stats}
        return MicroStep(out["loss"], b * a, stats, {"queries": b})

    def context(self, emb: torch.Tensor, tokens: torch.Tensor, index: np.ndarray):
        """The retrieved context of each query, the query itself never in it.

        Args:
            emb: (B, A, F) view embeddings (token 0).
            tokens: (B, A, m, F) view tokens (MaxSim retrieval).
            index: (B,) int64 positions of the queries in the training images.

        Returns:
            context (B, T, F), mask (B, T) bool, context tokens (B, T, n, F) or None, positions (B, T) int64 on
            the device. "topk": T = A k (S_union, padded); "full": T = |D_D| (an expanded view, no copy).
        """
        b, a = emb.shape[:2]
        cache, maxsim = self.cache, self.config.similarity == "maxsim"
        if self.config.retrieval == "full":
            n = len(cache)
            positions = torch.arange(n, device=self.device).expand(b, n)
            mask = torch.ones(b, n, dtype=torch.bool, device=self.device)
            own = cache.positions_of(index)
            rows = np.flatnonzero(own >= 0)
            mask[torch.from_numpy(rows).to(self.device), torch.from_numpy(own[rows]).to(self.device)] = False
            context = cache.embeddings.expand(b, n, -1)
            ctx_tokens = cache.tokens.expand(b, *cache.tokens.shape) if maxsim else None
            return context, mask, ctx_tokens, positions
        exclude = np.repeat(index, a)
        if maxsim:
            nbrs = cache.search_maxsim(tokens.flatten(0, 1), self.config.top_k, exclude)
        else:
            nbrs = cache.search(emb.flatten(0, 1), self.config.top_k, exclude)
        ctx, mask = union_context(nbrs.reshape(b, a, -1))
        positions = torch.from_numpy(ctx).to(self.device)
        context = cache.embeddings[positions]
        ctx_tokens = cache.tokens[positions] if maxsim else None
        return context, torch.from_numpy(mask).to(self.device), ctx_tokens, positions

    def refresh(self, epoch: int, step: int, log) -> float:
        """Recompute Z_D with the current encoder (evaluation transform, no gradient) and rebuild the index.

        Returns:
            Seconds taken (also logged as a "refresh" record).
        """
        from training.evaluation.embed import embed_images

        t0 = time.perf_counter()
        db_images = self.images.subset(self.database.tolist())
        tokens = embed_images(self.encoder, db_images, self.config.eval_batch_size, self.num_workers)
        maxsim = self.config.similarity == "maxsim"
        self.cache.update(tokens[:, 0], epoch, tokens if maxsim else None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        record = {"kind": "refresh", "step": step, "epoch": epoch, "images": len(db_images),
                  "seconds": round(seconds, 4)}
        self._refreshes.append(record)
        log.append(record)
        return seconds

    def on_start(self, step: int, log) -> None:
        if self.cache is not None and not self.cache.filled:
            self.refresh(self.sampler.epoch_of(step), step, log)

    def after_step(self, done: int, log) -> float:
        at_epoch_end = done % self.steps_per_epoch == 0
        epoch = done // self.steps_per_epoch
        if self.cache is None or not at_epoch_end or done >= self.total_steps:
            return 0.0
        if not refresh_due(epoch, self.config.refresh_every):
            return 0.0
        return self.refresh(epoch, done, log)

    def sampler_state(self, next_step: int) -> dict:
        return {"seed": self.sampler.seed, "next_step": int(next_step)}

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.cache is not None:
            state["database"] = self.cache.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.cache is not None:
            self.cache.load_state_dict(state["database"])

    def session_summary(self) -> dict:
        secs = sum(r["seconds"] for r in self._refreshes)
        return {"refreshes": [r["epoch"] for r in self._refreshes], "refresh_seconds": round(secs, 3),
                "steps_per_epoch": self.steps_per_epoch}
