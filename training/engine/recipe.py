"""What a training recipe gives the shared loop (``training.engine.loop``): its batches, its loss, its own state.

The loop owns everything else: the run directory, the encoder, the optimiser and schedule, evaluation,
checkpoints, resume, the metrics log and the summary. Recipes: ``triplet`` (METHODS.md section 1,
``training.engine.triplet``) and ``dmcac`` (section 2, ``training.dmcac.recipe``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from regis.errors import ConfigError


@dataclass
class MicroStep:
    """The outcome of one micro-batch.

    Attributes:
        loss: 0-d float tensor with gradient (before division by the accumulation steps).
        images: images forwarded through the encoder.
        stats: floats averaged over a log interval (NaN ignored); must include "loss".
        counts: integers summed over a log interval.
    """

    loss: torch.Tensor
    images: int
    stats: dict[str, float]
    counts: dict[str, int] = field(default_factory=dict)


class Recipe:
    """Base class of a recipe; the loop calls, in order: ``bind``, ``load_state_dict`` (resume only),
    ``on_start``, then per step ``micro_step`` (x accum) and ``after_step``.

    Subclasses set ``name``, ``loss_label``, ``total_steps`` and ``heads`` (the training-only modules whose
    parameters join the optimiser's "head" group and whose state goes into ``trainer_state.pt``, never into
    ``encoder.safetensors``).
    """

    name: str = ""
    loss_label: str = "loss"
    total_steps: int = 0
    heads: nn.Module | None = None

    def bind(self, encoder, device: torch.device, bf16: bool, num_workers: int) -> None:
        """Attach the encoder (already on ``device``) and build the heads."""
        self.encoder, self.device, self.bf16, self.num_workers = encoder, device, bf16, num_workers

    def describe(self) -> dict:
        """What the recipe derived from the data (saved in ``config.json``)."""
        return {}

    def batches(self, start: int, stop: int) -> Iterator:
        """The micro-batches of steps ``start .. stop - 1`` in order (``accum_steps`` per step)."""
        raise NotImplementedError

    def micro_step(self, batch) -> MicroStep:
        """Forward one micro-batch and compute its loss (the loop calls backward)."""
        raise NotImplementedError

    def on_start(self, step: int, log) -> None:
        """Called once before the first step of a session (``step`` = the step the session starts at)."""

    def after_step(self, done: int, log) -> float:
        """Called after optimiser step ``done`` (1-based), before evaluation and checkpointing.

        Returns:
            Seconds spent (not counted as training time).
        """
        return 0.0

    def sampler_state(self, next_step: int) -> dict:
        """The sampler's state in ``trainer_state.pt`` (``{"seed", "next_step"}``)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The recipe's own state for ``trainer_state.pt`` (tensors, numbers, strings, lists and dicts)."""
        return {"heads": self.heads.state_dict()} if self.heads is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output (resume)."""
        if self.heads is not None:
            self.heads.load_state_dict(state["heads"])

    def session_summary(self) -> dict:
        """Extra figures for the run summary's ``this_session``."""
        return {}


# recipe name -> (module, recipe class, config class)
RECIPES = {
    "triplet": ("training.engine.triplet", "TripletRecipe", "TripletConfig"),
    "dmcac": ("training.dmcac.recipe", "DMCACRecipe", "DMCACConfig"),
}


def recipe_classes(name: str) -> tuple[type[Recipe], type]:
    """The recipe class and its config class, imported on demand.

    Raises:
        ConfigError: unknown recipe name.
    """
    if name not in RECIPES:
        raise ConfigError(f"unknown training recipe {name!r}; choose one of {sorted(RECIPES)}")
    module, recipe_cls, config_cls = RECIPES[name]
    import training.config as configs

    return getattr(importlib.import_module(module), recipe_cls), getattr(configs, config_cls)
