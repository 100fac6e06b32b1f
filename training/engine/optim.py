"""AdamW with separate backbone and head learning rates."""

from __future__ import annotations

import torch
from torch import nn


def param_groups(
    model: nn.Module, lr: float, head_lr: float, weight_decay: float, heads: nn.Module | None = None
) -> list[dict]:
    """Split trainable parameters into a "backbone" group (names under ``backbone.``) and a "head" group (the
    rest, plus every parameter of ``heads``: training-only modules such as DMCAC's classifiers); the head group
    is left out when empty (a bare ``RegisEncoder`` has no head).

    Returns:
        Parameter-group dicts for ``torch.optim.AdamW`` with keys name, params, lr, weight_decay.
    """
    backbone, head = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (backbone if name.startswith("backbone.") else head).append(param)
    if heads is not None:
        head.extend(p for p in heads.parameters() if p.requires_grad)
    groups = [{"name": "backbone", "params": backbone, "lr": lr, "weight_decay": weight_decay}]
    if head:
        groups.append({"name": "head", "params": head, "lr": head_lr, "weight_decay": weight_decay})
    return groups


def build_optimizer(
    model: nn.Module, lr: float, head_lr: float, weight_decay: float = 1e-2, heads: nn.Module | None = None
) -> torch.optim.AdamW:
    """AdamW (decoupled weight decay, default 1e-2; METHODS.md section 1) over ``param_groups``."""
    return torch.optim.AdamW(param_groups(model, lr, head_lr, weight_decay, heads))
