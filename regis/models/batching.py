"""Batches of images of different shapes (the "aspect" frame): group by shape, encode each group, keep the order.

The "aspect" frame (``regis.models.geometry``) gives each image a (3, H, W) input of its own shape, so a batch of
them cannot be one tensor. Each group of equal shapes runs as one batch through the encoder; nothing is padded,
so no padded patch can reach a cue, a ROI window or a GeM pool. Same-shape inputs (every other frame) are one
group: the result is the encoder's own, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shape_groups(images: torch.Tensor | Sequence[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Split images into batches of one shape each.

    Args:
        images: a (B, 3, H, W) tensor, or a sequence of (3, H_i, W_i) tensors.

    Returns:
        [(positions in ``images``, (b, 3, H, W) stacked tensor)], in order of each shape's first image.
    """
    if isinstance(images, torch.Tensor):
        return [(list(range(images.shape[0])), images)] if images.shape[0] else []
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(tuple(img.shape), []).append(i)
    return [(pos, torch.stack([images[i] for i in pos])) for pos in groups.values()]


def encode_grouped(encoder, images: torch.Tensor | Sequence[torch.Tensor], query: bool = False,
                   autocast: bool = True) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """``encoder.encode_with_buddies`` (or ``encode_query_with_buddies`` with ``query``) over images of any
    shapes, one forward per shape.

    Args:
        encoder: a ``RegisEncoder`` (or a copy with the same methods).
        images: a (B, 3, H, W) tensor or a sequence of (3, H_i, W_i) float tensors, normalised.

    Returns:
        tokens (B, T, D) float32 unit-norm (B, m, D with ``query``), buddies (B, R + 1) int64, both in the input
        order, and the grid the buddies index: the encoder's for square inputs; for an "aspect" CNN the
        index's nominal grid (``regis.models.geometry.nominal_grid``): each image's buddies index its own
        grid, ``regis.models.geometry.buddy_grid`` (of its size) gives it.

    Raises:
        ConfigError: images of several shapes for an encoder whose inputs are squares (a transform mismatch).
    """
    from regis.errors import ConfigError
    from regis.models.geometry import is_aspect, nominal_grid

    groups = shape_groups(images)
    if not groups:
        raise ConfigError("no images to encode")
    aspect = is_aspect(encoder.config)
    if len(groups) > 1 and not aspect:
        raise ConfigError(f"images of {len(groups)} shapes for an encoder with square inputs "
                          f"(frame {encoder.config.frame!r})")
    run = encoder.encode_query_with_buddies if query else encoder.encode_with_buddies
    n = sum(len(pos) for pos, _ in groups)
    tokens = buddies = None
    grid = None
    for pos, batch in groups:
        t, b, grid = run(batch, autocast)
        if tokens is None:
            tokens = t.new_empty((n, *t.shape[1:]))
            buddies = b.new_empty((n, *b.shape[1:]))
        index = torch.as_tensor(pos, device=t.device)
        tokens[index] = t
        buddies[index.to(b.device)] = b
    return tokens, buddies, (nominal_grid(encoder.config) if aspect else grid)
