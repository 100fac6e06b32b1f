"""CUB-200-2011 in its native layout, class-disjoint split (METHODS.md section 3).

Layout (``root`` or ``root/CUB_200_2011``): ``images.txt`` ("<image id> <relative path>"),
``image_class_labels.txt`` ("<image id> <class id 1..200>"), ``images/<relative path>``.
Split: classes 0-99 (0-indexed) train, 5,864 images; classes 100-199 test, 5,924 images; leave-one-out,
Recall@1, 2, 4, 8. The official train/test split file is not used (it is not class-disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data.base import EvalSplit, RetrievalDataset
from training.data.checks import check_count, check_files_exist, find_root, parse_int, read_table
from training.data.images import ImageFiles
from training.errors import DatasetError

NAME = "CUB-200-2011"


@dataclass(frozen=True)
class CubCounts:
    """Expected counts of the standard release."""

    images: int = 11_788
    classes: int = 200
    train_images: int = 5_864
    test_images: int = 5_924


def is_cub(root: Path) -> bool:
    """Whether ``root`` looks like a CUB-200-2011 folder."""
    return find_root(Path(root), "image_class_labels.txt", ("CUB_200_2011",)) is not None


def load_cub(root: Path, expected: CubCounts | None = CubCounts()) -> RetrievalDataset:
    """Read CUB-200-2011 and split its classes in half (first half train, second half test).

    Args:
        root: the dataset folder.
        expected: counts to check, or None to skip the checks (a partial copy).

    Raises:
        DatasetError: a file is missing or malformed, ids disagree, or a count differs from ``expected``.
    """
    base = find_root(Path(root), "image_class_labels.txt", ("CUB_200_2011",))
    if base is None:
        raise DatasetError(f"{root} is not a CUB-200-2011 folder: no image_class_labels.txt in it or in CUB_200_2011/")
    images_txt, labels_txt = base / "images.txt", base / "image_class_labels.txt"
    paths = {parse_int(i, images_txt, "image id"): p for i, p in read_table(images_txt, 2)}
    labels = {
        parse_int(i, labels_txt, "image id"): parse_int(c, labels_txt, "class id") for i, c in read_table(labels_txt, 2)
    }
    if set(paths) != set(labels):
        raise DatasetError(f"{images_txt} and {labels_txt} list different image ids ({len(paths)} vs {len(labels)})")
    ids = sorted(paths)
    classes = sorted(set(labels.values()))
    if expected is not None:
        check_count(NAME, "images", len(ids), expected.images, images_txt)
        check_count(NAME, "classes", len(classes), expected.classes, labels_txt)
    half = len(classes) // 2
    train_classes = set(classes[:half])
    index = {c: i for i, c in enumerate(classes)}  # 0-indexed class ids
    train = [(base / "images" / paths[i], index[labels[i]]) for i in ids if labels[i] in train_classes]
    test = [(base / "images" / paths[i], index[labels[i]]) for i in ids if labels[i] not in train_classes]
    if expected is not None:
        check_count(NAME, f"train images (classes 0-{half - 1})", len(train), expected.train_images, labels_txt)
        check_count(
            NAME, f"test images (classes {half}-{len(classes) - 1})", len(test), expected.test_images, labels_txt
        )
    train_set = ImageFiles([p for p, _ in train], [c for _, c in train])
    test_set = ImageFiles([p for p, _ in test], [c for _, c in test])
    check_files_exist(NAME, train_set, base)
    check_files_exist(NAME, test_set, base)
    return RetrievalDataset("cub", str(base), train_set, EvalSplit(test_set), (1, 2, 4, 8))
