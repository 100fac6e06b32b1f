"""The training-only heads of DMCAC (METHODS.md section 2); dropped from the exported encoder."""

from __future__ import annotations

import math

import torch
from torch import nn


class CrossAttentionClassifier(nn.Module):
    """CAC: single-head cross-attention from the query embedding to its retrieved context, then a linear
    classifier over the training classes.

        Q = W_q z, K = W_k Z_S, V = W_v Z_S (W_* in R^{F x F}, no bias);
        z' = softmax(Q K^T / sqrt(F)) V;  logits = W_c z' + b_c.

    Args:
        dim: F, the embedding width.
        num_classes: C_train, the number of training classes.
    """

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.dim = dim
        self.w_q = nn.Linear(dim, dim, bias=False)
        self.w_k = nn.Linear(dim, dim, bias=False)
        self.w_v = nn.Linear(dim, dim, bias=False)
        self.classifier = nn.Linear(dim, num_classes)

    def attend(self, z: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """z' = softmax(Q K^T / sqrt(F)) V.

        Args:
            z: (B, F) query embeddings (view 0).
            context: (B, T, F) context embeddings Z_S (an expanded view of one (T, F) context, as in full
                retrieval, is projected once).
            mask: (B, T) bool, True = real context entry; each row needs at least one.

        Returns:
            (B, F) attended embeddings.
        """
        q = self.w_q(z)[:, None, :]  # (B, 1, F)
        if context.shape[0] > 1 and context.stride(0) == 0:  # one context shared by the batch (full retrieval)
            k = self.w_k(context[0]).expand(context.shape[0], -1, -1)
            v = self.w_v(context[0]).expand(context.shape[0], -1, -1)
        else:
            k = self.w_k(context)
            v = self.w_v(context)
        logits = (q @ k.transpose(1, 2)) / math.sqrt(self.dim)  # (B, 1, T)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        return (torch.softmax(logits, dim=-1) @ v)[:, 0]

    def forward(self, z: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, F), (B, T, F), (B, T) -> (B, C_train) logits."""
        return self.classifier(self.attend(z, context, mask))
