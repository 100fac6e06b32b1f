"""Tiny synthetic datasets for the training tests, built in temporary folders (imported by the test modules;
not a conftest, so it cannot shadow the top-level tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def stripes(orientation: str, period: int, phase: int, colour: np.ndarray, size: int = 32) -> np.ndarray:
    """A (size, size, 3) uint8 image of stripes: the class is the orientation and period, not the colour."""
    yy, xx = np.mgrid[0:size, 0:size]
    coord = {"h": yy, "v": xx, "d": xx + yy}[orientation]
    wave = ((coord + phase) // period) % 2
    img = wave[..., None] * colour[None, None, :] + (1 - wave[..., None]) * (255 - colour[None, None, :])
    return img.astype(np.uint8)


STRIPE_CLASSES = [("h", 2), ("v", 2), ("d", 2), ("h", 6), ("v", 6), ("d", 6)]


def write_stripes_folder(root: Path, per_class: int = 8, seed: int = 0) -> Path:
    """root/<class>/<i>.png for the six stripe classes; returns root."""
    rng = np.random.default_rng(seed)
    for c, (orient, period) in enumerate(STRIPE_CLASSES):
        d = root / f"c{c}_{orient}{period}"
        d.mkdir(parents=True)
        for i in range(per_class):
            img = stripes(orient, period, int(rng.integers(0, 12)), rng.integers(0, 256, size=3))
            Image.fromarray(img).save(d / f"{i}.png")
    return root


def write_png(path: Path, value: int = 128) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(path)


def write_cub(root: Path, per_class: tuple[int, ...] = (2, 3, 2, 3)) -> Path:
    """A CUB-200-2011 layout (root/CUB_200_2011/...) with len(per_class) classes; returns root."""
    base = root / "CUB_200_2011"
    images, labels, i = [], [], 0
    for c, n in enumerate(per_class, start=1):
        for j in range(n):
            i += 1
            rel = f"{c:03d}.Bird_{c}/img_{j}.jpg"
            write_png(base / "images" / rel, 10 * c)
            images.append(f"{i} {rel}")
            labels.append(f"{i} {c}")
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    return root


def write_cars(root: Path, per_class: tuple[int, ...] = (2, 2, 3, 2)) -> Path:
    """A Cars-196 layout (cars_annos.mat + car_ims/) with len(per_class) classes; returns root."""
    from scipy.io import savemat

    rows = []
    for c, n in enumerate(per_class, start=1):
        for _ in range(n):
            rel = f"car_ims/{len(rows) + 1:06d}.jpg"
            write_png(root / rel, 20 * c)
            rows.append((rel, np.array([[c]], dtype=np.uint8), np.array([[len(rows) % 2]], dtype=np.uint8)))
    ann = np.empty((1, len(rows)), dtype=[("relative_im_path", "O"), ("class", "O"), ("test", "O")])
    for i, row in enumerate(rows):
        ann[0, i] = row
    savemat(str(root / "cars_annos.mat"), {"annotations": ann})
    return root


def write_sop(root: Path, train: tuple[int, ...] = (2, 3), test: tuple[int, ...] = (2, 2, 2)) -> Path:
    """A Stanford Online Products layout: classes 1..len(train) train, the next len(test) test; returns root."""
    header = "image_id class_id super_class_id path\n"
    image_id, class_id = 0, 0
    for name, sizes in (("Ebay_train.txt", train), ("Ebay_test.txt", test)):
        lines = [header]
        for n in sizes:
            class_id += 1
            for j in range(n):
                image_id += 1
                rel = f"bicycle_final/{class_id}_{j}.JPG"
                write_png(root / rel)
                lines.append(f"{image_id} {class_id} 1 {rel}\n")
        (root / name).write_text("".join(lines))
    return root


def write_inshop(root: Path) -> Path:
    """An In-Shop layout (Eval/list_eval_partition.txt, Img/img/...): 2 train items, 2 query/gallery items."""
    rows = [
        ("img/WOMEN/Dresses/id_00000001/01_1_front.jpg", "id_00000001", "train"),
        ("img/WOMEN/Dresses/id_00000001/01_2_side.jpg", "id_00000001", "train"),
        ("img/WOMEN/Dresses/id_00000002/01_1_front.jpg", "id_00000002", "train"),
        ("img/WOMEN/Dresses/id_00000002/01_2_side.jpg", "id_00000002", "train"),
        ("img/MEN/Denim/id_00000003/01_1_front.jpg", "id_00000003", "query"),
        ("img/MEN/Denim/id_00000003/01_2_side.jpg", "id_00000003", "gallery"),
        ("img/MEN/Denim/id_00000004/01_1_front.jpg", "id_00000004", "query"),
        ("img/MEN/Denim/id_00000004/01_2_side.jpg", "id_00000004", "gallery"),
        ("img/MEN/Denim/id_00000004/01_3_back.jpg", "id_00000004", "gallery"),
    ]
    for rel, _, _ in rows:
        write_png(root / "Img" / rel)
    lines = [f"{len(rows)}\n", "image_name item_id evaluation_status\n"] + [f"{r}   {i}   {s}\n" for r, i, s in rows]
    (root / "Eval").mkdir(parents=True, exist_ok=True)
    (root / "Eval" / "list_eval_partition.txt").write_text("".join(lines))
    return root


def write_idx(root: Path, prefix: str, labels: list[int], size: int = 28) -> None:
    """Fashion-MNIST idx files (gzipped) for the given labels; pixel value = 20 * label."""
    import gzip

    root.mkdir(parents=True, exist_ok=True)
    n = len(labels)
    pixels = np.repeat(np.array(labels, dtype=np.uint8)[:, None, None] * 20, size * size, axis=1)
    with gzip.open(root / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write((2051).to_bytes(4, "big") + n.to_bytes(4, "big") + size.to_bytes(4, "big") + size.to_bytes(4, "big"))
        f.write(pixels.astype(np.uint8).tobytes())
    with gzip.open(root / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write((2049).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes(labels))
