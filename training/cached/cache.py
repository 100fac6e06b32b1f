"""Backbone tokens of a labelled image set, cached: per image A views (view 0: the encoder's evaluation transform;
views 1..A-1: RandomResizedCrop(scale 0.5-1) + horizontal flip, torchvision.transforms.v2), each as the untrained
encoder's (m, F) unit-norm query tokens (``training.photos.features.encode_tokens``), float16."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from regis.models.encoder import RegisEncoder
from training.data.images import LabeledImages
from training.photos.features import encode_tokens


def augment_view(img, size: int, generator_seed: int):
    """One RandomResizedCrop(size, scale 0.5-1) + flip of a PIL image, seeded (PIL out, ``size`` x ``size``)."""
    from torchvision.transforms import v2 as T

    torch.manual_seed(generator_seed)
    return T.Compose([T.RandomResizedCrop(size, scale=(0.5, 1.0)), T.RandomHorizontalFlip()])(img)


def class_cache(encoder: RegisEncoder, images: LabeledImages, views: int = 1, seed: int = 0,
                batch: int = 64, progress: bool = True) -> dict:
    """{"tokens": (N, A, m, F) float16, "labels": (N,) int64, "config": {...}} for every image of ``images``."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    size = encoder.config.image_size
    rng = np.random.default_rng([seed, 5])
    out = []
    for i in tqdm(range(0, len(images), batch), desc="tokens", disable=not progress):
        idx = range(i, min(i + batch, len(images)))
        pil = [images.image(j) for j in idx]
        per_view = [encode_tokens(encoder, pil, batch)]
        for _ in range(1, views):
            per_view.append(encode_tokens(encoder, [augment_view(im, size, int(rng.integers(2**31))) for im in pil],
                                          batch))
        out.append(torch.stack(per_view, 1))
    return {"tokens": torch.cat(out), "labels": torch.as_tensor(np.asarray(images.labels), dtype=torch.int64),
            "config": {"views": views, "seed": seed, "encoder": encoder.config.model_dump(),
                       "seconds": round(time.perf_counter() - t0, 1)}}


def save(record: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
