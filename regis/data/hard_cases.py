"""A hard instance-retrieval set made from the bundled real photos: near-duplicate galleries, hard queries.

Gallery, per photo (16 items): the whole photo; its 3 x 3 tiles; 4 overlapping corner crops (2/3 of each side);
2 burst frames (the same scene re-framed: a 92 % crop at another offset, exposure +-8 %, back at full size).
So every query competes with near duplicates of its own photo, not just with 20 other scenes.

Query kinds (``QUERY_KINDS``), each an edited copy of a region of one photo:

- ``view``: 60-90 % of the area, rotated up to 10 degrees, colour +-20 %, downscaled to 50-90 %, JPEG q40-85;
- ``tile``: one 3 x 3 tile, shifted up to 6 % and rescaled 95-105 %, colour +-20 %, JPEG q40-85;
- ``partial``: 30-50 % of the area, colour +-10 %, JPEG q60-90;
- ``rotate``: the whole photo rotated 10-25 degrees, cut to the largest upright rectangle inside, JPEG q90;
- ``color``: the whole photo with a hue shift, saturation x0.3-1.7 and gamma 0.6-1.6, PNG;
- ``jpeg``: the whole photo downscaled to 20-35 % and saved as JPEG q5-15;
- ``color-jpeg``: colour shift and compression together, each stronger than ``color`` (where every readout
  scores 1.000): hue rotated 90-270 degrees, saturation x0-2, gamma 0.4-2.5, contrast x0.5-1.5, then downscaled
  to 30-50 % and saved as JPEG q15-35. Drawn from its own random stream (``seed``, 1), so adding it left the
  other kinds' queries unchanged;
- ``stereo``: the natural second view: scikit-image's right stereo image against the left one (1 query);
- ``end-crop`` (issue 29): on portrait and panoramic photos (``aspect_photos``: long side >= 1.25x the short
  one), a small crop (10-25 % of the area, aspect 3/4..4/3) flush with one end of the long side (the top or
  bottom of a portrait, the left or right end of a panorama: what a centre crop cuts off), colour +-10 %, JPEG
  q60-90;
- ``mid-crop``: the same crop centred on the middle of the long side (the comparison: an end crop should be
  found as often as a middle one).
  Both draw from their own random stream (``seed``, 2), as do the aspect photos' gallery bursts, so the other
  kinds' queries and gallery items are unchanged; the aspect photos add their 16 gallery items each.

Which gallery items are right answers follows from geometry: every item and query carries its box in the
source photo's pixels, and a gallery item of the same photo is relevant when it shows at least 75 % of the
query's region and that region fills at least 30 % of the item. A tile query is thus answered by its own tile
only (the photo shows it, but it fills 11 % of the photo); a view by the photo and its burst frames; a partial
view also by the corner crops that contain it.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from regis.data.augment import color_jitter, encode_jpeg
from regis.images.decode import decode_image

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1) in source-photo pixels

ASPECT_KINDS = ("end-crop", "mid-crop")  # queries of the aspect photos only
QUERY_KINDS = ("view", "tile", "partial", "rotate", "color", "jpeg", "color-jpeg", "stereo", *ASPECT_KINDS)
MIN_ELONGATION = 1.25  # an aspect photo's long side over its short side, at least
GALLERY_KINDS = ("photo", "tile", "overlap", "burst")
MIN_SHOWN = 0.75  # an item must show this fraction of the query's region ...
MIN_FILL = 0.30  # ... and the region must fill this fraction of the item
STEREO_PAIR = ("skimage-motorcycle_left.png", "motorcycle_right.png")


@dataclass(frozen=True)
class Item:
    """One gallery image or query: the image, its source photo and its box there.

    Attributes:
        image: RGB PIL image (queries: decoded from their JPEG / PNG bytes).
        photo: the source photo's file name.
        kind: one of ``GALLERY_KINDS`` or ``QUERY_KINDS``.
        box: (x0, y0, x1, y1), the region of the source photo it shows, pixels.
    """

    image: Image.Image = field(repr=False)
    photo: str
    kind: str
    box: Box


def _area(b: Box) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def _intersection(a: Box, b: Box) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def is_relevant(query: Item, item: Item) -> bool:
    """True when ``item`` (gallery) is a right answer to ``query``: same photo, shows >= ``MIN_SHOWN`` of the
    query's region, and the region fills >= ``MIN_FILL`` of the item."""
    if query.photo != item.photo:
        return False
    inter = _intersection(query.box, item.box)
    return inter >= MIN_SHOWN * _area(query.box) and inter >= MIN_FILL * _area(item.box)


def relevance_matrix(queries: list[Item], gallery: list[Item]) -> np.ndarray:
    """(Q, N) bool: ``is_relevant`` for every query and gallery item."""
    return np.array([[is_relevant(q, g) for g in gallery] for q in queries], dtype=bool).reshape(
        len(queries), len(gallery)
    )


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _decoded(data: bytes) -> Image.Image:
    return decode_image(data).image


def tile_boxes(w: int, h: int, n: int = 3) -> list[Box]:
    """The n x n tiles of a w x h image, row-major, integer pixel edges."""
    xs = [round(i * w / n) for i in range(n + 1)]
    ys = [round(i * h / n) for i in range(n + 1)]
    return [(xs[c], ys[r], xs[c + 1], ys[r + 1]) for r in range(n) for c in range(n)]


def gallery_items(name: str, img: Image.Image, rng: np.random.Generator) -> list[Item]:
    """The 16 gallery items of one photo (see the module docstring)."""
    w, h = img.size
    items = [Item(img, name, "photo", (0, 0, w, h))]
    for box in tile_boxes(w, h):
        items.append(Item(img.crop(box), name, "tile", box))
    cw, ch = round(2 * w / 3), round(2 * h / 3)
    for x0, y0 in ((0, 0), (w - cw, 0), (0, h - ch), (w - cw, h - ch)):
        box = (x0, y0, x0 + cw, y0 + ch)
        items.append(Item(img.crop(box), name, "overlap", box))
    for _ in range(2):
        bw, bh = round(0.92 * w), round(0.92 * h)
        x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        box = (x0, y0, x0 + bw, y0 + bh)
        frame = ImageEnhance.Brightness(img.crop(box)).enhance(rng.uniform(0.92, 1.08)).resize((w, h), Image.BICUBIC)
        items.append(Item(frame, name, "burst", box))
    return items


def _random_box(w: int, h: int, rng: np.random.Generator, low: float, high: float) -> Box:
    """A box keeping a random fraction in [low, high] of the area, aspect ratio within 3/4..4/3."""
    area = rng.uniform(low, high) * w * h
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw = int(min(w, max(16, round(math.sqrt(area * aspect)))))
    ch = int(min(h, max(16, round(math.sqrt(area / aspect)))))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return (x0, y0, x0 + cw, y0 + ch)


def _rotated_crop(img: Image.Image, box: Box, angle: float) -> Image.Image:
    """The box's content after rotating the photo by ``angle`` degrees about the box centre."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return img.rotate(angle, resample=Image.BICUBIC, center=(cx, cy)).crop(tuple(int(v) for v in box))


def _scale(img: Image.Image, f: float) -> Image.Image:
    w, h = img.size
    return img.resize((max(16, round(w * f)), max(16, round(h * f))), Image.BICUBIC)


def _inscribed(w: int, h: int, angle: float) -> Box:
    """The largest centred box of the image's aspect ratio inside the image rotated by ``angle`` degrees."""
    a = math.radians(abs(angle))
    f = 1.0 / (math.cos(a) + math.sin(a) * max(w / h, h / w))
    bw, bh = w * f, h * f
    return ((w - bw) / 2, (h - bh) / 2, (w + bw) / 2, (h + bh) / 2)


def _hue_shift(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    hsv = np.asarray(img.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int32) + int(rng.integers(25, 76))) % 256
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(0.3, 1.7), 0, 255)
    rgb = np.asarray(Image.fromarray(hsv, "HSV").convert("RGB"), dtype=np.float64) / 255.0
    return Image.fromarray((255.0 * rgb ** rng.uniform(0.6, 1.6)).round().astype(np.uint8))


def _strong_color_jpeg(img: Image.Image, rng: np.random.Generator) -> bytes:
    """The ``color-jpeg`` edit (module docstring): strong colour shift, then downscale and heavy JPEG."""
    hsv = np.asarray(img.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int32) + int(rng.integers(64, 193))) % 256
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(0.0, 2.0), 0, 255)
    rgb = np.asarray(Image.fromarray(hsv, "HSV").convert("RGB"), dtype=np.float64) / 255.0
    out = Image.fromarray((255.0 * rgb ** rng.uniform(0.4, 2.5)).round().astype(np.uint8))
    out = ImageEnhance.Contrast(out).enhance(rng.uniform(0.5, 1.5))
    return encode_jpeg(_scale(out, rng.uniform(0.3, 0.5)), int(rng.integers(15, 36)))


def query_items(name: str, img: Image.Image, rng: np.random.Generator, repeats: int,
                rng_extra: np.random.Generator | None = None) -> list[Item]:
    """``repeats`` queries of each synthetic kind (all but ``stereo``) for one photo; ``color-jpeg`` draws from
    ``rng_extra`` (its own stream, so the other kinds do not depend on it; None: skipped)."""
    w, h = img.size
    out = []
    tiles = tile_boxes(w, h)
    for _ in range(repeats):
        box = _random_box(w, h, rng, 0.6, 0.9)
        view = _scale(_rotated_crop(img, box, rng.uniform(-10, 10)), rng.uniform(0.5, 0.9))
        view = color_jitter(view, rng, strength=0.2)
        out.append(Item(_decoded(encode_jpeg(view, int(rng.integers(40, 86)))), name, "view", box))

        x0, y0, x1, y1 = tiles[int(rng.integers(0, len(tiles)))]
        tw, th = x1 - x0, y1 - y0
        s = rng.uniform(0.95, 1.05)
        cx = (x0 + x1) / 2 + rng.uniform(-0.06, 0.06) * tw
        cy = (y0 + y1) / 2 + rng.uniform(-0.06, 0.06) * th
        tb = (max(0, cx - s * tw / 2), max(0, cy - s * th / 2), min(w, cx + s * tw / 2), min(h, cy + s * th / 2))
        tile = color_jitter(img.crop(tuple(round(v) for v in tb)), rng, strength=0.2)
        out.append(Item(_decoded(encode_jpeg(tile, int(rng.integers(40, 86)))), name, "tile", tb))

        box = _random_box(w, h, rng, 0.3, 0.5)
        part = color_jitter(img.crop(box), rng, strength=0.1)
        out.append(Item(_decoded(encode_jpeg(part, int(rng.integers(60, 91)))), name, "partial", box))

        angle = float(rng.uniform(10, 25) * rng.choice([-1, 1]))
        inner = _inscribed(w, h, angle)
        rot = img.rotate(angle, resample=Image.BICUBIC).crop(tuple(round(v) for v in inner))
        out.append(Item(_decoded(encode_jpeg(rot, 90)), name, "rotate", inner))

        out.append(Item(_decoded(_png(_hue_shift(img, rng))), name, "color", (0, 0, w, h)))

        small = _scale(img, rng.uniform(0.2, 0.35))
        out.append(Item(_decoded(encode_jpeg(small, int(rng.integers(5, 16)))), name, "jpeg", (0, 0, w, h)))
    if rng_extra is not None:
        for _ in range(repeats):
            out.append(Item(_decoded(_strong_color_jpeg(img, rng_extra)), name, "color-jpeg", (0, 0, w, h)))
    return out


def _flush_box(w: int, h: int, rng: np.random.Generator, end: str) -> Box:
    """A box of 10-25 % of the area, aspect 3/4..4/3, at ``end`` of the long side: "start" (top / left), "stop"
    (bottom / right) or "middle" (centred on the long side); random across the short side."""
    area = rng.uniform(0.10, 0.25) * w * h
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw = int(min(w, max(16, round(math.sqrt(area * aspect)))))
    ch = int(min(h, max(16, round(math.sqrt(area / aspect)))))
    portrait = h > w
    long_side, box_long = (h, ch) if portrait else (w, cw)
    along = {"start": 0, "stop": long_side - box_long, "middle": (long_side - box_long) // 2}[end]
    across = int(rng.integers(0, (w - cw if portrait else h - ch) + 1))
    x0, y0 = (across, along) if portrait else (along, across)
    return (x0, y0, x0 + cw, y0 + ch)


def aspect_query_items(name: str, img: Image.Image, rng: np.random.Generator, repeats: int,
                       gallery: list[Item] | None = None, tries: int = 50) -> list[Item]:
    """``repeats`` ``end-crop`` and ``mid-crop`` queries of one portrait or panoramic photo (module docstring).

    Args:
        gallery: the photo's gallery items; when given, a box is drawn again (up to ``tries`` times) until some
            item answers it (``is_relevant``), so that every query has a right answer.

    Raises:
        ConfigError: the photo is not elongated enough (``MIN_ELONGATION``).
    """
    from regis.errors import ConfigError

    w, h = img.size
    if max(w, h) < MIN_ELONGATION * min(w, h):
        raise ConfigError(f"{name} is {w} x {h}: not a portrait or panoramic photo")
    out = []
    for _ in range(repeats):
        for kind, ends in (("end-crop", ("start", "stop")), ("mid-crop", ("middle",))):
            end = ends[int(rng.integers(0, len(ends)))]
            for _ in range(tries):
                box = _flush_box(w, h, rng, end)
                probe = Item(img, name, kind, box)
                if gallery is None or any(is_relevant(probe, g) for g in gallery):
                    break
            part = color_jitter(img.crop(box), rng, strength=0.1)
            out.append(Item(_decoded(encode_jpeg(part, int(rng.integers(60, 91)))), name, kind, box))
    return out


def is_aspect_photo(path: Path) -> bool:
    """Whether the image at ``path`` is a portrait or panoramic photo (``MIN_ELONGATION``), read from its header."""
    with Image.open(path) as im:
        w, h = im.size
    return max(w, h) >= MIN_ELONGATION * min(w, h)


@dataclass
class HardSet:
    """The gallery, the queries and their relevance (``relevance[q, g]``: gallery item g answers query q)."""

    gallery: list[Item]
    queries: list[Item]
    relevance: np.ndarray


def build_hard_set(photos: list[Path], repeats: int = 3, seed: int = 0, stereo_dir: Path | None = None,
                   aspect_photos: list[Path] | None = None) -> HardSet:
    """The hard set for these photo files (decoded to RGB).

    Args:
        photos: photo files (``regis.data.sample_photos.collect_sample_photos``); names are the file names.
        repeats: queries per (photo, synthetic kind).
        seed: seeds every random draw; the same inputs and seed give the same set.
        stereo_dir: a folder holding scikit-image's ``motorcycle_right.png``; when it and the left image are
            there, the right image becomes the one ``stereo`` query (box: the whole left photo).
        aspect_photos: portrait and panoramic photos (``is_aspect_photo``) that add their 16 gallery items each
            and ``repeats`` ``end-crop`` and ``mid-crop`` queries (their own random stream); names must differ
            from ``photos``'.

    Returns:
        ``HardSet`` with 16 gallery items per photo and ``7 * repeats`` queries per photo (+ 1 stereo query),
        then the aspect photos' 16 gallery items and ``2 * repeats`` queries each.

    Raises:
        ConfigError: an aspect photo that is not elongated, or one named like another photo.
    """
    rng = np.random.default_rng(seed)
    rng_extra = np.random.default_rng([seed, 1])
    gallery: list[Item] = []
    queries: list[Item] = []
    for path in photos:
        img = decode_image(path).image
        gallery += gallery_items(path.name, img, rng)
        queries += query_items(path.name, img, rng, repeats, rng_extra)
    left, right = STEREO_PAIR
    if stereo_dir is not None and (stereo_dir / right).is_file() and any(p.name == left for p in photos):
        img = decode_image(stereo_dir / right).image
        queries.append(Item(img, left, "stereo", (0, 0, img.width, img.height)))
    rng_aspect = np.random.default_rng([seed, 2])
    names = {p.name for p in photos}
    for path in aspect_photos or []:
        if path.name in names:
            from regis.errors import ConfigError

            raise ConfigError(f"aspect photo {path.name} is named like another photo of the set")
        names.add(path.name)
        img = decode_image(path).image
        items = gallery_items(path.name, img, rng_aspect)
        gallery += items
        queries += aspect_query_items(path.name, img, rng_aspect, repeats, items)
    return HardSet(gallery, queries, relevance_matrix(queries, gallery))


def absent_kinds(queries: list[Item]) -> dict[str, str]:
    """Each of ``QUERY_KINDS`` without a query in ``queries`` (in that order), with why: {kind: reason}.

    ``stereo`` needs its source pair (``STEREO_PAIR``: the left photo among the photos, scikit-image's right one
    in ``build_hard_set``'s ``stereo_dir``); ``ASPECT_KINDS`` need portrait or panoramic photos
    (``aspect_photos``); the other kinds come from every photo, so they lack queries only when there are no
    photos or ``repeats`` is 0.
    """
    present = {q.kind for q in queries}
    left, right = STEREO_PAIR
    reasons = {"stereo": f"its source photos are missing (needs {left} among the photos and scikit-image's {right} "
                         "in stereo_dir)"}
    reasons |= {k: "its source photos are missing (no portrait or panoramic photos given: aspect_photos)"
                for k in ASPECT_KINDS}
    return {k: reasons.get(k, "no queries of this kind (no photos, or repeats = 0)")
            for k in QUERY_KINDS if k not in present}


def skimage_data_dir() -> Path | None:
    """scikit-image's bundled data folder, or None when scikit-image is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("skimage.data")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent
