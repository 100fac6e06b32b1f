"""A labelled near-duplicate set made from real photos: exact copies, edited copies, crops, other shots.

Every source photo becomes one *family* of image files, of one of two kinds (alternating over the photos,
sorted by name, so both kinds see every sort of scene):

- a **copy family**: the photo (``orig``, JPEG q95, longest side at most ``max_side``), a byte-identical copy
  (``exact-bytes``), the same pixels saved as PNG (``exact-pixels``), ``edits`` edited copies and ``crops``
  crops. An edited copy is the photo after 1 to 3 of: downscaling to 35-90 %, a colour change (brightness,
  contrast, saturation +-30 %, grey, or gamma 0.7-1.4), a small crop (each side cut by 0-2.5 %: at least 90 %
  of the area kept), a rotation of 1-3 degrees (corners filled), overlaid text (4-9 % of the height), a border
  (2-5 % of the side); saved as JPEG q25-90 (or PNG). A crop keeps 10-70 % of the area (aspect ratio 3:5 to
  5:3; one crop drawn from each third of that range), rescaled by 0.6-1.2 and saved as JPEG q70-95.
- a **scene family**: ``shots`` other shots of the scene the photo shows, as a moved camera takes them: each a
  window of 55-75 % of the photo's area at another place (two shots overlap by an IoU of 0.3-0.7 and neither
  holds 80 % of the other), seen through a small perspective change (corners moved by up to 4 %), with its own
  exposure (+-15 %) and a part of the scene moved (a region of 3-6 % of the area shifted by 4-8 % of the
  width: a subject that moved between frames), saved at one camera resolution as JPEG q85-95; plus one edited
  copy of the first shot.

Pairs are labelled from how the files were made (``pair_label``): ``exact`` (same bytes or same pixels),
``edited`` (two whole-frame versions of the same photo, or of the same shot), ``crop`` (one shows a part of the
other: >= 90 % of its region lies inside the other's and it covers at most 85 % of the other's area; the
container is named), ``scene`` (two shots of one scene, or an edited copy of one and another shot),
``overlap`` (two crops of one photo that share a part without one containing the other), ``unrelated``
(different photos, or disjoint crops). ``ambiguous`` pairs (a crop that sticks out of an edited copy's
narrower frame) are left out of every figure.

The right image of scikit-image's stereo pair, when given, joins the family of the left one as a real other
view (``view``): ``scene`` with the family's whole-frame images, ``ambiguous`` with its crops.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFont, ImageOps

from regis.images.decode import decode_image

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1) in the source photo's pixels

RELATIONS = ("exact", "edited", "crop", "scene", "overlap", "unrelated", "ambiguous")
WHOLE_KINDS = ("orig", "exact-bytes", "exact-pixels", "edit")
CROP_CONTAINED = 0.90  # a crop: this much of its region inside the other's ...
CROP_MAX_RATIO = 0.85  # ... and at most this fraction of the other's area
WORDS = ("holiday", "2019", "copyright", "Best day ever", "family", "DSC_0412", "summer trip", "#nofilter",
         "sample", "wow", "Grandma's 80th", "draft", "do not share", "beach", "IMG_2207")


@dataclass(frozen=True)
class Item:
    """One image file of the set.

    Attributes:
        file: file name in the set's folder.
        family: the source photo's name (pairs of different families are unrelated).
        kind: "orig", "exact-bytes", "exact-pixels", "edit", "crop", "shot", "shot-edit" or "view".
        box: the region of the source photo it shows, pixels (shots: their window; "view": None).
        shot: scene families: which shot (0, 1, ...) an item shows; None elsewhere.
        edits: what was done to it, in words (for reading the set and the errors).
    """

    file: str
    family: str
    kind: str
    box: Box | None
    shot: int | None = None
    edits: str = ""


def _area(b: Box) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def _inter(a: Box, b: Box) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _containment(small: Item, big: Item) -> str | None:
    """"crop" when ``small`` lies inside ``big`` (``CROP_CONTAINED``) and covers at most ``CROP_MAX_RATIO`` of it;
    "ambiguous" when it is mostly inside but not enough; None otherwise."""
    inter = _inter(small.box, big.box)
    if _area(small.box) > CROP_MAX_RATIO * _area(big.box):
        return None
    if inter >= CROP_CONTAINED * _area(small.box):
        return "crop"
    return "ambiguous" if inter >= 0.5 * _area(small.box) else None


def pair_label(a: Item, b: Item) -> tuple[str, str | None]:
    """The relation of two items and, for a crop, the file of the image that contains the other.

    Returns:
        (relation, container): relation is one of ``RELATIONS``; container is ``a.file`` or ``b.file`` for
        "crop", else None.
    """
    if a.family != b.family:
        return "unrelated", None
    if "view" in (a.kind, b.kind):
        other = b if a.kind == "view" else a
        return ("scene" if other.kind in WHOLE_KINDS else "ambiguous"), None
    if a.shot is not None or b.shot is not None:  # a scene family
        return ("edited" if a.shot == b.shot else "scene"), None
    exact = ("orig", "exact-bytes", "exact-pixels")
    if a.kind in exact and b.kind in exact:
        return "exact", None
    if a.kind in WHOLE_KINDS and b.kind in WHOLE_KINDS:
        return "edited", None
    for small, big in ((a, b), (b, a)):
        found = _containment(small, big)
        if found == "crop":
            return "crop", big.file
        if found == "ambiguous":
            return "ambiguous", None
    if a.kind == "crop" and b.kind == "crop":
        return ("overlap" if _inter(a.box, b.box) > 0 else "unrelated"), None
    return "ambiguous", None  # a crop and a whole frame it does not fit in (a narrow edited copy)


# ------------------------------------------------------------------ edits
def _jpeg(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=int(quality))
    return buf.getvalue()


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _scaled(img: Image.Image, f: float, min_side: int = 96) -> Image.Image:
    w, h = img.size
    f = max(f, min_side / min(w, h))
    return img.resize((max(1, round(w * f)), max(1, round(h * f))), Image.BICUBIC)


def _colour(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, str]:
    pick = rng.integers(0, 3)
    if pick == 0:
        for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
            img = enhancer(img).enhance(rng.uniform(0.7, 1.3))
        return img, "colour +-30 %"
    if pick == 1:
        return ImageOps.grayscale(img).convert("RGB"), "grey"
    gamma = rng.uniform(0.7, 1.4)
    lut = [round(255 * (i / 255) ** gamma) for i in range(256)] * 3
    return img.point(lut), f"gamma {gamma:.2f}"


def _text(img: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, str]:
    w, h = img.size
    size = max(10, round(h * rng.uniform(0.04, 0.09)))
    font = ImageFont.load_default(size=size)
    words = str(rng.choice(WORDS))
    img = img.copy()
    draw = ImageDraw.Draw(img)
    x0, y0, x1, y1 = draw.textbbox((0, 0), words, font=font)
    x = rng.uniform(0.02, 0.98) * max(1, w - (x1 - x0))
    y = rng.uniform(0.02, 0.98) * max(1, h - (y1 - y0))
    fill, stroke = ((255, 255, 255), (0, 0, 0)) if rng.random() < 0.6 else ((0, 0, 0), (255, 255, 255))
    draw.text((x, y), words, font=font, fill=fill, stroke_width=max(1, size // 12), stroke_fill=stroke)
    return img, f"text {words!r}"


def edited_copy(img: Image.Image, rng: np.random.Generator) -> tuple[bytes, Box, str]:
    """One edited copy of ``img`` (module docstring): its bytes, the region of ``img`` it shows, the edits."""
    w, h = img.size
    box: Box = (0.0, 0.0, float(w), float(h))
    ops = list(rng.choice(["resize", "colour", "crop", "rotate", "text", "border"], size=int(rng.integers(1, 4)),
                          replace=False))
    done = []
    if "crop" in ops:
        cut = rng.uniform(0, 0.025, size=4)
        box = (cut[0] * w, cut[1] * h, w - cut[2] * w, h - cut[3] * h)
        img = img.crop(tuple(round(v) for v in box))
        done.append("small crop")
    if "rotate" in ops:
        angle = float(rng.uniform(1, 3) * rng.choice([-1, 1]))
        img = img.rotate(angle, resample=Image.BICUBIC, fillcolor=(0, 0, 0))
        done.append(f"rotate {angle:.1f} deg")
    if "colour" in ops:
        img, what = _colour(img, rng)
        done.append(what)
    if "text" in ops:
        img, what = _text(img, rng)
        done.append(what)
    if "border" in ops:
        pad = max(2, round(min(img.size) * rng.uniform(0.02, 0.05)))
        img = ImageOps.expand(img, border=pad, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        done.append("border")
    if "resize" in ops:
        f = rng.uniform(0.35, 0.9)
        img = _scaled(img, f)
        done.append(f"resize {f:.2f}")
    if rng.random() < 0.2:
        return _png(img), box, ", ".join(done + ["png"])
    q = int(rng.integers(25, 91))
    return _jpeg(img, q), box, ", ".join(done + [f"jpeg q{q}"])


def crop_of(img: Image.Image, rng: np.random.Generator, low: float, high: float) -> tuple[bytes, Box, str]:
    """A crop of ``img`` keeping a fraction in [low, high] of its area (aspect 3:5 to 5:3), rescaled by 0.6-1.2,
    JPEG q70-95: its bytes, its box, the edits."""
    w, h = img.size
    frac = rng.uniform(low, high)
    for _ in range(100):
        aspect = math.exp(rng.uniform(math.log(3 / 5), math.log(5 / 3)))
        cw, ch = math.sqrt(frac * w * h * aspect), math.sqrt(frac * w * h / aspect)
        if cw <= w and ch <= h:
            break
    cw, ch = min(w, round(cw)), min(h, round(ch))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    box: Box = (float(x0), float(y0), float(x0 + cw), float(y0 + ch))
    f = rng.uniform(0.6, 1.2)
    q = int(rng.integers(70, 96))
    out = _scaled(img.crop((x0, y0, x0 + cw, y0 + ch)), f, min_side=64)
    return _jpeg(out, q), box, f"crop {_area(box) / (w * h):.2f} of the area, scale {f:.2f}, jpeg q{q}"


def _shot_windows(w: int, h: int, n: int, rng: np.random.Generator) -> list[Box]:
    """``n`` camera windows over a w x h scene: 55-75 % of its area each, the scene's aspect ratio, pairwise IoU
    0.3-0.7 and none holding 80 % of another."""
    for _ in range(2000):
        boxes = []
        for _ in range(n):
            s = math.sqrt(rng.uniform(0.55, 0.75))
            bw, bh = s * w, s * h
            x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            boxes.append((x0, y0, x0 + bw, y0 + bh))
        ok = True
        for i in range(n):
            for j in range(i + 1, n):
                inter = _inter(boxes[i], boxes[j])
                iou = inter / (_area(boxes[i]) + _area(boxes[j]) - inter)
                contained = inter >= 0.8 * min(_area(boxes[i]), _area(boxes[j]))
                ok &= 0.3 <= iou <= 0.7 and not contained
        if ok:
            return boxes
    raise ValueError(f"no {n} camera windows found for a {w} x {h} photo")


def shot_of(img: Image.Image, box: Box, out_size: tuple[int, int], rng: np.random.Generator) -> tuple[bytes, str]:
    """One shot of the scene ``img`` through window ``box`` (module docstring): its bytes and what was done."""
    x0, y0, x1, y1 = box
    bw, bh = x1 - x0, y1 - y0
    j = rng.uniform(-0.04, 0.04, size=8) * np.array([bw, bh] * 4)
    quad = (x0 + j[0], y0 + j[1], x0 + j[2], y1 + j[3], x1 + j[4], y1 + j[5], x1 + j[6], y0 + j[7])
    shot = img.transform(out_size, Image.QUAD, quad, resample=Image.BICUBIC)
    # a subject that moved: a region of 3-6 % of the frame shifted sideways by 4-8 % of the width
    sw, sh = shot.size
    frac = rng.uniform(0.03, 0.06)
    rw, rh = round(math.sqrt(frac) * sw), round(math.sqrt(frac) * sh)
    rx, ry = int(rng.integers(0, sw - rw + 1)), int(rng.integers(0, sh - rh + 1))
    dx = round(rng.uniform(0.04, 0.08) * sw * rng.choice([-1, 1]))
    nx = int(np.clip(rx + dx, 0, sw - rw))
    shot = shot.copy()
    shot.paste(shot.crop((rx, ry, rx + rw, ry + rh)), (nx, ry))
    gain = rng.uniform(0.85, 1.15)
    shot = ImageEnhance.Brightness(shot).enhance(gain)
    q = int(rng.integers(85, 96))
    return _jpeg(shot, q), f"shot: perspective, subject moved {nx - rx:+d} px, exposure x{gain:.2f}, jpeg q{q}"


# ------------------------------------------------------------------ the set
def _load(path: Path, max_side: int) -> Image.Image:
    img = decode_image(path).image
    f = max_side / max(img.size)
    return img.resize((round(img.width * f), round(img.height * f)), Image.BICUBIC) if f < 1 else img


def _family_name(path: Path) -> str:
    return hashlib.sha256(path.name.encode()).hexdigest()[:10]


def copy_family(path: Path, out: Path, rng: np.random.Generator, edits: int, crops: int,
                max_side: int, exact: bool = True) -> list[Item]:
    """Write the copy family of one photo into ``out`` (module docstring; ``exact`` False: without the two exact
    copies); returns its items."""
    img = _load(path, max_side)
    fam = _family_name(path)
    w, h = img.size
    whole: Box = (0.0, 0.0, float(w), float(h))
    orig = _jpeg(img, 95)
    items = []

    def write(n: int, data: bytes, ext: str, kind: str, box: Box | None, what: str) -> None:
        name = f"{fam}-{n:02d}.{ext}"
        (out / name).write_bytes(data)
        items.append(Item(name, path.name, kind, box, None, what))

    write(0, orig, "jpg", "orig", whole, "the photo, jpeg q95")
    if exact:
        write(1, orig, "jpg", "exact-bytes", whole, "the same bytes")
        write(2, _png(decode_image(orig).image), "png", "exact-pixels", whole, "the same pixels, png")
    n = 3
    for _ in range(edits):
        data, box, what = edited_copy(img, rng)
        write(n, data, "png" if what.endswith("png") else "jpg", "edit", box, what)
        n += 1
    for i in range(crops):
        low = 0.10 + 0.60 * i / crops
        data, box, what = crop_of(img, rng, low, low + 0.60 / crops)
        write(n, data, "jpg", "crop", box, what)
        n += 1
    return items


def scene_family(path: Path, out: Path, rng: np.random.Generator, shots: int, max_side: int) -> list[Item]:
    """Write the scene family of one photo into ``out`` (module docstring); returns its items."""
    img = _load(path, max_side)
    fam = _family_name(path)
    w, h = img.size
    windows = _shot_windows(w, h, shots, rng)
    f = min(1.0, 800 / max(w, h)) * 0.87  # one camera resolution for every shot of the scene
    size = (round(w * f), round(h * f))
    items = []
    first = None
    for i, box in enumerate(windows):
        data, what = shot_of(img, box, size, rng)
        name = f"{fam}-s{i}.jpg"
        (out / name).write_bytes(data)
        items.append(Item(name, path.name, "shot", box, i, what))
        first = first or data
    data, _, what = edited_copy(decode_image(first).image, rng)
    name = f"{fam}-s0e.{'png' if what.endswith('png') else 'jpg'}"
    (out / name).write_bytes(data)
    items.append(Item(name, path.name, "shot-edit", windows[0], 0, what))
    return items


@dataclass
class LabelledSet:
    """The files of a labelled set, their items and how to look them up.

    Attributes:
        folder: where the files are.
        items: every file's ``Item``.
    """

    folder: Path
    items: list[Item]

    def by_file(self) -> dict[str, Item]:
        """File name -> item."""
        return {it.file: it for it in self.items}

    def save(self) -> Path:
        """Write ``labels.json`` beside the files (the items); returns its path."""
        path = self.folder / "labels.json"
        path.write_text(json.dumps({"items": [asdict(it) for it in self.items]}, indent=1))
        return path

    @classmethod
    def load(cls, folder: Path | str) -> LabelledSet:
        """Read a set written by ``build_labelled_set`` (its ``labels.json``)."""
        folder = Path(folder)
        raw = json.loads((folder / "labels.json").read_text())
        items = [Item(**{**d, "box": tuple(d["box"]) if d["box"] is not None else None}) for d in raw["items"]]
        return cls(folder, items)


def build_labelled_set(photos: list[Path], out: Path | str, seed: int = 0, edits: int = 4, crops: int = 3,
                       shots: int = 3, max_side: int = 1024, stereo_right: Path | None = None,
                       roles: dict[str, str] | None = None) -> LabelledSet:
    """Write the labelled set of ``photos`` into ``out`` (created): alternately a copy family and a scene family
    per photo, in name order (or as ``roles`` says); with ``stereo_right`` (scikit-image's ``motorcycle_right.png``)
    also the real other view of the left image when that photo is among ``photos``.

    Args:
        photos: real photo files; the family of each is named after its file name (names must differ).
        out: output folder; files are named ``<family hash>-<n>.<ext>`` (nothing in a name gives its label).
        seed: seeds every random draw (one stream per photo: adding photos leaves the others' files unchanged).
        edits, crops, shots: per family.
        max_side: photos are first downscaled to this longest side, pixels.
        roles: photo file name -> "copy", "scene" or "single" (the photo alone, JPEG q95: an unrelated image
            among the others); photos not named alternate copy / scene.

    Returns:
        The ``LabelledSet`` (also saved as ``out/labels.json``).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items: list[Item] = []
    roles = roles or {}
    for n, path in enumerate(sorted(photos, key=lambda p: p.name)):
        rng = np.random.default_rng([seed, int(_family_name(path), 16)])
        role = roles.get(path.name, "copy" if n % 2 == 0 else "scene")
        if role == "copy":
            items += copy_family(path, out, rng, edits, crops, max_side)
        elif role == "scene":
            items += scene_family(path, out, rng, shots, max_side)
        elif role == "single":
            items += copy_family(path, out, rng, 0, 0, max_side, exact=False)
        else:
            raise ValueError(f"unknown role {role!r} for {path.name}: copy, scene or single")
    left = next((p for p in photos if p.name == "skimage-motorcycle_left.png"), None)
    if stereo_right is not None and stereo_right.is_file() and left is not None:
        img = _load(stereo_right, max_side)
        name = f"{_family_name(left)}-view.jpg"
        (out / name).write_bytes(_jpeg(img, 95))
        items.append(Item(name, left.name, "view", None, None, "the right image of the stereo pair"))
    result = LabelledSet(out, items)
    result.save()
    return result


def labelled_pairs(items: list[Item]) -> dict[tuple[str, str], tuple[str, str | None]]:
    """Every pair of items of the same family (file a < file b) -> ``pair_label``; pairs of different families
    are "unrelated" and not listed."""
    by_family: dict[str, list[Item]] = {}
    for it in items:
        by_family.setdefault(it.family, []).append(it)
    out = {}
    for members in by_family.values():
        members = sorted(members, key=lambda it: it.file)
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                out[(a.file, b.file)] = pair_label(a, b)
    return out
