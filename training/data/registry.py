"""Open a dataset by format name, or detect the format from the files in the folder."""

from __future__ import annotations

from pathlib import Path

from regis.errors import ConfigError
from training.data.base import RetrievalDataset
from training.errors import DatasetError

FORMATS = ("auto", "imagefolder", "cub", "cars", "sop", "inshop", "fashion-mnist")


def detect_format(root: Path) -> str:
    """The dataset format of ``root``: a native benchmark layout when its marker file is there, else imagefolder."""
    from training.data.cars import is_cars
    from training.data.cub import is_cub
    from training.data.fashion_mnist import is_fashion_mnist
    from training.data.inshop import is_inshop
    from training.data.sop import is_sop

    for name, test in (("fashion-mnist", is_fashion_mnist), ("cub", is_cub), ("cars", is_cars), ("sop", is_sop),
                       ("inshop", is_inshop)):
        if test(root):
            return name
    return "imagefolder"


def open_dataset(
    root: Path, data_format: str = "auto", train_classes: Path | None = None, check_counts: bool = True
) -> RetrievalDataset:
    """Read a dataset with its class-disjoint split (METHODS.md section 3).

    Args:
        root: the dataset folder.
        data_format: one of ``FORMATS``.
        train_classes: imagefolder only: a file naming the training classes.
        check_counts: check the image and class counts of the native benchmark layouts.

    Raises:
        ConfigError: unknown format, or a class list given for a native layout.
        DatasetError: the data on disk is missing or malformed.
    """
    root = Path(root).expanduser()
    if data_format not in FORMATS:
        raise ConfigError(f"data format must be one of {FORMATS}, got {data_format!r}")
    if not root.exists():
        raise DatasetError(f"dataset folder {root} does not exist")
    fmt = detect_format(root) if data_format == "auto" else data_format
    if train_classes is not None and fmt != "imagefolder":
        raise ConfigError(f"--train-classes applies to the imagefolder format; {root} is {fmt} with a fixed split")
    if fmt == "imagefolder":
        from training.data.imagefolder import load_image_folder

        return load_image_folder(root, train_classes)
    if fmt == "fashion-mnist":
        from training.data.fashion_mnist import FashionMnistCounts, load_fashion_mnist

        return load_fashion_mnist(root, FashionMnistCounts() if check_counts else None)
    if fmt == "cub":
        from training.data.cub import CubCounts, load_cub

        return load_cub(root, CubCounts() if check_counts else None)
    if fmt == "cars":
        from training.data.cars import CarsCounts, load_cars

        return load_cars(root, CarsCounts() if check_counts else None)
    if fmt == "sop":
        from training.data.sop import SopCounts, load_sop

        return load_sop(root, SopCounts() if check_counts else None)
    from training.data.inshop import InShopCounts, load_inshop

    return load_inshop(root, InShopCounts() if check_counts else None)
