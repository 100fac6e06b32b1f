"""The evaluation set of the trained token head (issue 22): queries of six kinds on the held-out test photos of the
Debian corpus, against a gallery of near duplicates.

Gallery, per test photo: a scene gets the 16 items of ``regis.data.hard_cases.gallery_items`` (the photo, its
3 x 3 tiles, 4 overlapping corner crops, 2 burst frames); an object photo (a cut-out or a close-up) gets itself.

Queries (``KINDS``), one of each per photo and seed (the scene kinds only for scenes):

- ``easy``, ``hard``, ``crops``: ``training.photos.edits.easy_edit`` / ``hard_edit`` / ``crop_edit`` of the whole
  photo; right answers: every gallery item of the photo that shows at least 75 % of the query's region (copy
  detection: which image is this a copy of);
- ``tiles``: one 3 x 3 tile, shifted up to 6 % and rescaled 95-105 %, colour +-20 %, JPEG q40-85;
- ``views``: 60-90 % of the photo, rotated up to 10 degrees, colour +-20 %, downscaled to 50-90 %, JPEG q40-85;
- ``bursts``: a new frame of the same scene: an 85-95 % crop at another offset, exposure +-10 %, rotated up to 2
  degrees, JPEG q60-90;
  for these three the right answers follow ``regis.data.hard_cases.is_relevant`` (the item shows >= 75 % of the
  query's region and the region fills >= 30 % of the item): a tile is answered by its own tile, a view or a burst
  by the photo, its burst frames and the corner crops it fills.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from regis.data.augment import color_jitter
from regis.data.hard_cases import Item, gallery_items, is_relevant, tile_boxes
from regis.images.decode import decode_image
from training.photos import edits

KINDS = ("easy", "hard", "crops", "tiles", "views", "bursts")
SCENE_KINDS = ("tiles", "views", "bursts")
CONTAINMENT = 0.75


def contains(query: Item, item: Item) -> bool:
    """Same photo and ``item`` shows at least ``CONTAINMENT`` of the query's region."""
    if query.photo != item.photo:
        return False
    q, g = query.box, item.box
    inter = max(0.0, min(q[2], g[2]) - max(q[0], g[0])) * max(0.0, min(q[3], g[3]) - max(q[1], g[1]))
    return inter >= CONTAINMENT * (q[2] - q[0]) * (q[3] - q[1])


def tile_query(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, edits.Box]:
    w, h = img.size
    x0, y0, x1, y1 = tile_boxes(w, h)[int(rng.integers(0, 9))]
    tw, th, s = x1 - x0, y1 - y0, rng.uniform(0.95, 1.05)
    cx = (x0 + x1) / 2 + rng.uniform(-0.06, 0.06) * tw
    cy = (y0 + y1) / 2 + rng.uniform(-0.06, 0.06) * th
    box = (max(0, cx - s * tw / 2), max(0, cy - s * th / 2), min(w, cx + s * tw / 2), min(h, cy + s * th / 2))
    tile = color_jitter(img.crop(tuple(round(v) for v in box)), rng, strength=0.2)
    return edits.jpeg(tile, int(rng.integers(40, 86))), box


def view_query(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, edits.Box]:
    w, h = img.size
    box = edits.random_box(w, h, rng, 0.6, 0.9)
    view = edits.scale(edits.rotated_crop(img, box, rng.uniform(-10, 10)), rng.uniform(0.5, 0.9))
    return edits.jpeg(color_jitter(view, rng, strength=0.2), int(rng.integers(40, 86))), box


def burst_query(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, edits.Box]:
    w, h = img.size
    f = rng.uniform(0.85, 0.95)
    bw, bh = round(f * w), round(f * h)
    x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
    box = (x0, y0, x0 + bw, y0 + bh)
    frame = edits.rotated_crop(img, box, rng.uniform(-2, 2))
    frame = ImageEnhance.Brightness(frame).enhance(rng.uniform(0.9, 1.1))
    return edits.jpeg(frame, int(rng.integers(60, 91))), box


QUERY_MAKERS = {
    "easy": edits.easy_edit, "hard": edits.hard_edit, "crops": edits.crop_edit,
    "tiles": tile_query, "views": view_query, "bursts": burst_query,
}


@dataclass
class EvalSet:
    """Gallery and queries (``Item``s; a query's ``kind`` is one of ``KINDS``) and ``relevance`` (Q, N) bool."""

    gallery: list[Item]
    queries: list[Item]
    relevance: np.ndarray


def build_eval_set(photos: list[tuple[Path, str]], seed: int) -> EvalSet:
    """The set for ``photos`` [(file, "scene" | "object")] and one seed (the same inputs give the same set).

    Returns:
        ``EvalSet``: per scene 16 gallery items and 6 queries, per object 1 gallery item and 3 queries.
    """
    rng = np.random.default_rng([seed, 22])
    gallery: list[Item] = []
    queries: list[Item] = []
    for path, kind in photos:
        img = decode_image(path).image
        name = f"{path.parent.name}/{path.name}"
        w, h = img.size
        gallery += gallery_items(name, img, rng) if kind == "scene" else [Item(img, name, "photo", (0, 0, w, h))]
        for qkind in KINDS:
            if qkind in SCENE_KINDS and kind != "scene":
                continue
            out, box = QUERY_MAKERS[qkind](img, rng)
            queries.append(Item(out, name, qkind, tuple(float(v) for v in box)))
    rel = np.array([[(is_relevant(q, g) if q.kind in SCENE_KINDS else contains(q, g)) for g in gallery]
                    for q in queries], dtype=bool)
    return EvalSet(gallery, queries, rel)
