"""A folder per class ("ImageFolder"), split class-disjointly into train and test.

``root/<class name>/<image files>`` (extensions of ``regis.images.decode.SUPPORTED_EXTENSIONS``, searched
recursively inside each class folder). Split: the classes named in a train-class list file (one name per
line; blank lines and ``#`` comments ignored) train, every other class test; without a list, the first half of
the class names in sorted order train, the rest test (deterministic). Test: leave-one-out, Recall@1, 2, 4, 8.
"""

from __future__ import annotations

from pathlib import Path

from training.data.base import EvalSplit, RetrievalDataset
from training.data.images import ImageFiles
from training.errors import DatasetError


def read_class_list(path: Path) -> list[str]:
    """Class names from a text file (one a line; blank lines and ``#`` comments ignored).

    Raises:
        DatasetError: the file is missing or lists no class.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"class list {path} does not exist")
    names = [line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    if not names:
        raise DatasetError(f"class list {path} names no class")
    return names


def scan_class_folders(root: Path) -> dict[str, list[Path]]:
    """Class name -> sorted image files, for every sub-folder of ``root``.

    Raises:
        DatasetError: ``root`` is not a folder, has no sub-folders, or a class folder holds no image.
    """
    from regis.images.decode import SUPPORTED_EXTENSIONS

    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    classes = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_EXTENSIONS)
        if not files:
            raise DatasetError(f"class folder {d} holds no image files ({', '.join(sorted(SUPPORTED_EXTENSIONS))})")
        classes[d.name] = files
    if not classes:
        raise DatasetError(f"{root} has no class sub-folders (expected root/<class>/<images>)")
    return classes


def load_image_folder(root: Path, train_classes: Path | None = None) -> RetrievalDataset:
    """Read a folder-per-class dataset and split its classes.

    Args:
        root: the folder of class folders.
        train_classes: a class list file naming the training classes; None for the sorted-half split.

    Returns:
        The dataset; labels are the indices of the class names in sorted order.

    Raises:
        DatasetError: see ``scan_class_folders``; a listed class has no folder; a split has fewer than 2 classes.
    """
    classes = scan_class_folders(root)
    names = sorted(classes)
    if train_classes is not None:
        listed = read_class_list(train_classes)
        unknown = sorted(set(listed) - set(names))
        if unknown:
            raise DatasetError(f"{train_classes} names classes with no folder in {root}: {unknown[:5]}")
        train_names = set(listed)
        rule = f"classes listed in {train_classes}"
    else:
        train_names = set(names[: len(names) // 2])
        rule = "first half of the sorted class names"
    test_names = [n for n in names if n not in train_names]
    if len(train_names) < 2 or len(test_names) < 2:
        raise DatasetError(
            f"{root}: the split ({rule}) gives {len(train_names)} train and {len(test_names)} test classes; "
            "each side needs at least 2"
        )
    label = {n: i for i, n in enumerate(names)}

    def files(which):
        pairs = [(p, label[n]) for n in names if n in which for p in classes[n]]
        return ImageFiles([p for p, _ in pairs], [y for _, y in pairs])

    info = {"split_rule": rule, "train_class_names": sorted(train_names), "test_class_names": test_names}
    return RetrievalDataset("imagefolder", str(root), files(train_names), EvalSplit(files(set(test_names))),
                            (1, 2, 4, 8), info)
