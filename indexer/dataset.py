"""Decoding image files in DataLoader worker processes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from regis.errors import ImageDecodeError
from regis.images.decode import decode_image
from regis.images.exif import exif_facts


class ImageFileDataset(Dataset):
    """Reads, hashes, decodes and transforms image files; a failure becomes an ``error`` entry, not an exception.

    Args:
        paths: absolute file paths.
        transform: PIL RGB image -> (3, H, W) float tensor.
        max_pixels: decompression-bomb limit (pixels).
        draft_size: JPEG draft decoding target (pixels), None to decode at full size.

    Items are dicts: ``index`` (int), ``tensor`` ((3, H, W) float32 or None), ``error`` (str or None),
    ``sha256`` (hex), ``width``/``height`` (pixels), ``bytes`` (file size), ``exif`` (``regis.images.exif``).
    """

    def __init__(self, paths: list[Path], transform: Callable, max_pixels: int, draft_size: int | None = None):
        self.paths = list(paths)
        self.transform = transform
        self.max_pixels = max_pixels
        self.draft_size = draft_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        item = {"index": i, "tensor": None, "error": None, "sha256": "", "width": 0, "height": 0, "bytes": 0,
                "exif": {}}
        try:
            data = Path(self.paths[i]).read_bytes()
        except OSError as exc:
            item["error"] = f"cannot read file: {exc.strerror or type(exc).__name__}"
            return item
        item["bytes"] = len(data)
        item["sha256"] = hashlib.sha256(data).hexdigest()
        try:
            decoded = decode_image(data, max_pixels=self.max_pixels, draft_size=self.draft_size)
            item["tensor"] = self.transform(decoded.image)
            item["width"], item["height"] = decoded.width, decoded.height
            item["exif"] = exif_facts(data)
        except ImageDecodeError as exc:
            item["error"] = str(exc)
        except Exception as exc:  # a transform failing on a strange image must not stop the build
            item["error"] = f"cannot preprocess image ({type(exc).__name__})"
        return item


def collate_items(items: list[dict]) -> dict:
    """Batch dataset items: ``tensors`` of the decodable ones, ``ok`` and ``failed`` item lists.

    ``tensors``: (b, 3, H, W) when they share one shape; else (the "aspect" frame) a list of b (3, H_i, W_i)
    tensors (``regis.models.batching.encode_grouped`` runs one forward per shape); None when none decoded."""
    ok = [it for it in items if it["tensor"] is not None]
    failed = [it for it in items if it["tensor"] is None]
    tensors = None
    if ok:
        shapes = {tuple(it["tensor"].shape) for it in ok}
        tensors = torch.stack([it["tensor"] for it in ok]) if len(shapes) == 1 else [it["tensor"] for it in ok]
    for it in ok:
        it["tensor"] = None  # the stacked copy is enough
    return {"tensors": tensors, "ok": ok, "failed": failed}
