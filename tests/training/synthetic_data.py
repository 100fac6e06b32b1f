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
