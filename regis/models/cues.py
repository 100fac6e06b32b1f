"""Cue tokens for backbones without CLS or register tokens (CNNs).

A CNN gives an h x w feature map and no prefix tokens. regis defines its R + 1 cue tokens without any
training, so that every backbone yields the same 10-token layout: cue 0 is the global average pool (the
CNN's "CLS"), cues 1..R are part tokens computed from the local features by one of:

- ``grid`` (the default, chosen by measurement, see README): the mean of each cell of a sqrt(R) x sqrt(R)
  spatial grid (R must be a square: 4 -> quadrants).
- ``kmeans``: centroids of a cosine k-means (R clusters) over the h*w local features, initialised by
  farthest-point sampling from the most salient (largest-norm) feature; a fixed number of Lloyd steps.
- ``attention``: attention pooling, one softmax(cos / tau) map per query, the queries being the same
  farthest-point seeds as ``kmeans`` (a soft, one-step version of it).

``pooling`` says how the global token and the ``grid`` cells pool their features: ``mean`` (the average, what
indexes without this choice used) or ``gem`` (generalised mean, (mean x^p)^(1/p) with p = ``GEM_P`` = 3;
Radenovic, Tolias & Chum, TPAMI 2019): it leans toward the strongest activations, the usual pooling of CNN
features for instance retrieval. Chosen by measurement: docs/RESULTS.md, "Hard cases".

The ROI rule (buddy patch + N x N window) is then applied to these cues exactly as for a ViT. Which method
is the default is decided by measurement: ``scripts/eval_instance_retrieval.py --cue-method ...`` (README).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from regis.errors import ConfigError
from regis.models.config import CUE_METHODS, CUE_POOLINGS, GEM_EPS, GEM_P


def farthest_point_seeds(feats: torch.Tensor, r: int) -> torch.Tensor:
    """Indices of R diverse local features: start at the largest-norm one, then repeatedly take the feature
    least similar (cosine) to every seed chosen so far.

    Args:
        feats: (B, P, D) float local features.
        r: number of seeds, 1 <= r <= P.

    Returns:
        (B, r) int64 indices into P.
    """
    unit = F.normalize(feats.detach().float(), dim=-1)
    first = feats.detach().float().norm(dim=-1).argmax(dim=-1)  # (B,)
    seeds = [first]
    best_sim = torch.einsum("bpd,bd->bp", unit, unit[torch.arange(unit.shape[0]), first])
    for _ in range(1, r):
        nxt = best_sim.argmin(dim=-1)
        seeds.append(nxt)
        sim = torch.einsum("bpd,bd->bp", unit, unit[torch.arange(unit.shape[0]), nxt])
        best_sim = torch.maximum(best_sim, sim)
    return torch.stack(seeds, dim=1)


def _gather(feats: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(feats, 1, idx[..., None].expand(-1, -1, feats.shape[-1]))


def kmeans_parts(feats: torch.Tensor, r: int, steps: int = 10) -> torch.Tensor:
    """Cosine k-means centroids of the local features.

    Args:
        feats: (B, P, D) float local features.
        r: number of clusters.
        steps: Lloyd iterations.

    Returns:
        (B, r, D) centroids: means of the raw features assigned to each cluster (an empty cluster keeps its
        previous centroid). Differentiable through the means, not through the assignments.
    """
    centres = _gather(feats, farthest_point_seeds(feats, r))
    unit = F.normalize(feats.detach().float(), dim=-1)
    for _ in range(steps):
        assign = torch.einsum("bpd,brd->bpr", unit, F.normalize(centres.detach().float(), dim=-1)).argmax(-1)
        onehot = F.one_hot(assign, r).to(feats.dtype)  # (B, P, r)
        counts = onehot.sum(dim=1)  # (B, r)
        sums = torch.einsum("bpr,bpd->brd", onehot, feats)
        means = sums / counts.clamp(min=1)[..., None]
        centres = torch.where(counts[..., None] > 0, means, centres)
    return centres


def attention_parts(feats: torch.Tensor, r: int, tau: float = 0.1) -> torch.Tensor:
    """Attention pooling of the local features around R farthest-point seeds.

    Args:
        feats: (B, P, D) float local features.
        r: number of part tokens.
        tau: softmax temperature on cosine similarity.

    Returns:
        (B, r, D) weighted means of the raw features.
    """
    unit = F.normalize(feats, dim=-1)
    queries = _gather(unit, farthest_point_seeds(feats, r))
    attn = torch.softmax(torch.einsum("brd,bpd->brp", queries, unit) / tau, dim=-1)
    return torch.einsum("brp,bpd->brd", attn, feats)


def gem_pool(feats: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Generalised-mean pooling (mean over ``dim`` of max(x, eps)^p)^(1/p), p = ``GEM_P``; same dtype."""
    return feats.clamp(min=GEM_EPS).pow(GEM_P).mean(dim=dim, keepdim=keepdim).pow(1.0 / GEM_P)


def grid_parts(feats: torch.Tensor, grid: tuple[int, int], r: int, pooling: str = "mean") -> torch.Tensor:
    """Mean (or GeM, ``pooling="gem"``) of each cell of a sqrt(R) x sqrt(R) spatial partition of the feature map.

    Raises:
        ConfigError: R is not a perfect square or the map is smaller than the partition.
    """
    side = math.isqrt(r)
    h, w = grid
    if side * side != r:
        raise ConfigError(f"cue method 'grid' needs a square number of parts, got R = {r}")
    if h < side or w < side:
        raise ConfigError(f"a {h} x {w} feature map cannot be split into {side} x {side} cells")
    fmap = feats.transpose(1, 2).reshape(feats.shape[0], feats.shape[2], h, w)
    if pooling == "gem":
        pooled = F.adaptive_avg_pool2d(fmap.clamp(min=GEM_EPS).pow(GEM_P), side).pow(1.0 / GEM_P)
    else:
        pooled = F.adaptive_avg_pool2d(fmap, side)  # (B, D, side, side)
    return pooled.flatten(2).transpose(1, 2)


def cnn_cues(
    feats: torch.Tensor, grid: tuple[int, int], r: int, method: str = "kmeans", pooling: str = "mean"
) -> torch.Tensor:
    """The R + 1 cue tokens of a CNN feature map: global pool, then R part tokens.

    Args:
        feats: (B, P, D) float local features, row-major on ``grid``.
        grid: (h, w), h * w == P.
        r: number of part tokens (the "registers"), 0 <= r <= P.
        method: one of ``CUE_METHODS``.
        pooling: one of ``CUE_POOLINGS``: how the global token and the ``grid`` cells pool (``kmeans`` and
            ``attention`` parts are means / weighted means either way).

    Returns:
        (B, r + 1, D) cue tokens, not normalised.

    Raises:
        ConfigError: unknown method or pooling, or r out of range.
    """
    if method not in CUE_METHODS:
        raise ConfigError(f"unknown cue method {method!r}; choose one of {CUE_METHODS}")
    if pooling not in CUE_POOLINGS:
        raise ConfigError(f"unknown cue pooling {pooling!r}; choose one of {CUE_POOLINGS}")
    if not 0 <= r <= feats.shape[1]:
        raise ConfigError(f"R = {r} part tokens cannot come from {feats.shape[1]} local features")
    gap = gem_pool(feats, 1, keepdim=True) if pooling == "gem" else feats.mean(dim=1, keepdim=True)
    if r == 0:
        return gap
    if method == "kmeans":
        parts = kmeans_parts(feats, r)
    elif method == "attention":
        parts = attention_parts(feats, r)
    else:
        parts = grid_parts(feats, grid, r, pooling)
    return torch.cat([gap, parts], dim=1)
