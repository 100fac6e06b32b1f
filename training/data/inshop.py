"""In-Shop Clothes Retrieval (DeepFashion) in its native layout (METHODS.md section 3).

Layout: ``list_eval_partition.txt`` in ``root`` or ``root/Eval`` (first line: the image count, second line:
the header "image_name item_id evaluation_status", then rows "img/.../x.jpg id_00000001 train|query|gallery");
images relative to ``root`` or ``root/Img``. Split: train 3,997 items / 25,882 images; test = query (14,218)
against gallery (12,612), 3,985 items; Recall@1, 10, 20, 30. Labels: item ids numbered in sorted order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data.base import EvalSplit, RetrievalDataset
from training.data.checks import check_count, check_files_exist, find_root, parse_int, read_table
from training.data.images import ImageFiles
from training.errors import DatasetError

NAME = "In-Shop"
PARTITION = "list_eval_partition.txt"
STATUSES = ("train", "query", "gallery")


@dataclass(frozen=True)
class InShopCounts:
    """Expected counts of the standard release."""

    images: int = 52_712
    train_images: int = 25_882
    train_classes: int = 3_997
    query_images: int = 14_218
    gallery_images: int = 12_612
    test_classes: int = 3_985


def is_inshop(root: Path) -> bool:
    """Whether ``root`` looks like an In-Shop folder."""
    return find_root(Path(root), PARTITION, ("Eval",)) is not None


def _image_base(root: Path, list_dir: Path, first: str) -> Path:
    for cand in (root, root / "Img", list_dir, list_dir.parent / "Img"):
        if (cand / first).is_file():
            return cand
    raise DatasetError(f"{NAME}: cannot find the image {first} under {root} or {root / 'Img'}")


def load_inshop(root: Path, expected: InShopCounts | None = InShopCounts()) -> RetrievalDataset:
    """Read In-Shop: the train split, and query vs gallery for the test.

    Args:
        root: the dataset folder.
        expected: counts to check, or None to skip the checks.

    Raises:
        DatasetError: missing or malformed partition file, unknown statuses, missing images, query items absent
            from the gallery, or a count differs from ``expected``.
    """
    root = Path(root)
    list_dir = find_root(root, PARTITION, ("Eval",))
    if list_dir is None:
        raise DatasetError(f"{root} is not an In-Shop folder: no {PARTITION} in it or in Eval/")
    path = list_dir / PARTITION
    with open(path, encoding="utf-8") as f:
        declared = parse_int(f.readline().strip(), path, "image count (first line)")
    rows = read_table(path, 3, skip=2)
    if len(rows) != declared:
        raise DatasetError(f"{path}: first line declares {declared:,} images but {len(rows):,} rows follow")
    bad = sorted({r[2] for r in rows} - set(STATUSES))
    if bad:
        raise DatasetError(f"{path}: unknown evaluation_status values {bad}; expected {STATUSES}")
    if expected is not None:
        check_count(NAME, "images", len(rows), expected.images, path)
    if not rows:
        raise DatasetError(f"{path} lists no images")
    base = _image_base(root, list_dir, rows[0][0])
    items = {item: i for i, item in enumerate(sorted({r[1] for r in rows}))}
    split = {s: ImageFiles([base / r[0] for r in rows if r[2] == s], [items[r[1]] for r in rows if r[2] == s])
             for s in STATUSES}
    train, query, gallery = split["train"], split["query"], split["gallery"]
    if expected is not None:
        check_count(NAME, "train images", len(train), expected.train_images, path)
        check_count(NAME, "train items (classes)", train.num_classes, expected.train_classes, path)
        check_count(NAME, "query images", len(query), expected.query_images, path)
        check_count(NAME, "gallery images", len(gallery), expected.gallery_images, path)
        check_count(NAME, "query/gallery items (classes)", query.num_classes, expected.test_classes, path)
    if set(train.labels.tolist()) & set(query.labels.tolist()):
        raise DatasetError(f"{path}: some items are in both the train and the query split")
    lonely = set(query.labels.tolist()) - set(gallery.labels.tolist())
    if lonely:
        raise DatasetError(f"{path}: {len(lonely)} query items have no gallery image")
    for s in STATUSES:
        check_files_exist(NAME, split[s], base)
    return RetrievalDataset("inshop", str(root), train, EvalSplit(query, gallery), (1, 10, 20, 30))
