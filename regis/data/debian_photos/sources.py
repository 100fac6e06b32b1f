"""Where the real photographs sit inside the Debian packages of the training corpus (issue 22), and which files
are drawings or renders to leave out.

Each package gets a finder: (the package's extracted tree ``root``) -> ``Candidate`` per photo file. The rules
were written by looking at every image of these package versions (bookworm): gcompris-qt-data 3.1-2,
mate-backgrounds 1.26.0-1, plasma-workspace-wallpapers 5.27.5-2, tuxpaint-data 0.9.28, tuxpaint-stamps-default
2022.06.04, palapeli-data 22.12.3, darknet 0.0.0+git20180914. Another version may add files: they are taken
when they match the same rules.

- ``gcompris-qt-data``: the photos of the explore_* activities (scenes: monuments, animals, musicians) and of
  ``categorization`` (small objects: tools, fish, monuments...), ``.webp`` files inside Qt ``.rcc`` bundles; the
  ``.svg`` files beside them are drawings;
- ``mate-backgrounds``: ``nature/`` (the other folders are abstract renders);
- ``plasma-workspace-wallpapers``: the wallpapers in ``PLASMA_PHOTOS`` (the others are renders and drawings),
  the largest image of each;
- ``tuxpaint-data``: ``templates/`` (all photographs);
- ``tuxpaint-stamps-default``: the PNG stamps that are photo cut-outs (small objects): not in a drawn category
  (``STAMP_DRAWN_DIRS``), not in ``STAMP_DRAWINGS``, at least ``STAMP_MIN_PIXELS`` opaque pixels, and fewer than
  ``STAMP_MAX_FLAT`` of adjacent opaque pixel pairs of identical colour (a drawing has flat regions, a photo has
  sensor noise; ``flat_fraction``). Composited on white;
- ``palapeli-data``: ``collection/`` (``backgrounds/`` are textures);
- ``darknet``: ``data/*.jpg`` but ``scream.jpg`` (a painting).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGES = (
    "gcompris-qt-data", "mate-backgrounds", "plasma-workspace-wallpapers", "tuxpaint-data",
    "tuxpaint-stamps-default", "palapeli-data", "darknet",
)
GCOMPRIS_BUNDLES = {
    "explore_monuments": "scene", "explore_farm_animals": "scene", "explore_world_animals": "scene",
    "explore_world_music": "scene", "categorization": "object",
}
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
PLASMA_PHOTOS = (
    "BytheWater", "ColdRipple", "ColorfulCups", "DarkestHour", "EveningGlow", "FallenLeaf", "Grey",
    "OneStandsOut", "Path", "Volna", "summer_1am",
)
STAMP_DRAWN_DIRS = (
    "symbols/alphabets", "symbols/math", "symbols/chess", "symbols/shapes", "symbols/faces", "cartoon",
    "town/roadsigns", "town/flags",
)
STAMP_DRAWINGS = (
    "bunny-egg.png", "chick-in-egg.png", "chick.png", "0_sun.png", "party-hat.png", "chineseJunk.png",
    "soccer.png", "butterfly.png", "mug.png",
)
STAMP_MIN_PIXELS = 64 * 64
STAMP_MAX_FLAT = 0.25
DARKNET_NOT_PHOTOS = ("scream.jpg",)


@dataclass(frozen=True)
class Candidate:
    """One photo file found in a package.

    Attributes:
        package: the Debian package name.
        source: where it is: the path inside the package (``usr/share/...``), or for a file inside a Qt resource
            bundle ``<bundle path>:<resource path>``.
        licence_key: the path the package's DEP-5 copyright file names it by (its path in the upstream source).
        kind: "scene" (a photograph of a scene) or "object" (a small object photo or cut-out).
        read: returns the file's bytes.
        name: the file name to write it under (unique within the package).
    """

    package: str
    source: str
    licence_key: str
    kind: str
    read: Callable[[], bytes]
    name: str


def flat_fraction(img: Image.Image) -> tuple[float, int]:
    """(share of horizontally adjacent opaque pixel pairs with identical RGB, number of opaque pixels) of an image
    (alpha > 200 is opaque; an image without alpha is all opaque)."""
    a = np.asarray(img.convert("RGBA"))
    mask = a[..., 3] > 200
    pairs = mask[:, 1:] & mask[:, :-1]
    same = (a[:, 1:, :3] == a[:, :-1, :3]).all(-1) & pairs
    return float(same.sum() / max(1, pairs.sum())), int(mask.sum())


def _file(package: str, root: Path, path: Path, key: str, kind: str, name: str | None = None) -> Candidate:
    return Candidate(package, str(path.relative_to(root)), key, kind, path.read_bytes, name or path.name)


def _gcompris(root: Path) -> Iterator[Candidate]:
    from regis.data.qt_rcc import RccBundle

    rcc_dir = root / "usr/share/gcompris-qt/rcc"
    for bundle_name, kind in GCOMPRIS_BUNDLES.items():
        path = rcc_dir / f"{bundle_name}.rcc"
        if not path.is_file():
            continue
        bundle = RccBundle.open(path)
        for entry in bundle.entries():
            if not entry.path.lower().endswith(PHOTO_SUFFIXES) or "/resource/" not in entry.path:
                continue
            key = entry.path.removeprefix("gcompris/")
            parts = entry.path.split("/")
            name = f"{bundle_name}-{parts[-2]}-{parts[-1]}"
            yield Candidate("gcompris-qt-data", f"{path.relative_to(root)}:{entry.path}", key, kind,
                            lambda b=bundle, e=entry: b.read(e), name)


def _mate(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/backgrounds/mate"
    for path in sorted((base / "nature").glob("*")):
        if path.suffix.lower() in PHOTO_SUFFIXES:
            yield _file("mate-backgrounds", root, path, str(path.relative_to(base)), "scene")


def _plasma(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/wallpapers"
    for name in PLASMA_PHOTOS:
        images = [p for p in (base / name / "contents/images").glob("*") if p.suffix.lower() in PHOTO_SUFFIXES]
        if images:
            best = max(images, key=lambda p: (p.stat().st_size, p.name))
            yield _file("plasma-workspace-wallpapers", root, best, str(best.relative_to(base)), "scene",
                        f"{name}{best.suffix}")


def _tuxpaint_templates(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/tuxpaint"
    for path in sorted((base / "templates").glob("*")):
        if path.suffix.lower() in PHOTO_SUFFIXES:
            yield _file("tuxpaint-data", root, path, str(path.relative_to(base)), "scene")


def is_photo_stamp(rel: str, img: Image.Image) -> bool:
    """True when a tuxpaint stamp (``rel``: its path under ``stamps/``) is a photo cut-out (module docstring)."""
    if any(d in rel for d in STAMP_DRAWN_DIRS) or Path(rel).name in STAMP_DRAWINGS:
        return False
    flat, opaque = flat_fraction(img)
    return opaque >= STAMP_MIN_PIXELS and flat < STAMP_MAX_FLAT


def _stamps(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/tuxpaint/stamps"
    for path in sorted(base.rglob("*.png")):
        rel = str(path.relative_to(base))
        if "/thumbs/" in f"/{rel}":
            continue
        with Image.open(path) as img:
            if not is_photo_stamp(rel, img):
                continue
        name = rel.replace("/", "-")
        yield _file("tuxpaint-stamps-default", root, path, f"stamps/{rel}", "object", name)


def _palapeli(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/palapeli"
    for path in sorted((base / "collection").glob("*")):
        if path.suffix.lower() in PHOTO_SUFFIXES:
            yield _file("palapeli-data", root, path, f"puzzles/{path.name}", "scene")


def _darknet(root: Path) -> Iterator[Candidate]:
    base = root / "usr/share/darknet"
    for path in sorted((base / "data").glob("*.jpg")):
        if path.name not in DARKNET_NOT_PHOTOS:
            yield _file("darknet", root, path, f"data/{path.name}", "scene")


FINDERS: dict[str, Callable[[Path], Iterator[Candidate]]] = {
    "gcompris-qt-data": _gcompris, "mate-backgrounds": _mate, "plasma-workspace-wallpapers": _plasma,
    "tuxpaint-data": _tuxpaint_templates, "tuxpaint-stamps-default": _stamps, "palapeli-data": _palapeli,
    "darknet": _darknet,
}


def find_photos(package: str, root: Path) -> list[Candidate]:
    """Every photo ``Candidate`` of one package's extracted tree (``dpkg -x`` output), in a fixed order."""
    return list(FINDERS[package](Path(root)))


def licence_line(copyright_text: str, key: str) -> str:
    """The ``License:`` line of the DEP-5 (machine-readable copyright) stanza whose ``Files:`` patterns match
    ``key`` (the last matching stanza wins, as DEP-5 says; ``*`` matches across "/"); the first licence line
    of the file when no stanza matches or the file is not DEP-5; "" when there is none."""
    best, first = "", ""
    for stanza in copyright_text.split("\n\n"):
        lines = stanza.strip().splitlines()
        files: list[str] = []
        licence = ""
        reading_files = False
        for line in lines:
            if line.startswith("Files:"):
                files = line[len("Files:"):].split()
                reading_files = True
            elif line.startswith(" ") and reading_files:
                files += line.split()
            else:
                reading_files = False
                if line.startswith("License:") and not licence:
                    licence = line.strip()
        if licence and not first:
            first = licence
        if licence and any(fnmatch.fnmatchcase(key, p.removeprefix("./")) for p in files):
            best = licence
    return best or first
