"""Dataset loaders on tiny synthetic copies of the native layouts: splits, labels, count checks, clear errors."""

import os
from pathlib import Path

import numpy as np
import pytest
from synthetic_data import write_cars, write_cub, write_idx, write_inshop, write_png, write_sop, write_stripes_folder

from regis.errors import ConfigError
from training.data.cars import CarsCounts, load_cars
from training.data.cub import CubCounts, load_cub
from training.data.fashion_mnist import FashionMnistCounts, load_fashion_mnist
from training.data.images import TransformedImages
from training.data.inshop import InShopCounts, load_inshop
from training.data.registry import detect_format, open_dataset
from training.data.sop import SopCounts, load_sop
from training.errors import DatasetError

REAL_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def test_cub_split_and_counts(tmp_path):
    root = write_cub(tmp_path)  # classes of 2, 3, 2, 3 images
    ds = load_cub(root, CubCounts(images=10, classes=4, train_images=5, test_images=5))
    assert detect_format(root) == "cub"
    assert ds.train.labels.tolist() == [0, 0, 1, 1, 1] and ds.test.queries.labels.tolist() == [2, 2, 3, 3, 3]
    assert ds.test.leave_one_out and ds.recall_ks == (1, 2, 4, 8)
    assert ds.train.image(0).mode == "RGB"
    with pytest.raises(DatasetError, match=r"found 10 images, expected 11,788"):
        load_cub(root)  # the standard counts
    with pytest.raises(DatasetError, match=r"train images \(classes 0-1\), expected 6"):
        load_cub(root, CubCounts(images=10, classes=4, train_images=6, test_images=4))


def test_cub_missing_image_is_named(tmp_path):
    root = write_cub(tmp_path)
    victim = next((root / "CUB_200_2011" / "images").rglob("*.jpg"))
    victim.unlink()
    with pytest.raises(DatasetError, match=f"1 of .* missing .*{victim.name}"):
        load_cub(root, None)


def test_cars_split_and_counts(tmp_path):
    root = write_cars(tmp_path)  # classes of 2, 2, 3, 2 images
    ds = load_cars(root, CarsCounts(images=9, classes=4, train_images=4, test_images=5))
    assert detect_format(root) == "cars"
    assert ds.train.labels.tolist() == [0, 0, 1, 1] and ds.test.queries.labels.tolist() == [2, 2, 2, 3, 3]
    assert ds.train.paths[0].name == "000001.jpg"
    with pytest.raises(DatasetError, match=r"found 9 images, expected 16,185"):
        load_cars(root)


def test_sop_split_and_counts(tmp_path):
    root = write_sop(tmp_path)
    ds = load_sop(root, SopCounts(train_images=5, train_classes=2, test_images=6, test_classes=3))
    assert detect_format(root) == "sop"
    assert ds.train.labels.tolist() == [0, 0, 1, 1, 1] and sorted(set(ds.test.queries.labels.tolist())) == [2, 3, 4]
    assert ds.recall_ks == (1, 10, 100, 1000)
    with pytest.raises(DatasetError, match=r"found 5 train images, expected 59,551"):
        load_sop(root)
    with pytest.raises(DatasetError, match=r"found 3 test classes, expected 4"):
        load_sop(root, SopCounts(train_images=5, train_classes=2, test_images=6, test_classes=4))


def test_sop_malformed_row_is_named(tmp_path):
    root = write_sop(tmp_path)
    with open(root / "Ebay_test.txt", "a") as f:
        f.write("99 7 1\n")
    with pytest.raises(DatasetError, match=r"Ebay_test.txt line 8: expected 4 fields"):
        load_sop(root, None)


def test_inshop_query_gallery(tmp_path):
    root = write_inshop(tmp_path)
    counts = InShopCounts(images=9, train_images=4, train_classes=2, query_images=2, gallery_images=3, test_classes=2)
    ds = load_inshop(root, counts)
    assert detect_format(root) == "inshop"
    assert not ds.test.leave_one_out and ds.recall_ks == (1, 10, 20, 30)
    assert len(ds.train) == 4 and len(ds.test.queries) == 2 and len(ds.test.gallery) == 3
    assert ds.test.queries.labels.tolist() == [2, 3] and ds.test.gallery.labels.tolist() == [2, 3, 3]
    with pytest.raises(DatasetError, match=r"found 9 images, expected 52,712"):
        load_inshop(root)


def test_inshop_declared_count_mismatch(tmp_path):
    root = write_inshop(tmp_path)
    path = root / "Eval" / "list_eval_partition.txt"
    path.write_text("10\n" + path.read_text().split("\n", 1)[1])
    with pytest.raises(DatasetError, match="declares 10 images but 9 rows"):
        load_inshop(root, None)


def test_fashion_mnist_class_disjoint(tmp_path):
    write_idx(tmp_path, "train", [0, 1, 5, 4, 9, 2])
    write_idx(tmp_path, "t10k", [5, 0, 6, 7])
    ds = load_fashion_mnist(tmp_path, FashionMnistCounts(train_file=6, test_file=4, train_images=4, test_images=3))
    assert detect_format(tmp_path) == "fashion-mnist"
    assert ds.train.labels.tolist() == [0, 1, 4, 2] and ds.test.queries.labels.tolist() == [5, 6, 7]
    img = ds.test.queries.image(0)
    assert img.mode == "RGB" and img.size == (28, 28) and img.getpixel((3, 3)) == (100, 100, 100)
    with pytest.raises(DatasetError, match=r"found 6 images in the train file, expected 60,000"):
        load_fashion_mnist(tmp_path)


def test_fashion_mnist_bad_magic(tmp_path):
    write_idx(tmp_path, "train", [0, 1])
    write_idx(tmp_path, "t10k", [5])
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b")  # truncated gzip
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.gz"):
        load_fashion_mnist(tmp_path, None)


@pytest.mark.skipif(not REAL_FASHION_MNIST.is_dir(),
                    reason="Debian package dataset-fashion-mnist not installed (make system-deps installs it)")
def test_real_fashion_mnist_counts():
    ds = open_dataset(REAL_FASHION_MNIST)
    assert ds.name == "fashion-mnist" and len(ds.train) == 30_000 and len(ds.test.queries) == 5_000
    assert sorted(np.unique(ds.train.labels)) == [0, 1, 2, 3, 4]
    assert sorted(np.unique(ds.test.queries.labels)) == [5, 6, 7, 8, 9]


def test_imagefolder_splits(tmp_path):
    root = write_stripes_folder(tmp_path / "stripes", per_class=2)
    ds = open_dataset(root)
    assert ds.name == "imagefolder"
    assert ds.info["train_class_names"] == ["c0_h2", "c1_v2", "c2_d2"]
    assert sorted(set(ds.train.labels.tolist())) == [0, 1, 2]
    assert sorted(set(ds.test.queries.labels.tolist())) == [3, 4, 5]
    listed = tmp_path / "train.txt"
    listed.write_text("# training classes\nc5_d6\nc0_h2\n\n")
    ds = open_dataset(root, train_classes=listed)
    assert sorted(set(ds.train.labels.tolist())) == [0, 5] and len(ds.test.queries) == 8
    listed.write_text("c0_h2\nnope\n")
    with pytest.raises(DatasetError, match="nope"):
        open_dataset(root, train_classes=listed)
    with pytest.raises(ConfigError, match="imagefolder"):
        open_dataset(write_cub(tmp_path / "cub"), train_classes=listed)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        open_dataset(tmp_path / "absent")
    write_png(tmp_path / "a" / "1.png")
    (tmp_path / "b").mkdir()
    with pytest.raises(DatasetError, match=f"{os.sep}b holds no image files"):
        open_dataset(tmp_path)
    write_png(tmp_path / "b" / "1.png")
    with pytest.raises(DatasetError, match="at least 2"):
        open_dataset(tmp_path)


def test_corrupt_image_names_the_file(tmp_path):
    root = write_stripes_folder(tmp_path / "s", per_class=2)
    bad = root / "c0_h2" / "0.png"
    bad.write_bytes(b"not a png")
    ds = open_dataset(root)
    with pytest.raises(DatasetError, match="0.png"):
        ds.train.image(0)


def test_seeded_transform_is_reproducible_and_leaves_global_rng(tmp_path):
    import torch

    from regis.models.encoder import build_encoder
    from regis.models.transforms import train_transform

    ds = open_dataset(write_stripes_folder(tmp_path / "s", per_class=2))
    data = TransformedImages(ds.train, train_transform(build_encoder("vit-tiny-reg4-test", random_init=True).config))
    torch.manual_seed(123)
    x1, y1 = data[(0, 7)]
    after = torch.rand(1)
    torch.manual_seed(123)
    x2, _ = data[(0, 7)]
    assert torch.equal(x1, x2) and y1 == 0 and torch.equal(torch.rand(1), after)
    assert not torch.equal(data[(0, 8)][0], x1)
