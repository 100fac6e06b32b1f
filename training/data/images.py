"""Labelled image sets: image files on disk or an in-memory uint8 array, plus the torch Dataset that transforms them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from regis.errors import ImageDecodeError
from training.errors import DatasetError


class LabeledImages:
    """A sequence of images with integer class labels.

    Subclasses implement ``__len__``, ``image`` (an RGB PIL image), ``describe`` (a path or an id for messages)
    and ``subset``. ``labels`` is an (N,) int64 numpy array of class ids (not necessarily contiguous).
    """

    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def image(self, i: int) -> Image.Image:
        """The ``i``-th image as RGB PIL."""
        raise NotImplementedError

    def describe(self, i: int) -> str:
        """What to name in an error about image ``i``."""
        raise NotImplementedError

    def subset(self, indices: Sequence[int]) -> LabeledImages:
        """The images at ``indices``, in that order."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        """How many distinct labels the set holds."""
        return int(np.unique(self.labels).size)


class ImageFiles(LabeledImages):
    """Image files with labels.

    Args:
        paths: image file paths.
        labels: one int class id per path.

    Raises:
        DatasetError: ``paths`` and ``labels`` differ in length.
    """

    def __init__(self, paths: Sequence[Path], labels: Sequence[int]):
        if len(paths) != len(labels):
            raise DatasetError(f"{len(paths)} image paths but {len(labels)} labels")
        self.paths = [Path(p) for p in paths]
        self.labels = np.asarray(labels, dtype=np.int64).reshape(-1)

    def image(self, i: int) -> Image.Image:
        """Decode file ``i`` to RGB (``regis.images.decode``).

        Raises:
            DatasetError: the file is missing or not a decodable image (names the file).
        """
        from regis.images.decode import decode_image

        try:
            return decode_image(self.paths[i]).image
        except ImageDecodeError as exc:
            raise DatasetError(f"{self.paths[i]}: {exc}") from exc

    def describe(self, i: int) -> str:
        return str(self.paths[i])

    def subset(self, indices: Sequence[int]) -> ImageFiles:
        return ImageFiles([self.paths[i] for i in indices], self.labels[list(indices)])

    def missing_files(self) -> list[Path]:
        """Paths that are not regular files."""
        return [p for p in self.paths if not p.is_file()]


class ImageArray(LabeledImages):
    """Images held in memory as uint8 pixels (e.g. Fashion-MNIST).

    Args:
        pixels: (N, H, W) grayscale or (N, H, W, 3) RGB uint8.
        labels: (N,) int class ids.
        name: what ``describe`` prefixes the index with.

    Raises:
        DatasetError: wrong dtype, shape, or a length mismatch.
    """

    def __init__(self, pixels: np.ndarray, labels: Sequence[int], name: str = "image"):
        if pixels.dtype != np.uint8 or pixels.ndim not in (3, 4) or (pixels.ndim == 4 and pixels.shape[-1] != 3):
            raise DatasetError(f"pixels must be uint8 (N, H, W) or (N, H, W, 3), got {pixels.dtype} {pixels.shape}")
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if labels.shape[0] != pixels.shape[0]:
            raise DatasetError(f"{pixels.shape[0]} images but {labels.shape[0]} labels")
        self.pixels = pixels
        self.labels = labels
        self.name = name

    def image(self, i: int) -> Image.Image:
        return Image.fromarray(self.pixels[i]).convert("RGB")

    def describe(self, i: int) -> str:
        return f"{self.name}[{i}]"

    def subset(self, indices: Sequence[int]) -> ImageArray:
        idx = np.asarray(list(indices), dtype=np.int64)
        return ImageArray(self.pixels[idx], self.labels[idx], self.name)


class TransformedImages:
    """A map-style torch dataset: index -> (transformed image tensor, label).

    An index is an int, or ``(int, seed)``: with a seed the transform runs under ``torch.manual_seed(seed)``
    in a forked RNG, so a random augmentation is reproducible from the sampler alone (exact resume) and the
    caller's global RNG is left untouched.

    Args:
        images: the labelled images.
        transform: PIL RGB -> (3, H, W) float32 tensor (``regis.models.transforms``).

    Items: ``(tensor (3, H, W) float32, label int)``.
    """

    def __init__(self, images: LabeledImages, transform: Callable):
        self.images = images
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int | tuple[int, int]):
        import torch

        seed = None
        if isinstance(index, tuple):
            index, seed = index
        img = self.images.image(int(index))
        if seed is None:
            tensor = self.transform(img)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                tensor = self.transform(img)
        return tensor, int(self.images.labels[int(index)])
