"""The A views of a DMCAC query (METHODS.md section 2): view 0 = the original image under the evaluation
transform, views 1..A-1 = RandomResizedCrop + horizontal flip + RandAugment(2, 9), each then normalised with the
backbone's mean/std. Every view of a query is drawn from one seed, so the batches of a run repeat exactly
(resume)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from regis.errors import ConfigError
from training.data.images import LabeledImages


def augmented_view_transform(config, scale: tuple[float, float] = (0.2, 1.0), num_ops: int = 2,
                             magnitude: int = 9) -> Callable:
    """RandomResizedCrop(image_size, ``scale``) + horizontal flip + RandAugment(``num_ops``, ``magnitude``) +
    ToTensor + Normalize(mean, std).

    Args:
        config: the encoder's ``EncoderConfig`` (image size, interpolation, mean, std).

    Returns:
        A callable PIL.Image (RGB) -> (3, image_size, image_size) float32 tensor.
    """
    from torchvision import transforms as T
    from torchvision.transforms import InterpolationMode

    return T.Compose([
        T.RandomResizedCrop(config.image_size, scale=scale, interpolation=InterpolationMode(config.interpolation)),
        T.RandomHorizontalFlip(),
        T.RandAugment(num_ops=num_ops, magnitude=magnitude),
        T.ToTensor(),
        T.Normalize(config.mean, config.std),
    ])


class MultiViewImages:
    """A map-style torch dataset of queries: ``(index, seed)`` -> (views, label, index).

    Args:
        images: the labelled training images.
        labels: (N,) int64 contiguous training-class ids of ``images`` (0..C_train-1), returned as the label.
        views: A >= 1.
        original: the evaluation transform (view 0).
        augment: the augmentation of views 1..A-1 (``augmented_view_transform``).

    Items: ``(views (A, 3, H, W) float32, label int, index int)``. Views 1..A-1 are drawn one after the other
    under ``torch.manual_seed(seed)`` in a forked RNG (the caller's global RNG is left untouched).

    Raises:
        ConfigError: views < 1 or labels of the wrong length.
    """

    def __init__(self, images: LabeledImages, labels: np.ndarray, views: int, original: Callable, augment: Callable):
        if views < 1:
            raise ConfigError(f"views A must be >= 1, got {views}")
        if len(labels) != len(images):
            raise ConfigError(f"{len(labels)} labels for {len(images)} images")
        self.images, self.labels, self.views = images, np.asarray(labels, dtype=np.int64), views
        self.original, self.augment = original, augment

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = int(item[0]), int(item[1])
        img = self.images.image(index)
        out = [self.original(img)]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out.extend(self.augment(img) for _ in range(self.views - 1))
        return torch.stack(out), int(self.labels[index]), index
