"""Embedding labelled images with an encoder (the eval transform, no gradient)."""

from __future__ import annotations

import numpy as np
import torch

from regis.errors import ConfigError
from training.data.images import LabeledImages, TransformedImages


def subsample(images: LabeledImages, max_images: int | None, seed: int = 0) -> LabeledImages:
    """A seeded uniform random subset of ``max_images`` images (kept in their original order); all if None.

    Raises:
        ConfigError: ``max_images`` < 2.
    """
    if max_images is None or max_images >= len(images):
        return images
    if max_images < 2:
        raise ConfigError(f"an evaluation subset needs at least 2 images, got {max_images}")
    idx = np.sort(np.random.default_rng(seed).choice(len(images), size=max_images, replace=False))
    return images.subset(idx.tolist())


def embed_images(
    encoder,
    images: LabeledImages,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool = False,
    desc: str = "embed",
    query: bool = False,
) -> torch.Tensor:
    """Tokens of every image under ``eval_transform(encoder.config)``.

    Args:
        encoder: a ``regis.models.encoder.RegisEncoder`` (put in eval mode here; the caller restores train mode).
        images: the images.
        batch_size: images per forward pass.
        num_workers: DataLoader worker processes.
        progress: show a tqdm bar.
        desc: the bar's label.
        query: the query's tokens (``RegisEncoder.encode_query``: (N, m, D), m = ``query_tokens_per_image``, the
            first T the index's), instead of the index's.

    Returns:
        (N, T, D) float32 unit-norm tokens on the encoder's device, in the order of ``images``.
    """
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from regis.models.transforms import eval_transform

    encoder.eval()
    data = TransformedImages(images, eval_transform(encoder.config))
    loader = DataLoader(
        data, batch_size=batch_size, shuffle=False, num_workers=num_workers, generator=torch.Generator().manual_seed(0)
    )
    encode = encoder.encode_query if query else encoder.encode
    out = [encode(x) for x, _ in tqdm(loader, desc=desc, disable=not progress, leave=False)]
    return torch.cat(out)
