"""Fashion-MNIST from its idx files, as a class-disjoint retrieval benchmark.

Files (in ``root``, gzipped or not): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (Debian: /usr/share/datasets/fashion-mnist).
Split: train = the training file's images of classes 0-4 (30,000); test = the t10k file's images of classes
5-9 (5,000), leave-one-out, Recall@1, 2, 4, 8. Images are 28 x 28 grayscale, returned as RGB PIL images (the
encoder's transforms resize them).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.base import EvalSplit, RetrievalDataset
from training.data.checks import check_count
from training.data.images import ImageArray
from training.errors import DatasetError

NAME = "Fashion-MNIST"
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
TRAIN_CLASSES = (0, 1, 2, 3, 4)
TEST_CLASSES = (5, 6, 7, 8, 9)


@dataclass(frozen=True)
class FashionMnistCounts:
    """Expected counts of the standard release."""

    train_file: int = 60_000
    test_file: int = 10_000
    train_images: int = 30_000
    test_images: int = 5_000


def _find(root: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (root / name).is_file():
            return root / name
    return None


def is_fashion_mnist(root: Path) -> bool:
    """Whether ``root`` holds the Fashion-MNIST (or MNIST-format) idx files."""
    return _find(Path(root), "train-images-idx3-ubyte") is not None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read an idx file (optionally gzipped).

    Args:
        path: the file.
        magic: 2051 for images ((N, rows, cols) uint8), 2049 for labels ((N,) uint8).

    Raises:
        DatasetError: bad magic number or truncated data (names the file).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if len(data) < 8 or int.from_bytes(data[:4], "big") != magic:
        raise DatasetError(f"{path} is not an idx file with magic number {magic}")
    ndim = 3 if magic == IMAGES_MAGIC else 1
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    size = int(np.prod(dims))
    if len(data) - offset != size:
        raise DatasetError(f"{path}: header says {dims} ({size:,} bytes of data), file holds {len(data) - offset:,}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _read_pair(root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    img_path = _find(root, f"{prefix}-images-idx3-ubyte")
    lab_path = _find(root, f"{prefix}-labels-idx1-ubyte")
    if img_path is None or lab_path is None:
        raise DatasetError(f"{root} lacks {prefix}-images-idx3-ubyte(.gz) or {prefix}-labels-idx1-ubyte(.gz)")
    images, labels = read_idx(img_path, IMAGES_MAGIC), read_idx(lab_path, LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{img_path} holds {images.shape[0]:,} images but {lab_path} {labels.shape[0]:,} labels")
    return images, labels.astype(np.int64)


def load_fashion_mnist(root: Path, expected: FashionMnistCounts | None = FashionMnistCounts()) -> RetrievalDataset:
    """Read Fashion-MNIST and split it class-disjointly (train 0-4 from the train file, test 5-9 from t10k).

    Raises:
        DatasetError: missing or malformed files, or a count differs from ``expected``.
    """
    root = Path(root)
    train_x, train_y = _read_pair(root, "train")
    test_x, test_y = _read_pair(root, "t10k")
    keep_train, keep_test = np.isin(train_y, TRAIN_CLASSES), np.isin(test_y, TEST_CLASSES)
    if expected is not None:
        check_count(NAME, "images in the train file", len(train_y), expected.train_file, root)
        check_count(NAME, "images in the t10k file", len(test_y), expected.test_file, root)
        check_count(NAME, "train images (classes 0-4)", int(keep_train.sum()), expected.train_images, root)
        check_count(NAME, "test images (classes 5-9)", int(keep_test.sum()), expected.test_images, root)
    train = ImageArray(np.ascontiguousarray(train_x[keep_train]), train_y[keep_train], "fashion-mnist/train")
    test = ImageArray(np.ascontiguousarray(test_x[keep_test]), test_y[keep_test], "fashion-mnist/t10k")
    info = {"train_class_ids": list(TRAIN_CLASSES), "test_class_ids": list(TEST_CLASSES)}
    return RetrievalDataset("fashion-mnist", str(root), train, EvalSplit(test), (1, 2, 4, 8), info)
