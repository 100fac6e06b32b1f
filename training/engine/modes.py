"""Putting an encoder in training mode, optionally with frozen BatchNorm statistics."""

from __future__ import annotations

from torch import nn


def set_train_mode(model: nn.Module, freeze_batchnorm: bool = True) -> int:
    """``model.train()``, then BatchNorm layers back to eval mode when ``freeze_batchnorm``.

    Frozen BatchNorm normalises with the pretrained running statistics and never updates them (its affine
    weights still train): the usual practice when fine-tuning a pretrained CNN for metric learning with small,
    class-balanced batches. Without it, EfficientNet-Lite0's ImageNet statistics drift toward the augmented
    training crops and retrieval on the test split drops even with a learning rate of ~0 (docs/RESULTS.md).
    ViTs have no BatchNorm: no effect.

    Returns:
        How many BatchNorm layers were frozen.
    """
    model.train()
    frozen = 0
    if freeze_batchnorm:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
                frozen += 1
    return frozen
