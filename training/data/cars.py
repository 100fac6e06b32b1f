"""Cars-196 in its native layout, class-disjoint split (METHODS.md section 3).

Layout (``root`` or ``root/cars196``): ``cars_annos.mat`` (the full-dataset annotations, a struct array with
``relative_im_path`` and ``class`` 1..196), images at ``root/<relative_im_path>`` (``car_ims/000001.jpg``).
Split: classes 0-97 (0-indexed) train, 8,054 images; classes 98-195 test, 8,131 images; leave-one-out,
Recall@1, 2, 4, 8. The ``test`` field of the annotations is ignored (that split is not class-disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.base import EvalSplit, RetrievalDataset
from training.data.checks import check_count, check_files_exist, find_root
from training.data.images import ImageFiles
from training.errors import DatasetError

NAME = "Cars-196"
ANNOTATIONS = "cars_annos.mat"


@dataclass(frozen=True)
class CarsCounts:
    """Expected counts of the standard release."""

    images: int = 16_185
    classes: int = 196
    train_images: int = 8_054
    test_images: int = 8_131


def is_cars(root: Path) -> bool:
    """Whether ``root`` looks like a Cars-196 folder."""
    return find_root(Path(root), ANNOTATIONS, ("cars196", "stanford_cars")) is not None


def read_cars_annotations(path: Path) -> tuple[list[str], list[int]]:
    """Relative image paths and 1-based class ids from ``cars_annos.mat``.

    Raises:
        DatasetError: unreadable file, no ``annotations`` struct, or missing fields.
    """
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path), squeeze_me=True)
    except Exception as exc:
        raise DatasetError(f"cannot read {path} as a MATLAB file ({type(exc).__name__})") from exc
    ann = mat.get("annotations")
    if ann is None or ann.dtype.names is None or not {"relative_im_path", "class"} <= set(ann.dtype.names):
        raise DatasetError(f"{path} has no 'annotations' struct with fields relative_im_path and class")
    ann = np.atleast_1d(ann)
    paths = [str(p) for p in ann["relative_im_path"]]
    classes = [int(c) for c in ann["class"]]
    return paths, classes


def load_cars(root: Path, expected: CarsCounts | None = CarsCounts()) -> RetrievalDataset:
    """Read Cars-196 and split its classes in half (first half train, second half test).

    Args:
        root: the dataset folder.
        expected: counts to check, or None to skip the checks.

    Raises:
        DatasetError: missing or malformed annotations, missing images, or a count differs from ``expected``.
    """
    base = find_root(Path(root), ANNOTATIONS, ("cars196", "stanford_cars"))
    if base is None:
        raise DatasetError(f"{root} is not a Cars-196 folder: no {ANNOTATIONS} in it or in cars196/")
    ann_path = base / ANNOTATIONS
    rel_paths, class_ids = read_cars_annotations(ann_path)
    classes = sorted(set(class_ids))
    if expected is not None:
        check_count(NAME, "images", len(rel_paths), expected.images, ann_path)
        check_count(NAME, "classes", len(classes), expected.classes, ann_path)
    half = len(classes) // 2
    index = {c: i for i, c in enumerate(classes)}
    labels = [index[c] for c in class_ids]
    train = [(base / p, y) for p, y in zip(rel_paths, labels, strict=True) if y < half]
    test = [(base / p, y) for p, y in zip(rel_paths, labels, strict=True) if y >= half]
    if expected is not None:
        check_count(NAME, f"train images (classes 0-{half - 1})", len(train), expected.train_images, ann_path)
        check_count(NAME, f"test images (classes {half}-{len(classes) - 1})", len(test), expected.test_images, ann_path)
    train_set = ImageFiles([p for p, _ in train], [y for _, y in train])
    test_set = ImageFiles([p for p, _ in test], [y for _, y in test])
    check_files_exist(NAME, train_set, base)
    check_files_exist(NAME, test_set, base)
    return RetrievalDataset("cars", str(base), train_set, EvalSplit(test_set), (1, 2, 4, 8))
