"""The resolved configuration of a triplet fine-tuning run (saved as ``config.json`` in the run directory)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from regis.errors import ConfigError


class TripletConfig(BaseModel):
    """Everything that decides what a ``regis train triplet`` run computes (METHODS.md sections 1 and 3).

    Attributes (units in brackets):
        data, data_format, train_classes, check_counts: the dataset (``training.data.registry.open_dataset``).
        backbone, weights, random_init, init_seed: the starting encoder (``regis.models.encoder.build_encoder``).
        token_set, roi_size, border, cue_method, image_size: the encoder's token layout and input size [px].
        freeze_batchnorm: keep BatchNorm running statistics fixed while training (``training.engine.modes``).
        sampler: "random" (random triplets, METHODS.md section 1) or "pk" (P x K class-balanced batches + a miner).
        miner: "batch-hard" or "semi-hard" (P x K batches only).
        p, k: classes per batch and images per class ("pk").
        triplets_per_batch: T ("random"; 3T images per batch).
        margin: alpha on the summed MaxSim score.
        reducer: "mean" (over triplets) or "mean-nonzero".
        steps: optimiser steps; accum_steps: micro-batches per step (gradient accumulation).
        lr: backbone learning rate; head_lr: learning rate of parameters outside the backbone (if any).
        weight_decay: AdamW decoupled weight decay (all parameters).
        warmup_steps: linear warm-up [steps], then cosine decay to ``min_lr_ratio`` x lr at ``steps``.
        seed: sampler and augmentation seed.
        eval_every: evaluate on the test split every this many steps (0: before and after training only).
        eval_max_images: evaluate on a seeded subset of this many test images (None: all).
        eval_batch_size: images per forward pass when embedding for evaluation.
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

    sampler: Literal["random", "pk"] = "random"
    miner: Literal["batch-hard", "semi-hard"] = "batch-hard"
    p: int = Field(8, ge=2)
    k: int = Field(4, ge=2)
    triplets_per_batch: int = Field(16, ge=1)
    margin: float = Field(0.2, ge=0)
    reducer: Literal["mean", "mean-nonzero"] = "mean"

    steps: int = Field(1000, ge=1)
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
    def _consistent(self) -> TripletConfig:
        if self.roi_size % 2 == 0:
            raise ValueError(f"roi_size N must be odd, got {self.roi_size}")
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        if self.random_init and self.weights:
            raise ValueError("give either weights or random_init, not both")
        return self

    @property
    def images_per_micro_batch(self) -> int:
        """Images in one forward pass."""
        return self.p * self.k if self.sampler == "pk" else 3 * self.triplets_per_batch


def make_config(**values) -> TripletConfig:
    """Build a ``TripletConfig``, turning validation failures into ``ConfigError`` naming the fields."""
    try:
        return TripletConfig(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid training configuration: {problems}") from None
