"""The multi-vector triplet recipe (METHODS.md section 1): random triplets or P x K batches, augmented with
``regis.models.transforms.train_transform``, the hinge loss on summed MaxSim scores."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from training.config import TripletConfig
from training.data.base import RetrievalDataset
from training.engine.recipe import MicroStep, Recipe


def make_sampler(config: TripletConfig, labels):
    """``PKSampler`` or ``RandomTripletSampler`` as configured (raises ``ConfigError`` on a shape the data cannot
    give)."""
    from training.data.samplers import PKSampler, RandomTripletSampler

    if config.sampler == "pk":
        return PKSampler(labels, config.p, config.k, config.seed)
    return RandomTripletSampler(labels, config.triplets_per_batch, config.seed)


class TripletRecipe(Recipe):
    """Batches of triplets through the encoder; no heads, no state besides the sampler's.

    Args:
        config: the run's ``TripletConfig``.
        dataset: the dataset (its ``train`` split is sampled).

    Raises:
        ConfigError: the sampler cannot draw the configured batches from the training labels.
    """

    name = "triplet"
    loss_label = "triplet loss (MaxSim, mean over log interval)"

    def __init__(self, config: TripletConfig, dataset: RetrievalDataset):
        self.config = config
        self.dataset = dataset
        self.sampler = make_sampler(config, dataset.train.labels)
        self.total_steps = config.steps
        self.miner = config.miner if config.sampler == "pk" else None

    def batches(self, start: int, stop: int) -> Iterator:
        from torch.utils.data import DataLoader

        from regis.models.transforms import train_transform
        from training.data.images import TransformedImages
        from training.data.samplers import StepBatches

        plan = StepBatches(self.sampler, start, stop, self.config.accum_steps)
        loader = DataLoader(
            TransformedImages(self.dataset.train, train_transform(self.encoder.config)), batch_sampler=plan,
            num_workers=self.num_workers, pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(self.config.seed),  # worker seeds; the global RNG untouched
        )
        return iter(loader)

    def micro_step(self, batch) -> MicroStep:
        from training.losses.triplet import multi_vector_triplet_loss

        images, labels = batch
        images, labels = images.to(self.device, non_blocking=True), labels.to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            tokens = self.encoder(images)
        out = multi_vector_triplet_loss(tokens.float(), labels, self.miner, self.config.margin, self.config.reducer)
        stats = {"loss": float(out.loss.detach()), "active_fraction": out.active_fraction,
                 "pos_score": out.pos_score, "neg_score": out.neg_score}
        return MicroStep(out.loss, images.shape[0], stats, {"triplets": out.num_triplets})

    def sampler_state(self, next_step: int) -> dict:
        return {"seed": self.sampler.seed, "next_step": int(next_step)}
