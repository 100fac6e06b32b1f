"""The resolved configuration of a training run (saved as ``config.json`` in the run directory): the fields every
recipe shares, and those of the triplet (METHODS.md section 1) and DMCAC (section 2) recipes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from regis.errors import ConfigError


class TrainerConfig(BaseModel):
    """What every training recipe shares: the data, the starting encoder, the optimiser and the bookkeeping.

    Attributes (units in brackets):
        data, data_format, train_classes, check_counts: the dataset (``training.data.registry.open_dataset``).
        backbone, weights, random_init, init_seed: the starting encoder (``regis.models.encoder.build_encoder``).
        token_set, roi_size, border, cue_method, image_size: the encoder's token layout and input size [px].
        freeze_batchnorm: keep BatchNorm running statistics fixed while training (``training.engine.modes``).
        accum_steps: micro-batches per optimiser step (gradient accumulation).
        lr: backbone learning rate; head_lr: learning rate of parameters outside the backbone (training heads).
        weight_decay: AdamW decoupled weight decay (all parameters).
        warmup_steps: linear warm-up [steps], then cosine decay to ``min_lr_ratio`` x lr at the last step.
        seed: sampler and augmentation seed.
        eval_every: evaluate on the test split every this many steps (0: before and after training only).
        eval_max_images: evaluate on a seeded subset of this many test images (None: all).
        eval_batch_size: images per forward pass when embedding for evaluation (and for the DMCAC database).
        log_every: write a training line to ``metrics.jsonl`` every this many steps.
        checkpoint_every: save ``encoder.safetensors`` + ``trainer_state.pt`` every this many steps (and at the end).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    data: str
    data_format: str = "auto"
    train_classes: str | None = None
    check_counts: bool = True

    backbone: str | None = None
    weights: str | None = None
    random_init: bool = False
    init_seed: int = 0
    token_set: Literal["cls", "cls+reg", "cls+reg+roi"] = "cls+reg+roi"
    roi_size: int = Field(3, ge=1)
    border: Literal["clip", "shift"] = "clip"
    cue_method: str | None = None
    image_size: int | None = Field(None, ge=32)
    freeze_batchnorm: bool = True

    accum_steps: int = Field(1, ge=1)
    lr: float = Field(2e-5, gt=0)
    head_lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-2, ge=0)
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    seed: int = 0

    eval_every: int = Field(0, ge=0)
    eval_max_images: int | None = Field(2000, ge=2)
    eval_batch_size: int = Field(64, ge=1)
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(500, ge=1)

    @model_validator(mode="after")
    def _common(self) -> TrainerConfig:
        if self.roi_size % 2 == 0:
            raise ValueError(f"roi_size N must be odd, got {self.roi_size}")
        if self.random_init and self.weights:
            raise ValueError("give either weights or random_init, not both")
        return self


class TripletConfig(TrainerConfig):
    """Everything that decides what a ``regis train triplet`` run computes (METHODS.md sections 1 and 3).

    Attributes (besides ``TrainerConfig``'s):
        sampler: "random" (random triplets, METHODS.md section 1) or "pk" (P x K class-balanced batches + a miner).
        miner: "batch-hard" or "semi-hard" (P x K batches only).
        p, k: classes per batch and images per class ("pk").
        triplets_per_batch: T ("random"; 3T images per batch).
        margin: alpha on the summed MaxSim score.
        reducer: "mean" (over triplets) or "mean-nonzero".
        steps: optimiser steps.
    """

    sampler: Literal["random", "pk"] = "random"
    miner: Literal["batch-hard", "semi-hard"] = "batch-hard"
    p: int = Field(8, ge=2)
    k: int = Field(4, ge=2)
    triplets_per_batch: int = Field(16, ge=1)
    margin: float = Field(0.2, ge=0)
    reducer: Literal["mean", "mean-nonzero"] = "mean"

    steps: int = Field(1000, ge=1)


    @property
    def images_per_micro_batch(self) -> int:
        """Images in one forward pass."""
        return self.p * self.k if self.sampler == "pk" else 3 * self.triplets_per_batch


class DMCACConfig(TrainerConfig):
    """Everything that decides what a ``regis train dmcac`` run computes (METHODS.md section 2).

    Attributes (besides ``TrainerConfig``'s):
        split: "stratified" (per class, half the training images are queries D_Q, half the database D_D [rec])
            or "overlap" (D_Q = D_D = all; a query is removed from its own neighbours).
        max_train_per_class: train on a seeded random subset of this many images per class (None: all).
        views: A, views per query (view 0 = the original under the eval transform, views 1..A-1 augmented with
            RandomResizedCrop + flip + RandAugment(2, 9)); A >= 2 whenever betas.frob > 0.
        top_k: k, neighbours per view in the cached database (capped at |D_D|).
        retrieval: "topk" (context = S_union of the views' top-k) or "full" (context = the whole database, FR).
        faiss_index: FAISS factory spec of the database index, inner product ("Flat" = exact IndexFlatIP).
        refresh_every: r [epochs]; the database cache is recomputed at epochs 0, r, 2r, ...
        tau: temperature of the similarity distributions.
        betas: (b_frob, b_ce, b_cac), each >= 0, not all 0; (0, 1, 0) is plain CE fine-tuning.
        similarity: "cls" (P from token-0 dot products) or "maxsim" (P from MaxSim over all the encoder's tokens,
            divided by their number; neighbours then found by exact MaxSim too).
        batch_size: queries per micro-batch (A x batch_size images per forward pass).
        epochs: passes over D_Q; steps = epochs x floor(|D_Q| / (batch_size x accum_steps)).
    """

    split: Literal["stratified", "overlap"] = "stratified"
    max_train_per_class: int | None = Field(None, ge=2)
    views: int = Field(6, ge=1)
    top_k: int = Field(12, ge=1)
    retrieval: Literal["topk", "full"] = "topk"
    faiss_index: str = "Flat"
    refresh_every: int = Field(5, ge=1)
    tau: float = Field(1.0, gt=0)
    betas: tuple[float, float, float] = (1.0, 1.0, 1.0)
    similarity: Literal["cls", "maxsim"] = "cls"
    batch_size: int = Field(32, ge=1)
    epochs: int = Field(20, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> DMCACConfig:
        frob, ce, cac = self.betas
        if min(self.betas) < 0 or frob + ce + cac == 0:
            raise ValueError(f"betas must be >= 0 and not all 0, got {self.betas}")
        if frob > 0 and self.views < 2:
            raise ValueError(f"L_frob (betas[0] = {frob}) needs views A >= 2, got {self.views}")
        return self

    @property
    def needs_database(self) -> bool:
        """Whether any loss term uses the retrieved context (L_frob or L_cac); not for plain CE."""
        return self.betas[0] > 0 or self.betas[2] > 0


def make_config(**values) -> TripletConfig:
    """Build a ``TripletConfig``, turning validation failures into ``ConfigError`` naming the fields."""
    return validated(TripletConfig, values)


def make_dmcac_config(**values) -> DMCACConfig:
    """Build a ``DMCACConfig``, turning validation failures into ``ConfigError`` naming the fields."""
    return validated(DMCACConfig, values)


def validated(cls: type[TrainerConfig], values: dict) -> TrainerConfig:
    """``cls(**values)``; a validation failure becomes ``ConfigError`` naming the fields.

    Raises:
        ConfigError: a field is missing, unknown or out of range, or fields are inconsistent.
    """
    try:
        return cls(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid training configuration: {problems}") from None
