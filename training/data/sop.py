"""Stanford Online Products in its native layout (METHODS.md section 3).

Layout (``root`` or ``root/Stanford_Online_Products``): ``Ebay_train.txt`` and ``Ebay_test.txt``, each with a
header line and rows "<image_id> <class_id> <super_class_id> <path>", images at ``root/<path>``.
Split: Ebay_train.txt (11,318 classes, 59,551 images) / Ebay_test.txt (11,316 classes, 60,502 images);
leave-one-out over the test set, Recall@1, 10, 100, 1000. Labels are the 1-based class ids minus 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data.base import EvalSplit, RetrievalDataset
from training.data.checks import check_count, check_files_exist, find_root, parse_int, read_table
from training.data.images import ImageFiles
from training.errors import DatasetError

NAME = "Stanford Online Products"


@dataclass(frozen=True)
class SopCounts:
    """Expected counts of the standard release."""

    train_images: int = 59_551
    train_classes: int = 11_318
    test_images: int = 60_502
    test_classes: int = 11_316


def is_sop(root: Path) -> bool:
    """Whether ``root`` looks like a Stanford Online Products folder."""
    return find_root(Path(root), "Ebay_train.txt", ("Stanford_Online_Products",)) is not None


def _read_split(base: Path, name: str) -> ImageFiles:
    path = base / name
    rows = read_table(path, 4, skip=1)
    return ImageFiles([base / r[3] for r in rows], [parse_int(r[1], path, "class_id") - 1 for r in rows])


def load_sop(root: Path, expected: SopCounts | None = SopCounts()) -> RetrievalDataset:
    """Read Stanford Online Products.

    Args:
        root: the dataset folder.
        expected: counts to check, or None to skip the checks.

    Raises:
        DatasetError: missing or malformed list files, train and test sharing classes, missing images, or a
            count differs from ``expected``.
    """
    base = find_root(Path(root), "Ebay_train.txt", ("Stanford_Online_Products",))
    if base is None:
        raise DatasetError(f"{root} is not a Stanford Online Products folder: no Ebay_train.txt in it")
    train, test = _read_split(base, "Ebay_train.txt"), _read_split(base, "Ebay_test.txt")
    if expected is not None:
        check_count(NAME, "train images", len(train), expected.train_images, base / "Ebay_train.txt")
        check_count(NAME, "train classes", train.num_classes, expected.train_classes, base / "Ebay_train.txt")
        check_count(NAME, "test images", len(test), expected.test_images, base / "Ebay_test.txt")
        check_count(NAME, "test classes", test.num_classes, expected.test_classes, base / "Ebay_test.txt")
    shared = set(train.labels.tolist()) & set(test.labels.tolist())
    if shared:
        raise DatasetError(f"{NAME} at {base}: {len(shared)} class ids appear in both Ebay_train.txt and Ebay_test.txt")
    check_files_exist(NAME, train, base)
    check_files_exist(NAME, test, base)
    return RetrievalDataset("sop", str(base), train, EvalSplit(test), (1, 10, 100, 1000))
